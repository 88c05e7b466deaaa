#include <gtest/gtest.h>

#include <algorithm>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/token_file.h"
#include "io/hf_checkpoint.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/init.h"

namespace st {
namespace {
namespace fs = std::filesystem;

fs::path temp(const std::string& name) {
  fs::path p = fs::path(::testing::TempDir()) / ("st_hf_" + name);
  fs::remove_all(p);
  return p;
}

ModelConfig small(bool tied) {
  ModelConfig c = model_preset("tiny");
  c.source = "small";
  c.num_layers = 2;
  c.hidden_size = 32;
  c.intermediate_size = 40;
  c.tie_word_embeddings = tied;
  return c;
}

std::vector<std::vector<float>> init_units(const ParamLayout& layout, uint64_t seed) {
  std::vector<std::vector<float>> units;
  for (const Unit& u : layout.units()) {
    std::vector<float> v(u.numel);
    init_unit_values(u, seed, 0.02, 0, u.numel, v.data());
    units.push_back(std::move(v));
  }
  return units;
}

// Replacing an export replaces the directory: a sharded model overwritten by a
// one-file model leaves no old shard or index behind, and the result loads.
TEST(HfCheckpoint, OverwritingAnExportLeavesNoStaleShards) {
  const ParamLayout layout(small(false));
  const auto units = init_units(layout, 4), other = init_units(layout, 5);
  const fs::path dir = temp("replace");
  ExportOptions o;
  o.dtype = DType::F32;
  o.max_shard_bytes = 20000;  // several shards and an index
  export_hf_model(dir, layout, units, o);
  ASSERT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  o.max_shard_bytes = 5ull << 30;
  EXPECT_THROW(export_hf_model(dir, layout, other, o), Error);  // not empty, no overwrite
  o.overwrite = true;
  export_hf_model(dir, layout, other, o);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "model.safetensors"}));
  EXPECT_EQ(load_hf_weights(dir.string(), layout), other);
  for (const auto& e : fs::directory_iterator(dir.parent_path()))
    EXPECT_EQ(e.path().filename().string().find("replace.old-"), std::string::npos) << e.path();
  // A directory that cannot be made is refused before anything is written.
  std::ofstream(dir.parent_path() / "a-file") << "x";
  EXPECT_THROW(check_export_dir((dir.parent_path() / "a-file" / "model").string(), false), Error);
}

TEST(HfCheckpoint, ExportThenLoadIsExactInF32AndRoundedInBf16) {
  for (bool tied : {true, false}) {
    const ParamLayout layout(small(tied));
    const auto units = init_units(layout, 4);
    const fs::path dir = temp(tied ? "f32_tied" : "f32_untied");
    ExportOptions o;
    o.dtype = DType::F32;
    export_hf_model(dir, layout, units, o);
    EXPECT_TRUE(fs::exists(dir / "config.json"));
    const ModelConfig back = load_hf_config(dir.string());
    EXPECT_EQ(back.tie_word_embeddings, tied);
    EXPECT_EQ(back.num_params(), layout.config().num_params());
    EXPECT_EQ(load_hf_weights(dir.string(), layout), units);
    const SafetensorsSet set = SafetensorsSet::open(dir.string());
    EXPECT_EQ(set.find("lm_head.weight") != nullptr, !tied);

    const fs::path bdir = temp(tied ? "bf16_tied" : "bf16_untied");
    o.dtype = DType::BF16;
    export_hf_model(bdir, layout, units, o);
    const auto b = load_hf_weights(bdir.string(), layout);
    for (size_t u = 0; u < units.size(); ++u)
      for (size_t i = 0; i < units[u].size(); ++i)
        ASSERT_EQ(b[u][i], bf16_to_f32(f32_to_bf16(units[u][i])));
  }
}

TEST(HfCheckpoint, ShardedExportLoadsBack) {
  const ParamLayout layout(small(false));
  const auto units = init_units(layout, 5);
  const fs::path dir = temp("sharded");
  ExportOptions o;
  o.dtype = DType::F32;
  o.max_shard_bytes = 40000;
  export_hf_model(dir, layout, units, o);
  EXPECT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  EXPECT_EQ(load_hf_weights(dir.string(), layout), units);
}

TEST(HfCheckpoint, MismatchesAreListedTogether) {
  // A checkpoint of a 2-layer model read as a 3-layer model with a different
  // hidden size: missing layer-2 tensors and wrong shapes in one message.
  const ParamLayout two(small(true));
  const fs::path dir = temp("mismatch");
  export_hf_model(dir, two, init_units(two, 1), {});
  ModelConfig three = small(true);
  three.num_layers = 3;
  three.intermediate_size = 48;
  try {
    load_hf_weights(dir.string(), ParamLayout(three));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("missing tensors"), std::string::npos) << m;
    EXPECT_NE(m.find("model.layers.2.mlp.down_proj.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("wrong shapes"), std::string::npos) << m;
    EXPECT_NE(m.find("model.layers.0.mlp.gate_proj.weight: expected [48, 32], found [40, 32]"), std::string::npos) << m;
  }
  // Untied checkpoint read as tied: lm_head.weight is unexpected.
  const ParamLayout untied(small(false));
  const fs::path udir = temp("untied_as_tied");
  export_hf_model(udir, untied, init_units(untied, 2), {});
  try {
    load_hf_weights(udir.string(), two);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unexpected tensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("lm_head.weight"), std::string::npos) << e.what();
  }
}

TEST(HfCheckpoint, ExportRefusesANonEmptyDirectoryAndKeepsIt) {
  const ParamLayout layout(small(true));
  const fs::path dir = temp("keep");
  ExportOptions o;
  o.dtype = DType::F32;
  export_hf_model(dir, layout, init_units(layout, 1), o);
  const auto before = fs::file_size(dir / "model.safetensors");
  EXPECT_THROW(export_hf_model(dir, layout, init_units(layout, 2), o), Error);
  EXPECT_EQ(fs::file_size(dir / "model.safetensors"), before);
  EXPECT_EQ(load_hf_weights(dir.string(), layout), init_units(layout, 1));
  o.overwrite = true;
  export_hf_model(dir, layout, init_units(layout, 2), o);
  EXPECT_NE(load_hf_weights(dir.string(), layout), init_units(layout, 1));
}

TEST(Npy, WritesWhatItReadsAndRejectsBadFiles) {
  const fs::path p = temp("a.npy");
  const std::vector<float> v = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -1e-3f};
  write_npy_f32(p, {2, 3}, v.data());
  const NpyArray a = read_npy(p);
  EXPECT_EQ(a.descr, "<f4");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(a.bytes.size(), 24u);
  EXPECT_EQ(std::memcmp(a.bytes.data(), v.data(), 24), 0);
  EXPECT_THROW(npy_as_int64(a, p), Error);  // floats are not token ids

  const fs::path bad = temp("bad.npy");
  std::ofstream(bad) << "not numpy";
  EXPECT_THROW(read_npy(bad), Error);
  // Truncated data: header says 6 floats, file holds 5.
  std::string bytes;
  {
    std::ifstream in(p, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(bad, std::ios::binary) << bytes.substr(0, bytes.size() - 4);
  try {
    read_npy(bad);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.npy"), std::string::npos) << e.what();
  }
}

TEST(TokenFile, TextFilesAndRangeChecks) {
  const fs::path p = temp("tokens.txt");
  std::ofstream(p) << "# comment\n1 2 3\n\n4 5\n";
  const auto s = read_token_sequences(p, 10, 16);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0], (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(s[1], (std::vector<int32_t>{4, 5}));
  try {
    read_token_sequences(p, 5, 16);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 4, position 1: token id 5"), std::string::npos) << e.what();
  }
  std::ofstream(p) << "1 x 3\n";
  EXPECT_THROW(read_token_sequences(p, 10, 16), Error);
  std::ofstream(p) << "1\n";
  EXPECT_THROW(read_token_sequences(p, 10, 16), Error);  // nothing to predict
  std::ofstream(p) << "1 2 3 4\n";
  EXPECT_THROW(read_token_sequences(p, 10, 3), Error);  // longer than max positions
}

}  // namespace
}  // namespace st

#include <gtest/gtest.h>

#include <algorithm>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/token_file.h"
#include "io/hf_checkpoint.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "config/model_config.h"
#include "model/init.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/temp_dir.h"

namespace st {
namespace {
namespace fs = std::filesystem;

using testing::caught_error;
using testing::error_of;
using testing::fresh_path;

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
  const fs::path dir = fresh_path("replace");
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
    const fs::path dir = fresh_path(tied ? "f32_tied" : "f32_untied");
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

    const fs::path bdir = fresh_path(tied ? "bf16_tied" : "bf16_untied");
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
  const fs::path dir = fresh_path("sharded");
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
  const fs::path dir = fresh_path("mismatch");
  export_hf_model(dir, two, init_units(two, 1), {});
  ModelConfig three = small(true);
  three.num_layers = 3;
  three.intermediate_size = 48;
  const std::string m = error_of([&] { load_hf_weights(dir.string(), ParamLayout(three)); });
  EXPECT_NE(m.find("missing tensors"), std::string::npos) << m;
  EXPECT_NE(m.find("model.layers.2.mlp.down_proj.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("wrong shapes"), std::string::npos) << m;
  EXPECT_NE(m.find("model.layers.0.mlp.gate_proj.weight: expected [48, 32], found [40, 32]"), std::string::npos) << m;
  // Untied checkpoint read as tied: lm_head.weight is unexpected.
  const ParamLayout untied(small(false));
  const fs::path udir = fresh_path("untied_as_tied");
  export_hf_model(udir, untied, init_units(untied, 2), {});
  const std::string u = error_of([&] { load_hf_weights(udir.string(), two); });
  EXPECT_NE(u.find("unexpected tensors"), std::string::npos) << u;
  EXPECT_NE(u.find("lm_head.weight"), std::string::npos) << u;
}

// An export from a Hugging Face model keeps the keys of its config.json that we do not
// use (token ids, generation settings, ...); the ones we write are ours, and what a
// changed model would contradict (layer_types, head_dim) follows the model.
TEST(HfCheckpoint, ExportKeepsTheSourceConfigsOtherKeys) {
  const fs::path src = fresh_path("keys_src");
  fs::create_directories(src);
  ModelConfig m = small(true);
  nlohmann::json j = hf_config_json(m);
  j["bos_token_id"] = 151643;
  j["eos_token_id"] = nlohmann::json::array({151645, 151643});
  j["pad_token_id"] = nullptr;
  j["transformers_version"] = "5.17.0";
  j["dtype"] = "float32";
  j["custom_settings"] = {{"a", 1}};
  j["layer_types"] = {"full_attention", "full_attention"};
  j["head_dim"] = m.head_dim();
  j["max_window_layers"] = 28;
  std::ofstream(src / "config.json") << j.dump(2);
  m.num_layers = 3;  // the run changed the model: model.layers=3
  const ParamLayout layout(m);
  const fs::path out = fresh_path("keys_out");
  ExportOptions o;
  o.config_from = src.string();
  o.dtype = DType::F32;
  export_hf_model(out, layout, init_units(layout, 1), o);
  std::ifstream in(out / "config.json");
  const nlohmann::json got = nlohmann::json::parse(in);
  EXPECT_EQ(got["bos_token_id"], 151643);
  EXPECT_EQ(got["eos_token_id"], nlohmann::json::array({151645, 151643}));
  EXPECT_TRUE(got.contains("pad_token_id") && got["pad_token_id"].is_null());
  EXPECT_EQ(got["transformers_version"], "5.17.0");
  EXPECT_EQ(got["custom_settings"]["a"], 1);
  EXPECT_EQ(got["num_hidden_layers"], 3);
  EXPECT_EQ(got["max_window_layers"], 3);
  EXPECT_EQ(got["layer_types"].size(), 3u);
  EXPECT_EQ(got["torch_dtype"], "float32");
  EXPECT_EQ(got["dtype"], "float32");
  EXPECT_EQ(load_hf_config(out.string()).num_layers, 3);
  EXPECT_EQ(load_hf_weights(out.string(), layout).size(), static_cast<size_t>(layout.num_units()));
  // A source config.json that is not an object is a data error naming it, before any write.
  std::ofstream(src / "config.json") << "[1, 2]";
  o.overwrite = true;
  const std::optional<Error> e = caught_error([&] { export_hf_model(out, layout, init_units(layout, 2), o); });
  ASSERT_TRUE(e) << "accepted";
  EXPECT_NE(std::string(e->what()).find((src / "config.json").string()), std::string::npos) << e->what();
  EXPECT_EQ(e->kind(), ErrorKind::Data);
  EXPECT_EQ(load_hf_weights(out.string(), layout), init_units(layout, 1));  // the export before is intact
}

// NaN or infinite weights are refused on load, naming the tensor and the element
// (they once gave `loss -nan` and exit 0).
TEST(HfCheckpoint, NonFiniteWeightsAreADataError) {
  const ParamLayout layout(small(true));
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    auto units = init_units(layout, 1);
    units[1][7] = bad;  // layers.0: input_layernorm.weight[7]
    const fs::path dir = fresh_path("nonfinite");
    ExportOptions o;
    o.dtype = DType::F32;
    export_hf_model(dir, layout, units, o);
    const std::optional<Error> e = caught_error([&] { load_hf_weights(dir.string(), layout); });
    ASSERT_TRUE(e) << "accepted " << bad;
    const std::string m = e->what();
    EXPECT_NE(m.find("tensor 'model.layers.0.input_layernorm.weight' holds"), std::string::npos) << m;
    EXPECT_NE(m.find("at element 7"), std::string::npos) << m;
    EXPECT_EQ(e->kind(), ErrorKind::Data);
  }
}

TEST(HfCheckpoint, ExportRefusesANonEmptyDirectoryAndKeepsIt) {
  const ParamLayout layout(small(true));
  const fs::path dir = fresh_path("keep");
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
  const fs::path p = fresh_path("a.npy");
  const std::vector<float> v = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -1e-3f};
  write_npy_f32(p, {2, 3}, v.data());
  const NpyArray a = read_npy(p);
  EXPECT_EQ(a.descr, "<f4");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(a.bytes.size(), 24u);
  EXPECT_EQ(std::memcmp(a.bytes.data(), v.data(), 24), 0);
  EXPECT_THROW(npy_as_int64(a, p), Error);  // floats are not token ids

  const fs::path bad = fresh_path("bad.npy");
  std::ofstream(bad) << "not numpy";
  EXPECT_THROW(read_npy(bad), Error);
  // Truncated data: header says 6 floats, file holds 5.
  const std::string bytes = testing::read_file(p);
  testing::write_file(bad, bytes.substr(0, bytes.size() - 4));
  const std::string e = error_of([&] { read_npy(bad); });
  EXPECT_NE(e.find("bad.npy"), std::string::npos) << e;
}

// A version 1.0 .npy file with this header dict and these data bytes.
void write_npy_raw(const fs::path& p, std::string dict, const std::string& data) {
  dict += std::string((64 - (10 + dict.size() + 1) % 64) % 64, ' ') + "\n";
  std::ofstream out(p, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  out.put(static_cast<char>(dict.size() & 0xff)).put(static_cast<char>(dict.size() >> 8));
  out << dict << data;
}

// A shape or dtype that is not what the data holds is refused, naming the file, before
// anything is read from the data (an overflowing shape once passed as 32 bytes).
TEST(Npy, MalformedShapesAndDtypesAreRefused) {
  const fs::path p = fresh_path("shape.npy");
  struct Case {
    const char* dict;
    size_t data_bytes;
    const char* expect;
  };
  const Case cases[] = {
      {"{'descr': '<i8', 'fortran_order': False, 'shape': (4611686018427387905, 4), }", 32, "more than 2^64 bytes"},
      {"{'descr': '<i4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }", 0, "more than 2^64 bytes"},
      {"{'descr': '<i4', 'fortran_order': False, 'shape': (-2, 4), }", 32, "negative dimension -2"},
      {"{'descr': '<i4', 'fortran_order': False, 'shape': (99999999999999999999999, 1), }", 8, "too large for 64 bits"},
      {"{'descr': '<i4', 'fortran_order': False, 'shape': (2, x), }", 8, "'x', not an integer dimension"},
      {"{'descr': '<i4', 'fortran_order': False, 'shape': (2,, 3), }", 24, "not an integer dimension"},
      {"{'descr': '<i99999999999', 'fortran_order': False, 'shape': (2,), }", 8, "unsupported dtype"},
      {"{'descr': '<U3', 'fortran_order': False, 'shape': (2,), }", 24, "unsupported dtype"},
      {"{'descr': '<i4', 'fortran_order': False, 'shape': (3, 4), }", 40, "needs 48 bytes of data but the file has 40"},
  };
  for (const Case& c : cases) {
    write_npy_raw(p, c.dict, std::string(c.data_bytes, '\0'));
    for (auto read : {std::function<void()>([&] { read_npy(p); }),
                      std::function<void()>([&] { read_token_sequences(p, 100, 1 << 20); })}) {
      const std::optional<Error> e = caught_error(read);
      if (!e) {
        ADD_FAILURE() << "accepted: " << c.dict;
        continue;
      }
      EXPECT_NE(std::string(e->what()).find(p.string()), std::string::npos) << e->what();
      EXPECT_NE(std::string(e->what()).find(c.expect), std::string::npos) << c.dict << ": " << e->what();
      EXPECT_EQ(e->kind(), ErrorKind::Data) << e->what();
    }
  }
  // Well-formed ones still read: 1-D with a trailing comma, 2-D, spaces anywhere.
  write_npy_raw(p, "{'descr': '<i4', 'fortran_order': False, 'shape': ( 3 , ), }", std::string("\1\0\0\0\2\0\0\0\3\0\0\0", 12));
  EXPECT_EQ(read_token_sequences(p, 10, 16), (std::vector<std::vector<int32_t>>{{1, 2, 3}}));
  write_npy_raw(p, "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 2), }", std::string(32, '\0'));
  EXPECT_EQ(read_npy(p).shape, (std::vector<int64_t>{2, 2}));
}

// A write that fails (here: the path is a directory) leaves no temporary file behind.
TEST(Npy, AFailedWriteLeavesNothingBehind) {
  const fs::path dir = fresh_path("npy_dir");
  fs::create_directories(dir);
  const float v[2] = {1, 2};
  EXPECT_THROW(write_npy_f32(dir, {2}, v), Error);
  EXPECT_FALSE(fs::exists(dir.string() + ".tmp"));
  EXPECT_TRUE(fs::is_directory(dir));
}

TEST(TokenFile, TextFilesAndRangeChecks) {
  const fs::path p = fresh_path("tokens.txt");
  std::ofstream(p) << "# comment\n1 2 3\n\n4 5\n";
  const auto s = read_token_sequences(p, 10, 16);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0], (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(s[1], (std::vector<int32_t>{4, 5}));
  const std::string e = error_of([&] { read_token_sequences(p, 5, 16); });
  EXPECT_NE(e.find("line 4, position 1: token id 5"), std::string::npos) << e;
  std::ofstream(p) << "1 x 3\n";
  EXPECT_THROW(read_token_sequences(p, 10, 16), Error);
  std::ofstream(p) << "1\n";
  EXPECT_THROW(read_token_sequences(p, 10, 16), Error);  // nothing to predict
  std::ofstream(p) << "1 2 3 4\n";
  EXPECT_THROW(read_token_sequences(p, 10, 3), Error);  // longer than max positions
}

}  // namespace
}  // namespace st

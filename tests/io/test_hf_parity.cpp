// Parity with transformers: tests/data/hf/<case>/ holds a small random Qwen2 model
// saved by transformers (config.json + safetensors), token ids, and the fp32 logits
// and loss transformers computed for them (scripts/make_hf_fixtures.py, run where
// torch and transformers are installed). Our CPU forward must match without them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "data/token_file.h"
#include "io/hf_checkpoint.h"
#include "io/npy.h"
#include "model/dense_params.h"
#include "model/qwen2.h"

namespace st {
namespace {
namespace fs = std::filesystem;

std::vector<fs::path> cases() {
  std::vector<fs::path> out;
  const fs::path root = fs::path(SHARDTRAIN_TEST_DATA) / "hf";
  if (fs::exists(root))
    for (const auto& e : fs::directory_iterator(root))
      if (fs::exists(e.path() / "config.json")) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(HfParity, FixturesArePresent) {
  // Four cases: tied and untied, kv_heads 1 and > 1, one bf16, one sharded.
  EXPECT_GE(cases().size(), 4u) << "run scripts/make_hf_fixtures.py to regenerate tests/data/hf";
}

TEST(HfParity, LogitsAndLossMatchTransformers) {
  for (const fs::path& dir : cases()) {
    SCOPED_TRACE(dir.filename().string());
    const ModelConfig cfg = load_hf_config(dir.string());
    const ParamLayout layout(cfg);
    auto be = make_cpu_backend();
    DenseParams params(layout, *be, DType::F32, false);
    const auto units = load_hf_weights(dir.string(), layout);
    for (int u = 0; u < layout.num_units(); ++u) params.set_unit(u, units[u]);

    const auto seqs = read_token_sequences((dir / "tokens.npy").string(), cfg.vocab_size, cfg.max_position_embeddings);
    const int B = static_cast<int>(seqs.size()), T = static_cast<int>(seqs[0].size()), V = cfg.vocab_size;
    std::vector<int32_t> tokens, targets;
    for (const auto& s : seqs) {
      tokens.insert(tokens.end(), s.begin(), s.end());
      targets.insert(targets.end(), s.begin() + 1, s.end());
      targets.push_back(-100);
    }
    Qwen2Model model(layout, *be, DType::F32, B, T);
    std::vector<float> ours(static_cast<size_t>(B) * T * V);
    const LossSum loss = model.forward(params, tokens.data(), targets.data(), -100, ours.data());

    const NpyArray ref = read_npy((dir / "logits.npy").string());
    ASSERT_EQ(ref.shape, (std::vector<int64_t>{B, T, V}));
    std::vector<float> theirs(ours.size());
    std::memcpy(theirs.data(), ref.bytes.data(), ref.bytes.size());
    double diff2 = 0, ref2 = 0, max_diff = 0, max_ref = 0;
    for (size_t i = 0; i < ours.size(); ++i) {
      const double d = static_cast<double>(ours[i]) - theirs[i];
      diff2 += d * d;
      ref2 += static_cast<double>(theirs[i]) * theirs[i];
      max_diff = std::max(max_diff, std::abs(d));
      max_ref = std::max(max_ref, std::abs(static_cast<double>(theirs[i])));
    }
    EXPECT_LT(std::sqrt(diff2 / ref2), 1e-4) << "relative L2 error of the logits";
    EXPECT_LT(max_diff / max_ref, 1e-4) << "largest logit difference relative to the largest logit";

    std::ifstream jf(dir / "expected.json");
    const nlohmann::json want = nlohmann::json::parse(jf);
    const double their_loss = want.at("loss").get<double>();
    EXPECT_NEAR(loss.sum / loss.count, their_loss, 1e-5 * their_loss);
  }
}

}  // namespace
}  // namespace st

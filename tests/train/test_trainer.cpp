#include <gtest/gtest.h>

#include <cmath>

#include "backend/backend.h"
#include "comm/process_groups.h"
#include "model/config.h"
#include "model/qwen2.h"
#include "train/trainer.h"

namespace st {
namespace {

RunConfig small_run(int steps) {
  RunConfig cfg;
  cfg.model = model_preset("tiny");
  cfg.model.num_layers = 2;
  cfg.model.hidden_size = 64;
  cfg.model.intermediate_size = 128;
  cfg.train.steps = steps;
  cfg.train.seq_len = 32;
  cfg.train.micro_batch = 8;
  cfg.optim.warmup_steps = 5;
  cfg.run.out_dir = "";
  cfg.run.progress = "off";
  return cfg;
}

TrainResult run(const RunConfig& cfg) {
  auto be = make_cpu_backend();
  ProcessGroups groups = make_single_process_groups(*be);
  Trainer t(cfg, *be, groups);
  return t.run(false);
}

TEST(Trainer, SameSeedGivesBitwiseEqualLosses) {
  const RunConfig cfg = small_run(6);
  const TrainResult a = run(cfg), b = run(cfg);
  ASSERT_EQ(a.losses.size(), 6u);
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i + 1;  // bitwise, not near
    EXPECT_EQ(a.grad_norms[i], b.grad_norms[i]) << "step " << i + 1;
  }
  RunConfig other = cfg;
  other.train.seed = cfg.train.seed + 1;
  EXPECT_NE(run(other).losses[0], a.losses[0]);
}

// Every train.recompute choice trains the same bits as keeping everything, with less
// activation memory; "block" keeps the least.
TEST(Trainer, RecomputeGivesTheSameLossesWithLessMemory) {
  RunConfig keep = small_run(4);
  const TrainResult want = run(keep);
  size_t none_bytes = 0, least = SIZE_MAX;
  std::string least_name;
  for (const std::string& choice : recompute_choices()) {
    RunConfig cfg = keep;
    cfg.train.recompute = choice;
    const TrainResult got = run(cfg);
    ASSERT_EQ(got.losses.size(), want.losses.size()) << choice;
    for (size_t i = 0; i < want.losses.size(); ++i) {
      EXPECT_EQ(got.losses[i], want.losses[i]) << choice << ", step " << i + 1;
      EXPECT_EQ(got.grad_norms[i], want.grad_norms[i]) << choice << ", step " << i + 1;
    }
    if (choice == "none") none_bytes = got.peak_memory_bytes;
    else EXPECT_LT(got.peak_memory_bytes, none_bytes) << choice;
    if (got.peak_memory_bytes < least) least = got.peak_memory_bytes, least_name = choice;
  }
  EXPECT_EQ(least_name, "block");
  RunConfig bad = keep;
  bad.train.recompute = "everything";
  EXPECT_THROW(run(bad), Error);
}

TEST(Trainer, GradientAccumulationEqualsOneLargeBatch) {
  RunConfig big = small_run(5);
  RunConfig accum = big;
  accum.train.micro_batch = 2;
  accum.train.grad_accum = 4;
  const TrainResult a = run(big), b = run(accum);
  for (size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_NEAR(a.losses[i], b.losses[i], 1e-5 * a.losses[i]) << "step " << i + 1;
}

TEST(Trainer, TrainingOnTheBuiltInCorpusLowersTheLoss) {
  RunConfig cfg = small_run(60);
  cfg.optim.lr = 3e-3;
  const TrainResult r = run(cfg);
  EXPECT_NEAR(r.losses.front(), std::log(256.0), 0.3);  // uniform over bytes at init
  EXPECT_LT(r.losses.back(), r.losses.front() - 1.5) << "first " << r.losses.front() << " last " << r.losses.back();
  for (double l : r.losses) EXPECT_TRUE(std::isfinite(l));
}

// The L2 norm of AdamW's first moment over every unit of the model.
double first_moment_norm(Fsdp& f) {
  double sq = 0;
  for (int u = 0; u < f.plan().num_units(); ++u)
    for (float m : f.download_shard(u, ShardState::AdamM)) sq += static_cast<double>(m) * m;
  return std::sqrt(sq);
}

// After one step m = (1 - beta1) * scale * g, so |m| / (1 - beta1) is the norm of the
// gradient the optimizer used: the clip value when clipped, the raw norm otherwise.
TEST(Trainer, RandomDataTrainsAndClipsTheGradient) {
  for (double clip : {1e-3, 0.0, 1e6}) {
    RunConfig cfg = small_run(1);
    cfg.data.source = "random";
    cfg.optim.grad_clip = clip;
    auto be = make_cpu_backend();
    ProcessGroups groups = make_single_process_groups(*be);
    Trainer t(cfg, *be, groups);
    const TrainResult r = t.run(false);
    EXPECT_NEAR(r.losses.front(), std::log(256.0), 0.3);
    const double norm = r.grad_norms.front(), used = first_moment_norm(t.params()) / (1 - cfg.optim.beta1);
    ASSERT_GT(norm, 1e-3);
    const double want = clip > 0 && norm > clip ? clip : norm;
    EXPECT_NEAR(used, want, 1e-5 * want) << "grad_clip " << clip << ", gradient norm " << norm;
  }
}

}  // namespace
}  // namespace st

// A tiny model trained for 20 steps on the GPU (bf16 activations, fp32 master
// weights, gradients and AdamW) and on the CPU (fp32 throughout), from the same seed
// and data: the GPU loss curve must follow the CPU one.
//
// Tolerance |gpu - cpu| <= 0.02 + 2% of the CPU loss, per step. Why that much: the GPU
// computes with bf16 weights and activations (8-bit mantissa, relative rounding up
// to 2^-9 = 0.2%), so its logits differ from the fp32 ones by a few tenths of a
// percent from step 1 (a loss of ~5.5 moves by ~0.01), and the two optimisation
// trajectories then drift apart slowly as those differences feed AdamW. A wrong
// gradient anywhere (a missing term, a transposed GEMM, a bad attention mask) moves
// the curve by far more than 2% within a few steps, or stops it from falling.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "backend/backend.h"
#include "backend/factory.h"
#include "comm/process_groups.h"
#include "config/model_config.h"
#include "support/temp_dir.h"
#include "support/tiny_run.h"
#include "train/trainer.h"

namespace st {
namespace {

using testing::tiny_run;
using testing::train_one_rank;

TEST(TrainGpu, LossFollowsTheCpuReference) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  RunConfig cfg = tiny_run(20);
  cfg.data.source = "text";
  // The project's own sources: a byte corpus present wherever the tests are built.
  cfg.data.paths = {std::string(SHARDTRAIN_SOURCE_DIR) + "/src"};
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0);
  const TrainResult c = train_one_rank(cfg, *cpu);
  const TrainResult g = train_one_rank(cfg, *gpu);
  ASSERT_EQ(g.losses.size(), c.losses.size());
  double worst = 0;
  for (size_t i = 0; i < c.losses.size(); ++i) {
    ASSERT_TRUE(std::isfinite(g.losses[i])) << "step " << i + 1;
    const double d = std::abs(g.losses[i] - c.losses[i]);
    worst = std::max(worst, d);
    std::printf("step %2zu  cpu %.4f  gpu %.4f  |d| %.4f   grad norm cpu %.4f gpu %.4f\n", i + 1, c.losses[i],
                g.losses[i], d, c.grad_norms[i], g.grad_norms[i]);
    EXPECT_LE(d, 0.02 + 0.02 * c.losses[i]) << "step " << i + 1;
  }
  std::printf("largest |gpu - cpu| loss difference: %.4f\n", worst);
  // At initialisation the model is uniform over 256 bytes on both.
  EXPECT_NEAR(g.losses.front(), std::log(256.0), 0.3);
  EXPECT_LT(g.losses.back(), g.losses.front() - 0.5) << "the GPU run does not learn";
  // The first gradient norms come from nearly identical weights.
  EXPECT_NEAR(g.grad_norms.front(), c.grad_norms.front(), 0.05 * c.grad_norms.front());
}

// bf16 master weights and moments on the GPU follow the CPU's run of the same settings
// (same tolerance as the f32 case), and train.offload, whose copies run on streams of
// their own beside the updates, changes no bit of the GPU run: a missing wait between
// the copy lanes and the update would show as a different loss.
TEST(TrainGpu, Bf16StateFollowsTheCpuAndOffloadChangesNoBit) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  RunConfig cfg = tiny_run(20);
  cfg.data.source = "text";
  cfg.data.paths = {std::string(SHARDTRAIN_SOURCE_DIR) + "/src"};
  cfg.optim.state_dtype = cfg.optim.master_dtype = "bf16";
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0);
  const TrainResult c = train_one_rank(cfg, *cpu);
  const TrainResult g = train_one_rank(cfg, *gpu);
  ASSERT_EQ(g.losses.size(), c.losses.size());
  for (size_t i = 0; i < c.losses.size(); ++i)
    EXPECT_LE(std::abs(g.losses[i] - c.losses[i]), 0.02 + 0.02 * c.losses[i]) << "step " << i + 1;
  EXPECT_LT(g.losses.back(), g.losses.front() - 0.5) << "the GPU run does not learn";
  for (const char* offload : {"optimizer", "optimizer+master"}) {
    RunConfig o = cfg;
    o.train.offload = offload;
    const TrainResult go = train_one_rank(o, *gpu);
    ASSERT_EQ(go.losses.size(), g.losses.size());
    for (size_t i = 0; i < g.losses.size(); ++i) {
      EXPECT_EQ(go.losses[i], g.losses[i]) << offload << ", step " << i + 1;
      EXPECT_EQ(go.grad_norms[i], g.grad_norms[i]) << offload << ", step " << i + 1;
    }
  }
}

// train.matmul_dtype=fp8 on the GPU follows the CPU's exact emulation of it as the
// bf16 run follows f32 (same tolerance), and stays near the GPU's own bf16 run.
TEST(TrainGpu, Fp8FollowsTheCpuEmulationAndTheBf16Run) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  if (!gpu->fp8_unsupported_reason().empty()) GTEST_SKIP() << gpu->fp8_unsupported_reason();
  RunConfig cfg = tiny_run(20);
  cfg.data.source = "text";
  cfg.data.paths = {std::string(SHARDTRAIN_SOURCE_DIR) + "/src"};
  const TrainResult bf16 = train_one_rank(cfg, *gpu);
  cfg.train.matmul_dtype = "fp8";
  cfg.train.fp8_layers = {"qkv", "o", "gate_up", "down"};  // every kind (the default is the MLP's)
  cfg.train.fp8_scaling = "current";                       // the default is delayed (below)
  cfg.train.fp8_dlogits_rounding = "nearest";              // the default is stochastic (last)
  auto cpu = make_cpu_backend();
  const TrainResult c = train_one_rank(cfg, *cpu);
  const TrainResult g = train_one_rank(cfg, *gpu);
  ASSERT_EQ(g.losses.size(), c.losses.size());
  for (size_t i = 0; i < c.losses.size(); ++i) {
    ASSERT_TRUE(std::isfinite(g.losses[i])) << "step " << i + 1;
    std::printf("step %2zu  cpu fp8 %.4f  gpu fp8 %.4f  gpu bf16 %.4f\n", i + 1, c.losses[i], g.losses[i],
                bf16.losses[i]);
    EXPECT_LE(std::abs(g.losses[i] - c.losses[i]), 0.02 + 0.02 * c.losses[i]) << "step " << i + 1;
    EXPECT_LE(std::abs(g.losses[i] - bf16.losses[i]), 0.02 + 0.03 * bf16.losses[i]) << "step " << i + 1;
  }
  EXPECT_LT(g.losses.back(), g.losses.front() - 0.5) << "the fp8 run does not learn";
  // Delayed scaling: the GPU follows the CPU's delayed run the same way.
  cfg.train.fp8_scaling = "delayed";
  const TrainResult cd = train_one_rank(cfg, *cpu), gd = train_one_rank(cfg, *gpu);
  for (size_t i = 0; i < cd.losses.size(); ++i) {
    std::printf("step %2zu  cpu fp8 delayed %.4f  gpu fp8 delayed %.4f\n", i + 1, cd.losses[i], gd.losses[i]);
    EXPECT_LE(std::abs(gd.losses[i] - cd.losses[i]), 0.02 + 0.02 * cd.losses[i]) << "delayed, step " << i + 1;
  }
  EXPECT_LT(gd.losses.back(), gd.losses.front() - 0.5) << "the delayed fp8 run does not learn";
  // The MLP's layers only (the default), QKV and O in bf16: the same.
  cfg.train.fp8_layers = {"gate_up", "down"};
  const TrainResult cm = train_one_rank(cfg, *cpu), gm = train_one_rank(cfg, *gpu);
  for (size_t i = 0; i < cm.losses.size(); ++i)
    EXPECT_LE(std::abs(gm.losses[i] - cm.losses[i]), 0.02 + 0.02 * cm.losses[i]) << "MLP only, step " << i + 1;
  EXPECT_NE(gm.losses, gd.losses) << "train.fp8_layers changed nothing on the GPU";
  // The lm_head in FP8 too (the loss kernel writing its gradient as e5m2): the same.
  cfg.train.fp8_layers = {"gate_up", "down", "lm_head"};
  const TrainResult ch = train_one_rank(cfg, *cpu), gh = train_one_rank(cfg, *gpu);
  for (size_t i = 0; i < ch.losses.size(); ++i)
    EXPECT_LE(std::abs(gh.losses[i] - ch.losses[i]), 0.02 + 0.02 * ch.losses[i]) << "lm_head, step " << i + 1;
  EXPECT_NE(gh.losses, gm.losses) << "lm_head in train.fp8_layers changed nothing on the GPU";
  // Its gradients alone (the loss kernel's e5m2 copy transposed for the weight gradient).
  cfg.train.fp8_layers = {"gate_up", "down", "lm_head_grad"};
  const TrainResult cg = train_one_rank(cfg, *cpu), gg = train_one_rank(cfg, *gpu);
  for (size_t i = 0; i < cg.losses.size(); ++i)
    EXPECT_LE(std::abs(gg.losses[i] - cg.losses[i]), 0.02 + 0.02 * cg.losses[i]) << "lm_head_grad, step " << i + 1;
  EXPECT_NE(gg.losses, gm.losses) << "lm_head_grad in train.fp8_layers changed nothing on the GPU";
  EXPECT_NE(gg.losses, gh.losses) << "lm_head_grad ran as lm_head on the GPU";
  // Its forward alone (the logits from an FP8 GEMM, the loss and gradients in bf16).
  cfg.train.fp8_layers = {"gate_up", "down", "lm_head_fwd"};
  const TrainResult cf = train_one_rank(cfg, *cpu), gf = train_one_rank(cfg, *gpu);
  for (size_t i = 0; i < cf.losses.size(); ++i)
    EXPECT_LE(std::abs(gf.losses[i] - cf.losses[i]), 0.02 + 0.02 * cf.losses[i]) << "lm_head_fwd, step " << i + 1;
  EXPECT_NE(gf.losses, gm.losses) << "lm_head_fwd in train.fp8_layers changed nothing on the GPU";
  EXPECT_NE(gf.losses, gh.losses) << "lm_head_fwd ran as lm_head on the GPU";
  cfg.train.fp8_layers = {"gate_up", "down", "lm_head_grad"};
  // Stochastic rounding of the logits' gradient (the default rounding): the CPU and the
  // GPU draw the same bits.
  cfg.train.fp8_dlogits_rounding = "stochastic";
  EXPECT_EQ(cfg.train.fp8_dlogits_rounding, RunConfig{}.train.fp8_dlogits_rounding);
  const TrainResult cs = train_one_rank(cfg, *cpu), gs = train_one_rank(cfg, *gpu);
  for (size_t i = 0; i < cs.losses.size(); ++i)
    EXPECT_LE(std::abs(gs.losses[i] - cs.losses[i]), 0.02 + 0.02 * cs.losses[i]) << "stochastic, step " << i + 1;
  EXPECT_NE(gs.losses, gg.losses) << "fp8_dlogits_rounding=stochastic changed nothing on the GPU";
}

// FP8 with delayed scaling on the GPU: the amax history and the stochastic rounding's
// count travel through the checkpoint (downloaded from and uploaded to the device), so a
// run resumed from step 4 repeats steps 5-8 of the uninterrupted one bit for bit.
TEST(TrainGpu, Fp8DelayedScalingResumesBitForBit) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  if (!gpu->fp8_unsupported_reason().empty()) GTEST_SKIP() << gpu->fp8_unsupported_reason();
  const std::string dir = testing::temp_dir("gpu-resume-fp8").string();
  RunConfig cfg = tiny_run(8);
  cfg.train.matmul_dtype = "fp8";
  cfg.train.fp8_scaling = "delayed";
  cfg.train.fp8_layers = {"qkv", "o", "gate_up", "down", "lm_head_grad"};
  cfg.train.fp8_dlogits_rounding = "stochastic";
  cfg.run.checkpoint_dir = dir;
  cfg.run.checkpoint_every = 4;
  cfg.run.keep_last = 0;
  const TrainResult a = train_one_rank(cfg, *gpu);
  RunConfig again = cfg;
  again.run.checkpoint_every = 0;
  again.run.resume = dir + "/step-4";
  const TrainResult b = train_one_rank(again, *gpu);
  ASSERT_EQ(a.losses.size(), 8u);
  ASSERT_EQ(b.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    std::printf("step %zu  uninterrupted %.6f  resumed %.6f\n", 5 + i, a.losses[4 + i], b.losses[i]);
    EXPECT_EQ(b.losses[i], a.losses[4 + i]) << "step " << 5 + i;
    EXPECT_EQ(b.grad_norms[i], a.grad_norms[4 + i]) << "step " << 5 + i;
  }
}

TEST(TrainGpu, FactoryMakesTheCudaBackend) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto be = make_backend("cuda");
  EXPECT_EQ(be->device(), Device::CUDA);
  EXPECT_EQ(be->name().rfind("cuda:0", 0), 0u) << be->name();
}

}  // namespace
}  // namespace st

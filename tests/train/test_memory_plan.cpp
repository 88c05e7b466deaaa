// The memory plan (train/memory_plan.h) against the trainer's own estimate, which the
// GPU runs measure (docs/performance.md: within 3% of the peak): equal, byte for byte,
// for three configurations; the largest micro-batch that fits; and `train
// --run.dry_run=true`, which prints those numbers, exits 0, needs no GPU and writes
// nothing.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "backend/backend.h"
#include "config/model_config.h"
#include "core/log.h"
#include "support/shell.h"
#include "support/temp_dir.h"
#include "support/tiny_run.h"
#include "train/memory_check.h"
#include "train/memory_plan.h"
#include "train/trainer.h"

namespace st {
namespace {

using testing::tiny_run;
using testing::train_on_cpu;

std::vector<RunConfig> three_configs() {
  RunConfig a = tiny_run(1);
  RunConfig b = tiny_run(1);
  b.train.recompute = "block";
  b.train.matmul_dtype = "fp8";
  b.train.grad_accum = 2;
  RunConfig c = tiny_run(1);
  c.model.tie_word_embeddings = false;
  c.train.micro_batch = 3;
  c.train.seq_len = 24;
  c.train.recompute = "swiglu";
  RunConfig d = tiny_run(1);  // bf16 state and master, all of it offloaded
  d.optim.state_dtype = d.optim.master_dtype = "bf16";
  d.train.offload = "optimizer+master";
  RunConfig e = tiny_run(1);  // fp32 moments offloaded
  e.train.offload = "optimizer";
  return {a, b, c, d, e};
}

TEST(MemoryPlan, EqualsTheTrainersEstimateForFiveConfigs) {
  for (const RunConfig& cfg : three_configs()) {
    size_t estimated = 0, host = 0;
    train_on_cpu(cfg, [&](Trainer& t) {
      estimated = t.estimated_peak_bytes();
      host = t.params().memory().host_bytes;
    });
    const MemoryPlan p = plan_rank_memory(cfg, Device::CPU, 1, true, 0);
    EXPECT_EQ(p.device_total(), estimated) << cfg.train.recompute << " " << cfg.train.matmul_dtype << " "
                                           << cfg.train.offload;
    EXPECT_EQ(p.offloaded, host) << cfg.train.offload;
    EXPECT_GT(p.activations, 0u);
    EXPECT_EQ(p.gathered.total(), 0u);  // one rank reads its shards in place
    EXPECT_EQ(p.batches, size_t(cfg.train.grad_accum) * cfg.train.micro_batch * cfg.train.seq_len * 8);
  }
}

TEST(MemoryPlan, ShardingDividesTheStateAndGathersUnits) {
  RunConfig cfg = tiny_run(1);
  const MemoryPlan one = plan_rank_memory(cfg, Device::CUDA, 1, true, kCudaPlannedWorkspaceBytes);
  const MemoryPlan four = plan_rank_memory(cfg, Device::CUDA, 4, false, kCudaPlannedWorkspaceBytes);
  EXPECT_EQ(one.master, size_t(cfg.model.num_params()) * 4);
  EXPECT_EQ(one.low, size_t(cfg.model.num_params()) * 2);  // the bf16 copy on a GPU
  EXPECT_NEAR(double(four.optimizer), double(one.optimizer) / 4, double(one.optimizer) * 0.01);
  EXPECT_GT(four.gathered.total(), 0u);
  EXPECT_EQ(one.workspace, kCudaPlannedWorkspaceBytes);
}

// optim.state_dtype / master_dtype and train.offload on a GPU: bf16 halves the state
// and makes the master its own compute copy; offloading moves the state to the host and
// leaves the compute copy and a staging buffer on the GPU. 14B on one H200 (141 GB):
// refused with fp32 state, trainable with bf16 state offloaded.
TEST(MemoryPlan, StateDtypesAndOffloadMoveTheBytes) {
  RunConfig cfg = tiny_run(1);
  const size_t n = size_t(cfg.model.num_params());
  cfg.optim.state_dtype = cfg.optim.master_dtype = "bf16";
  const MemoryPlan bf16 = plan_rank_memory(cfg, Device::CUDA, 1, true, 0);
  EXPECT_EQ(bf16.master, n * 2);
  EXPECT_EQ(bf16.low, 0u);  // the bf16 master is what the model reads
  EXPECT_EQ(bf16.optimizer, n * 4);
  EXPECT_EQ(bf16.offloaded + bf16.staging, 0u);
  cfg.train.offload = "optimizer+master";
  const MemoryPlan off = plan_rank_memory(cfg, Device::CUDA, 1, true, 0);
  EXPECT_EQ(off.master + off.optimizer, 0u);
  EXPECT_EQ(off.low, n * 2);
  EXPECT_EQ(off.offloaded, n * 6);
  EXPECT_GT(off.staging, 0u);
  EXPECT_LT(off.staging, 2 * off.offloaded);  // two slots of the largest unit, not the whole
  // Offloading pays where no unit is most of the model (here the embedding is: the two
  // slots of it outweigh the saving), e.g. at 1.5B.
  RunConfig q = cfg;
  q.model = model_preset("qwen2.5-1.5b");
  q.train.offload = "none";
  const size_t on_gpu = plan_rank_memory(q, Device::CUDA, 1, true, 0).device_total();
  q.train.offload = "optimizer+master";
  const MemoryPlan q_off = plan_rank_memory(q, Device::CUDA, 1, true, 0);
  EXPECT_LT(q_off.device_total() + size_t(q.model.num_params()), on_gpu);  // saves over 1 byte per parameter

  RunConfig big = tiny_run(1);
  big.model = model_preset("qwen2.5-14b");
  big.train.seq_len = 2048;
  big.train.micro_batch = 1;
  big.train.recompute = "block";
  const size_t h200 = size_t(141e9);
  EXPECT_EQ(largest_fitting_micro_batch(big, Device::CUDA, 1, true, kCudaPlannedWorkspaceBytes, h200), 0);
  big.optim.state_dtype = big.optim.master_dtype = "bf16";
  big.train.offload = "optimizer";
  EXPECT_GE(largest_fitting_micro_batch(big, Device::CUDA, 1, true, kCudaPlannedWorkspaceBytes, h200), 4);
}

// cuDNN attention's workspace on a GPU, against what cuDNN 9 took on an H100 at four
// shapes (docs/performance.md, 2026-12-05 evening: the step-1 line's measured workspace
// less cuBLASLt's 32 MiB): it grows with T², and the plan counts it on a GPU only.
TEST(MemoryPlan, CountsCudnnAttentionsWorkspaceAsMeasured) {
  struct Case {
    const char* model;
    int T, B;
    double mib;
  };
  for (const Case& k : {Case{"qwen2.5-0.5b", 2048, 4, 476.44}, Case{"qwen2.5-1.5b", 1024, 8, 240.38},
                        Case{"qwen2.5-1.5b", 4096, 2, 816.38}, Case{"qwen2.5-0.5b", 4096, 2, 924.44}}) {
    const ModelConfig m = model_preset(k.model);
    const double mib = double(attention_workspace_bytes(m, k.B, k.T)) / (1 << 20);
    EXPECT_NEAR(mib, k.mib, 0.005) << k.model << " T=" << k.T << " B=" << k.B;
  }
  RunConfig cfg = tiny_run(1);
  EXPECT_EQ(plan_rank_memory(cfg, Device::CPU, 1, true, 0).attention, 0u);
  const MemoryPlan gpu = plan_rank_memory(cfg, Device::CUDA, 1, true, 0);
  EXPECT_EQ(gpu.attention, attention_workspace_bytes(cfg.model, cfg.train.micro_batch, cfg.train.seq_len));
}

TEST(MemoryPlan, LargestFittingMicroBatch) {
  RunConfig cfg = tiny_run(1);
  cfg.train.micro_batch = 5;
  const size_t at5 = plan_rank_memory(cfg, Device::CUDA, 1, true, 0).device_total();
  EXPECT_EQ(largest_fitting_micro_batch(cfg, Device::CUDA, 1, true, 0, at5), 5);
  EXPECT_EQ(largest_fitting_micro_batch(cfg, Device::CUDA, 1, true, 0, at5 - 1), 4);
  EXPECT_EQ(largest_fitting_micro_batch(cfg, Device::CUDA, 1, true, 0, 1000), 0);
  // FP8 needs tokens per micro-batch in multiples of 16: seq 20 allows 4, 8, ...
  cfg.train.seq_len = 20;
  cfg.train.matmul_dtype = "fp8";
  cfg.train.micro_batch = 7;
  const size_t at7 = plan_rank_memory(cfg, Device::CUDA, 1, true, 0).device_total();
  EXPECT_EQ(largest_fitting_micro_batch(cfg, Device::CUDA, 1, true, 0, at7), 4);
}

// The command prints the plan's own numbers for three configurations, exits 0 and
// leaves run.out_dir alone; a GPU plan needs no GPU.
TEST(MemoryPlan, DryRunPrintsThePlanAndWritesNothing) {
  const std::filesystem::path out = testing::temp_dir("dry_run_out") / "never";
  struct Case {
    std::string args;
    RunConfig cfg;
    Device device;
    int world, shard;
  };
  RunConfig q15;
  q15.model = model_preset("qwen2.5-1.5b");
  q15.train.seq_len = 2048, q15.train.micro_batch = 8, q15.train.device = "cuda";
  RunConfig q7 = q15;
  q7.model = model_preset("qwen2.5-7b");
  q7.train.micro_batch = 2, q7.train.recompute = "block";
  const std::vector<Case> cases = {
      {"--config configs/tiny.toml", {}, Device::CPU, 1, 1},
      {"--model.preset=qwen2.5-1.5b --train.device=cuda --train.seq_len=2048 --train.micro_batch=8 "
       "--run.gpu_memory_gib=22.5",
       q15, Device::CUDA, 1, 1},
      {"--model.preset=qwen2.5-7b --train.device=cuda --train.seq_len=2048 --train.micro_batch=2 "
       "--train.recompute=block --run.gpu_memory_gib=22.5 --run.dry_run_world=8",
       q7, Device::CUDA, 8, 8},
  };
  for (const Case& c : cases) {
    const auto r = testing::run_shell("cd " + std::string(SHARDTRAIN_SOURCE_DIR) + " && " + SHARDTRAIN_BINARY +
                                      " train " + c.args + " --run.dry_run=true --run.out_dir=" + out.string());
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("dry run: nothing is allocated"), std::string::npos) << r.out;
    EXPECT_FALSE(std::filesystem::exists(out)) << c.args;
    if (c.device == Device::CPU) continue;  // its limit is this machine's RAM
    const MemoryPlan p = plan_rank_memory(c.cfg, c.device, c.shard, c.world == 1, kCudaPlannedWorkspaceBytes);
    EXPECT_NE(r.out.find(human_bytes(double(p.device_total()))), std::string::npos)
        << "total " << human_bytes(double(p.device_total())) << " missing from\n" << r.out;
    EXPECT_NE(r.out.find(human_bytes(double(p.activations))), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("largest micro-batch that fits at seq 2048, per recompute: none "), std::string::npos)
        << r.out;
    RunConfig none = c.cfg;
    none.train.recompute = "none";
    const int mb = largest_fitting_micro_batch(none, c.device, c.shard, c.world == 1, kCudaPlannedWorkspaceBytes,
                                               size_t(22.5 * double(size_t(1) << 30)));
    EXPECT_NE(r.out.find("per recompute: none " + std::to_string(mb) + " "), std::string::npos) << r.out;
  }
}

}  // namespace
}  // namespace st

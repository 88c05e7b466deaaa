#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "comm/process_groups.h"
#include "config/model_config.h"
#include "fsdp/fsdp.h"
#include "model/qwen2.h"
#include "support/tiny_run.h"
#include "train/matmul_precision.h"
#include "train/memory_check.h"
#include "train/trainer.h"

namespace st {
namespace {

using testing::tiny_run;
using testing::train_on_cpu;

TEST(Trainer, SameSeedGivesBitwiseEqualLosses) {
  const RunConfig cfg = tiny_run(6);
  const TrainResult a = train_on_cpu(cfg), b = train_on_cpu(cfg);
  ASSERT_EQ(a.losses.size(), 6u);
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i + 1;  // bitwise, not near
    EXPECT_EQ(a.grad_norms[i], b.grad_norms[i]) << "step " << i + 1;
  }
  RunConfig other = cfg;
  other.train.seed = cfg.train.seed + 1;
  EXPECT_NE(train_on_cpu(other).losses[0], a.losses[0]);
}

// Every train.recompute choice trains the same bits as keeping everything, with less
// activation memory; "block" keeps the least.
TEST(Trainer, RecomputeGivesTheSameLossesWithLessMemory) {
  RunConfig keep = tiny_run(4);
  const TrainResult want = train_on_cpu(keep);
  size_t none_bytes = 0, least = SIZE_MAX;
  std::string least_name;
  for (const std::string& choice : recompute_choices()) {
    RunConfig cfg = keep;
    cfg.train.recompute = choice;
    const TrainResult got = train_on_cpu(cfg);
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
  EXPECT_THROW(train_on_cpu(bad), Error);
}

// train.matmul_dtype=fp8 on the CPU (the exact emulation of the GPU's FP8): the run
// learns, stays near the f32 run (fp8's 3-bit mantissa costs a few percent of loss at
// most here), is deterministic, and recompute still changes no bits under it.
TEST(Trainer, Fp8MatmulsTrainNearTheF32Run) {
  RunConfig cfg = tiny_run(30);
  const TrainResult f32 = train_on_cpu(cfg);
  cfg.train.matmul_dtype = "fp8";
  cfg.train.fp8_layers = {"qkv", "o", "gate_up", "down"};  // every kind (the default is the MLP's)
  const TrainResult fp8 = train_on_cpu(cfg), again = train_on_cpu(cfg);
  ASSERT_EQ(fp8.losses.size(), f32.losses.size());
  bool differs = false;
  for (size_t i = 0; i < f32.losses.size(); ++i) {
    ASSERT_TRUE(std::isfinite(fp8.losses[i])) << "step " << i + 1;
    EXPECT_NEAR(fp8.losses[i], f32.losses[i], 0.03 * f32.losses[i]) << "step " << i + 1;
    EXPECT_EQ(fp8.losses[i], again.losses[i]) << "step " << i + 1;
    differs |= fp8.losses[i] != f32.losses[i];
  }
  EXPECT_TRUE(differs) << "fp8 gave the f32 run's bits: the matmuls did not quantize";
  EXPECT_LT(fp8.losses.back(), fp8.losses.front() - 0.5);
  RunConfig block = cfg;
  block.train.recompute = "block";
  block.train.steps = 3;
  cfg.train.steps = 3;
  const TrainResult a = train_on_cpu(cfg), b = train_on_cpu(block);
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i + 1;
  // A shape FP8 cannot run is refused, naming the dimension.
  RunConfig odd = cfg;
  odd.train.seq_len = 31;
  const std::string why = Qwen2Model::fp8_shape_problem(odd.model, odd.train.micro_batch, odd.train.seq_len);
  EXPECT_NE(why.find("micro_batch * seq_len"), std::string::npos) << why;
  EXPECT_EQ(Qwen2Model::fp8_shape_problem(odd.model, 8, 32), "");
}

// train.fp8_scaling=delayed: step 1 (no history) is the current-scaling run's step 1
// bit for bit; later steps use the history's scales, so they differ a little from
// current scaling but stay near f32, repeat bit for bit, and recompute changes no bit.
TEST(Trainer, Fp8DelayedScalingTrainsLikeCurrentScaling) {
  RunConfig cfg = tiny_run(30);
  const TrainResult f32 = train_on_cpu(cfg);
  cfg.train.matmul_dtype = "fp8";
  cfg.train.fp8_layers = {"qkv", "o", "gate_up", "down"};
  cfg.train.fp8_scaling = "current";
  const TrainResult current = train_on_cpu(cfg);
  cfg.train.fp8_scaling = "delayed";
  EXPECT_EQ(RunConfig{}.train.fp8_scaling, "delayed") << "the default";
  const TrainResult delayed = train_on_cpu(cfg), again = train_on_cpu(cfg);
  ASSERT_EQ(delayed.losses.size(), f32.losses.size());
  EXPECT_EQ(delayed.losses[0], current.losses[0]) << "step 1 has no history: current scaling";
  bool differs = false;
  for (size_t i = 0; i < f32.losses.size(); ++i) {
    ASSERT_TRUE(std::isfinite(delayed.losses[i])) << "step " << i + 1;
    EXPECT_NEAR(delayed.losses[i], f32.losses[i], 0.03 * f32.losses[i]) << "step " << i + 1;
    EXPECT_NEAR(delayed.losses[i], current.losses[i], 0.02 * current.losses[i]) << "step " << i + 1;
    EXPECT_EQ(delayed.losses[i], again.losses[i]) << "step " << i + 1;
    differs |= delayed.losses[i] != current.losses[i];
  }
  EXPECT_TRUE(differs) << "delayed scaling gave current scaling's bits: no history was used";
  RunConfig block = cfg;
  block.train.recompute = "block";
  block.train.steps = cfg.train.steps = 4;
  const TrainResult a = train_on_cpu(cfg), b = train_on_cpu(block);
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i + 1;
}

// train.fp8_layers / train.fp8_bf16_end_blocks: only the chosen linear layers of the
// chosen blocks go through FP8 (by default the MLP's gate|up and down). One kind, or FP8 in the middle blocks only, gives a run
// of its own (neither f32's bits nor all-FP8's) that stays near f32; the order a list
// names the kinds in does not matter; choices that leave no FP8 layer are refused
// before a run, naming the key.
TEST(Trainer, Fp8LayersAndEndBlocksChooseWhichMatmulsAreFp8) {
  testing::TinyShape shape;
  shape.layers = 4;
  RunConfig cfg = tiny_run(8, shape);
  const TrainResult f32 = train_on_cpu(cfg);
  cfg.train.matmul_dtype = "fp8";
  cfg.train.fp8_layers = {"qkv", "o", "gate_up", "down"};
  const TrainResult all = train_on_cpu(cfg);
  RunConfig reordered = cfg, mlp = cfg;
  mlp.train.fp8_layers = RunConfig{}.train.fp8_layers;  // the default: the MLP's two
  EXPECT_EQ(describe_fp8_layers(mlp), "gate|up, down; QKV, O in bf16");
  EXPECT_NE(describe_matmul_dtype(mlp, *make_cpu_backend()).find("; lm_head and attention in f32"), std::string::npos)
      << describe_matmul_dtype(mlp, *make_cpu_backend());
  EXPECT_EQ(describe_matmul_dtype(mlp, *make_cpu_backend()).find("rounded stochastically"), std::string::npos)
      << "the rounding named with no FP8 lm_head";
  RunConfig grads = mlp;
  grads.train.fp8_layers = {"gate_up", "down", "lm_head_grad"};  // the rounding's default: stochastic
  EXPECT_NE(describe_matmul_dtype(grads, *make_cpu_backend())
                .find("and the lm_head's input and weight gradients (e4m3 weights and activations, e5m2 gradients "
                      "(the logits' rounded stochastically)"),
            std::string::npos)
      << describe_matmul_dtype(grads, *make_cpu_backend());
  reordered.train.fp8_layers = {"down", "gate_up", "o", "qkv"};
  EXPECT_EQ(train_on_cpu(reordered).losses, all.losses);
  RunConfig down = cfg, middle = cfg;
  down.train.fp8_layers = {"down"};
  middle.train.fp8_bf16_end_blocks = 1;
  for (const RunConfig* c : {&down, &middle}) {
    const TrainResult r = train_on_cpu(*c);
    const std::string what = c == &down ? "down only" : "blocks 1-2 only";
    ASSERT_EQ(r.losses.size(), f32.losses.size());
    bool from_f32 = false, from_all = false;
    for (size_t i = 0; i < r.losses.size(); ++i) {
      EXPECT_NEAR(r.losses[i], f32.losses[i], 0.03 * f32.losses[i]) << what << ", step " << i + 1;
      from_f32 |= r.losses[i] != f32.losses[i];
      from_all |= r.losses[i] != all.losses[i];
    }
    EXPECT_TRUE(from_f32) << what << " gave f32's bits: no layer was in FP8";
    EXPECT_TRUE(from_all) << what << " gave all-FP8's bits: the choice was ignored";
  }
  auto be = make_cpu_backend();
  EXPECT_NO_THROW(check_matmul_dtype(middle, *be));
  RunConfig none = cfg, ends = cfg;
  none.train.fp8_layers = {};
  ends.train.fp8_bf16_end_blocks = 2;
  for (const RunConfig* c : {&none, &ends}) {
    try {
      check_matmul_dtype(*c, *be);
      ADD_FAILURE() << "a choice with no FP8 layer was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage);
      EXPECT_NE(std::string(e.what()).find(c == &none ? "train.fp8_layers" : "train.fp8_bf16_end_blocks=2"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(describe_fp8_layers(down), "down; QKV, O, gate|up in bf16");
  EXPECT_EQ(describe_fp8_layers(middle), "QKV, O, gate|up, down in blocks 1-2 (blocks 0 and 3 all in bf16)");
}

// train.fp8_layers naming lm_head: the lm_head's three GEMMs run in FP8 too (the loss
// casting its gradient), so the run is neither the blocks-only FP8 run nor f32, stays
// near f32, repeats bit for bit, and recompute changes no bit; the lm_head alone is a
// choice of its own; lm_head_grad (its gradients only, the logits in f32) is a third
// run, and its first step's loss is the blocks-only run's (the forward is the same);
// a vocabulary FP8 cannot take is refused, naming it.
TEST(Trainer, Fp8LmHeadIsAChoiceOfItsOwn) {
  RunConfig cfg = tiny_run(12);
  const TrainResult f32 = train_on_cpu(cfg);
  cfg.train.matmul_dtype = "fp8";
  cfg.train.fp8_layers = {"gate_up", "down"};  // the blocks' MLP only
  cfg.train.fp8_dlogits_rounding = "nearest";
  const TrainResult mlp = train_on_cpu(cfg);
  RunConfig head = cfg, only = cfg;
  head.train.fp8_layers = {"gate_up", "down", "lm_head"};
  only.train.fp8_layers = {"lm_head"};
  const TrainResult h = train_on_cpu(head), again = train_on_cpu(head), o = train_on_cpu(only);
  ASSERT_EQ(h.losses.size(), f32.losses.size());
  bool from_mlp = false, from_f32 = false;
  for (size_t i = 0; i < h.losses.size(); ++i) {
    ASSERT_TRUE(std::isfinite(h.losses[i])) << "step " << i + 1;
    EXPECT_NEAR(h.losses[i], f32.losses[i], 0.03 * f32.losses[i]) << "step " << i + 1;
    EXPECT_NEAR(o.losses[i], f32.losses[i], 0.03 * f32.losses[i]) << "lm_head only, step " << i + 1;
    EXPECT_EQ(h.losses[i], again.losses[i]) << "step " << i + 1;
    from_mlp |= h.losses[i] != mlp.losses[i];
    from_f32 |= o.losses[i] != f32.losses[i];
  }
  EXPECT_TRUE(from_mlp) << "lm_head in fp8_layers gave the blocks-only run's bits";
  EXPECT_TRUE(from_f32) << "lm_head alone gave f32's bits";
  RunConfig grads = cfg;
  grads.train.fp8_layers = {"gate_up", "down", "lm_head_grad"};
  const TrainResult g = train_on_cpu(grads);
  ASSERT_EQ(g.losses.size(), mlp.losses.size());
  EXPECT_EQ(g.losses[0], mlp.losses[0]) << "lm_head_grad changed the first forward";
  EXPECT_NE(g.losses[0], h.losses[0]) << "lm_head_grad ran the logits in FP8";
  bool from_mlp_g = false;
  for (size_t i = 0; i < g.losses.size(); ++i) {
    EXPECT_NEAR(g.losses[i], f32.losses[i], 0.03 * f32.losses[i]) << "lm_head_grad, step " << i + 1;
    from_mlp_g |= g.losses[i] != mlp.losses[i];
  }
  EXPECT_TRUE(from_mlp_g) << "lm_head_grad gave the blocks-only run's bits";
  // lm_head_fwd: the logits from FP8, their gradients in f32. Its first loss is
  // lm_head's (the same forward), then it leaves lm_head (whose gradients are FP8's);
  // with lm_head_grad beside it, it is lm_head bit for bit.
  RunConfig fwd = cfg, both = cfg;
  fwd.train.fp8_layers = {"gate_up", "down", "lm_head_fwd"};
  both.train.fp8_layers = {"gate_up", "down", "lm_head_fwd", "lm_head_grad"};
  const TrainResult fw = train_on_cpu(fwd), fb = train_on_cpu(both);
  ASSERT_EQ(fw.losses.size(), h.losses.size());
  EXPECT_EQ(fw.losses[0], h.losses[0]) << "lm_head_fwd's first forward is not lm_head's";
  EXPECT_NE(fw.losses[0], mlp.losses[0]) << "lm_head_fwd left the logits in f32";
  bool from_h = false;
  for (size_t i = 0; i < fw.losses.size(); ++i) {
    EXPECT_NEAR(fw.losses[i], f32.losses[i], 0.03 * f32.losses[i]) << "lm_head_fwd, step " << i + 1;
    EXPECT_EQ(fb.losses[i], h.losses[i]) << "lm_head_fwd + lm_head_grad, step " << i + 1;
    from_h |= fw.losses[i] != h.losses[i];
  }
  EXPECT_TRUE(from_h) << "lm_head_fwd ran the lm_head's gradients in FP8 too";
  RunConfig grads_block = grads;
  grads_block.train.recompute = "block";
  grads_block.train.steps = grads.train.steps = 3;
  const TrainResult ga = train_on_cpu(grads), gb = train_on_cpu(grads_block);
  for (size_t i = 0; i < ga.losses.size(); ++i) EXPECT_EQ(ga.losses[i], gb.losses[i]) << "grads, step " << i + 1;
  // The logits' gradient rounded stochastically: another run, near f32, repeating bit for bit.
  RunConfig sr = grads;
  sr.train.fp8_dlogits_rounding = "stochastic";
  const TrainResult s1 = train_on_cpu(sr), s2 = train_on_cpu(sr);
  ASSERT_EQ(s1.losses.size(), ga.losses.size());
  EXPECT_EQ(s1.losses, s2.losses) << "stochastic rounding did not repeat";
  EXPECT_NE(s1.losses, ga.losses) << "train.fp8_dlogits_rounding=stochastic changed nothing";
  for (size_t i = 0; i < s1.losses.size(); ++i)
    EXPECT_NEAR(s1.losses[i], f32.losses[i], 0.03 * f32.losses[i]) << "stochastic, step " << i + 1;
  RunConfig block = head;
  block.train.recompute = "block";
  block.train.steps = head.train.steps = 3;
  const TrainResult a = train_on_cpu(head), b = train_on_cpu(block);
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i + 1;
  auto be = make_cpu_backend();
  EXPECT_NE(describe_matmul_dtype(head, *be).find(" and the lm_head ("), std::string::npos)
      << describe_matmul_dtype(head, *be);
  EXPECT_NE(describe_matmul_dtype(head, *be).find("; attention in f32"), std::string::npos)
      << describe_matmul_dtype(head, *be);
  EXPECT_NE(describe_matmul_dtype(grads, *be).find("and the lm_head's input and weight gradients ("),
            std::string::npos)
      << describe_matmul_dtype(grads, *be);
  EXPECT_NE(describe_matmul_dtype(grads, *be).find("; the lm_head's forward and attention in f32"), std::string::npos)
      << describe_matmul_dtype(grads, *be);
  EXPECT_NE(describe_matmul_dtype(cfg, *be).find("; lm_head and attention in f32"), std::string::npos)
      << describe_matmul_dtype(cfg, *be);
  EXPECT_NE(describe_matmul_dtype(fwd, *be).find(" and the lm_head's forward (the logits) ("), std::string::npos)
      << describe_matmul_dtype(fwd, *be);
  EXPECT_NE(describe_matmul_dtype(fwd, *be).find("; the lm_head's gradients and attention in f32"), std::string::npos)
      << describe_matmul_dtype(fwd, *be);
  EXPECT_NE(describe_matmul_dtype(both, *be).find(" and the lm_head ("), std::string::npos)
      << describe_matmul_dtype(both, *be);
  EXPECT_EQ(describe_fp8_layers(only), "none (QKV, O, gate|up, down in bf16)");
  RunConfig odd = head;
  odd.model.vocab_size = 250;
  try {
    check_matmul_dtype(odd, *be);
    ADD_FAILURE() << "vocab 250 with an FP8 lm_head was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("vocab_size"), std::string::npos) << e.what();
  }
  odd.train.fp8_layers = {"gate_up", "down", "lm_head_grad"};
  EXPECT_THROW(check_matmul_dtype(odd, *be), Error) << "vocab 250 with the lm_head's gradients in FP8";
  odd.train.fp8_layers = {"gate_up", "down", "lm_head_fwd"};
  EXPECT_THROW(check_matmul_dtype(odd, *be), Error) << "vocab 250 with the lm_head's forward in FP8";
  odd.train.fp8_layers = {"gate_up", "down"};
  EXPECT_NO_THROW(check_matmul_dtype(odd, *be)) << "the vocabulary matters only to an FP8 lm_head";
}

// optim.state_dtype / optim.master_dtype = bf16 (stochastic rounding): the run learns,
// stays near the f32 run, and repeats bit for bit; train.offload streams the state
// through staging buffers and changes no bit, with either dtype.
TEST(Trainer, Bf16StateAndMasterTrainNearTheF32Run) {
  RunConfig cfg = tiny_run(30);
  const TrainResult f32 = train_on_cpu(cfg);
  for (const char* which : {"state", "both"}) {
    RunConfig c = cfg;
    c.optim.state_dtype = "bf16";
    if (std::string(which) == "both") c.optim.master_dtype = "bf16";
    const TrainResult a = train_on_cpu(c), b = train_on_cpu(c);
    bool differs = false;
    for (size_t i = 0; i < f32.losses.size(); ++i) {
      ASSERT_TRUE(std::isfinite(a.losses[i])) << which << ", step " << i + 1;
      EXPECT_NEAR(a.losses[i], f32.losses[i], 0.03 * f32.losses[i]) << which << ", step " << i + 1;
      EXPECT_EQ(a.losses[i], b.losses[i]) << which << ", step " << i + 1;
      differs |= a.losses[i] != f32.losses[i];
    }
    EXPECT_TRUE(differs) << which << ": bf16 gave the f32 run's bits";
    EXPECT_LT(a.losses.back(), a.losses.front() - 0.5) << which;
  }
}

TEST(Trainer, OffloadChangesNoBit) {
  for (const char* dtype : {"fp32", "bf16"}) {
    RunConfig cfg = tiny_run(6);
    cfg.optim.state_dtype = cfg.optim.master_dtype = dtype;
    const TrainResult want = train_on_cpu(cfg);
    for (const char* offload : {"optimizer", "optimizer+master"}) {
      RunConfig c = cfg;
      c.train.offload = offload;
      FsdpMemory mem;
      const TrainResult got = train_on_cpu(c, [&](Trainer& t) { mem = t.params().memory(); });
      for (size_t i = 0; i < want.losses.size(); ++i) {
        EXPECT_EQ(got.losses[i], want.losses[i]) << dtype << " " << offload << ", step " << i + 1;
        EXPECT_EQ(got.grad_norms[i], want.grad_norms[i]) << dtype << " " << offload << ", step " << i + 1;
      }
      // The offloaded state is counted on the host side, its staging on the device.
      const size_t per = std::string(dtype) == "bf16" ? 2 : 4;
      const size_t shard = mem.grad_bytes / 4;
      EXPECT_EQ(mem.optimizer_bytes, 0u) << offload;
      EXPECT_EQ(mem.host_bytes, shard * per * (std::string(offload) == "optimizer" ? 2 : 3)) << offload;
      EXPECT_GT(mem.staging_bytes, 0u) << offload;
    }
  }
}

TEST(Trainer, GradientAccumulationEqualsOneLargeBatch) {
  RunConfig big = tiny_run(5);
  RunConfig accum = big;
  accum.train.micro_batch = 2;
  accum.train.grad_accum = 4;
  const TrainResult a = train_on_cpu(big), b = train_on_cpu(accum);
  for (size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_NEAR(a.losses[i], b.losses[i], 1e-5 * a.losses[i]) << "step " << i + 1;
}

TEST(Trainer, TrainingOnTheBuiltInCorpusLowersTheLoss) {
  RunConfig cfg = tiny_run(60);
  cfg.optim.lr = 3e-3;
  const TrainResult r = train_on_cpu(cfg);
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
    RunConfig cfg = tiny_run(1);
    cfg.data.source = "random";
    cfg.optim.grad_clip = clip;
    double used = 0;
    const TrainResult r =
        train_on_cpu(cfg, [&](Trainer& t) { used = first_moment_norm(t.params()) / (1 - cfg.optim.beta1); });
    EXPECT_NEAR(r.losses.front(), std::log(256.0), 0.3);
    const double norm = r.grad_norms.front();
    ASSERT_GT(norm, 1e-3);
    const double want = clip > 0 && norm > clip ? clip : norm;
    EXPECT_NEAR(used, want, 1e-5 * want) << "grad_clip " << clip << ", gradient norm " << norm;
  }
}

// The estimate the memory check makes before anything exists: activations exactly as
// the model allocates them, and a total no larger than what a run holds.
TEST(MemoryCheck, ActivationEstimateIsWhatTheModelAllocates) {
  testing::TinyShape three;
  three.layers = 3;  // so that bf16_end_blocks = 1 leaves one FP8 block between two bf16 ones
  const ModelConfig m = tiny_run(1, three).model;
  const ParamLayout layout(m);
  auto be = make_cpu_backend();
  for (const std::string& choice : recompute_choices())
    for (DType dt : {DType::F32, DType::F64})
      for (int chunk : {0, 5}) {
        const Qwen2Model model(layout, *be, dt, 3, 7, chunk, parse_recompute(choice));
        EXPECT_EQ(Qwen2Model::activation_bytes_for(m, dt, 3, 7, chunk, parse_recompute(choice)), model.activation_bytes())
            << choice << " " << dtype_name(dt) << " chunk " << chunk;
        // FP8's scratch and kept transposes too (at a shape it can run: 4 x 8 tokens): every
        // kind, the default (the MLP's), and the first and last block in bf16.
        for (const Fp8Options& o : {Fp8Options{.on = true}, Fp8Options{.on = true, .kinds = 0b1100},
                                    Fp8Options{.on = true, .kinds = 0b0101, .bf16_end_blocks = 1},
                                    Fp8Options{.on = true, .kinds = 0b11100},
                                    Fp8Options{.on = true, .kinds = 0b101100},     // lm_head_grad
                                    Fp8Options{.on = true, .kinds = 0b1001100}}) {  // lm_head_fwd
          if (o.lm_head_any() && chunk % 16 != 0) {  // an FP8 lm_head takes the logits 16 rows at a time at least
            EXPECT_THROW(Qwen2Model(layout, *be, dt, 4, 8, chunk, parse_recompute(choice), o), Error);
            continue;
          }
          const Qwen2Model fp8(layout, *be, dt, 4, 8, chunk, parse_recompute(choice), o);
          EXPECT_EQ(Qwen2Model::activation_bytes_for(m, dt, 4, 8, chunk, parse_recompute(choice), o),
                    fp8.activation_bytes())
              << "fp8 kinds " << o.kinds << " ends " << o.bf16_end_blocks << " " << choice << " "
              << dtype_name(dt) << " chunk " << chunk;
        }
      }
}

TEST(MemoryCheck, EstimateIsALowerBoundOfTheRun) {
  const RunConfig cfg = tiny_run(1);
  auto be = make_cpu_backend();
  ProcessGroups groups = make_single_process_groups(*be);
  Trainer t(cfg, *be, groups);
  const MemoryEstimate e = estimate_rank_memory(cfg, DType::F32, 1, true, be->workspace_bytes());
  EXPECT_GT(e.parameters, 16u * static_cast<uint64_t>(cfg.model.num_params()) - 1);
  EXPECT_GT(e.activations, 0u);
  EXPECT_EQ(e.gathered, 0u);  // one rank reads its shards in place
  // The memory table counts the backend's memory (no token ids): the device part.
  EXPECT_LE(e.device(), t.estimated_peak_bytes());
  EXPECT_GE(e.device(), t.estimated_peak_bytes() * 9 / 10);  // and not far below it
  EXPECT_EQ(e.batches, 8u * 32 * 8);  // inputs and targets of one micro-batch of 8 x 32
  // Sharded over 4, each rank holds a quarter of the state and gathers a unit.
  const MemoryEstimate s = estimate_rank_memory(cfg, DType::F32, 4, false, 0);
  EXPECT_LE(s.parameters, e.parameters / 4 + 16);
  EXPECT_GT(s.gathered, 0u);
  // bf16 compute keeps a bf16 copy of the shard: 18 bytes per parameter.
  EXPECT_EQ(estimate_rank_memory(cfg, DType::BF16, 1, true, 0).parameters, 18u * cfg.model.num_params());
}

// Bad inputs (a missing data path, a model directory that is not there) are refused
// before the shards or the activations are allocated.
TEST(MemoryCheck, BadInputsAreRefusedBeforeTheModelIsAllocated) {
  for (int which = 0; which < 2; ++which) {
    RunConfig cfg = tiny_run(1);
    if (which == 0) {
      cfg.data.source = "text";
      cfg.data.paths = {"/nonexistent/corpus"};
    } else {
      cfg.data.source = "random";
      cfg.model_options.init_from = "/nonexistent/model";
    }
    auto be = make_cpu_backend();
    ProcessGroups groups = make_single_process_groups(*be);
    try {
      Trainer t(cfg, *be, groups);
      FAIL() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Data) << e.what();
    }
    EXPECT_EQ(be->peak_allocated_bytes(), 0u) << (which == 0 ? "data.paths" : "model.init_from");
  }
}

// A model far larger than any machine is refused by the check, which allocates nothing,
// naming the estimate and the limit; saturating arithmetic, no overflow.
TEST(MemoryCheck, RefusesWhatCannotFitBeforeAllocating) {
  RunConfig cfg = tiny_run(1);
  cfg.model = model_preset("qwen2.5-7b");
  cfg.model.num_layers = 100000;
  auto be = make_cpu_backend();
  ASSERT_GT(be->memory_available_bytes(), 0u);
  try {
    check_rank_memory(cfg, *be, 1, true, 1);
    FAIL() << "not refused";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("not enough memory for model qwen2.5-7b"), std::string::npos) << msg;
    EXPECT_NE(msg.find("lower bound"), std::string::npos) << msg;
    EXPECT_NE(msg.find("host RAM (MemAvailable) has"), std::string::npos) << msg;
    EXPECT_NE(msg.find("train.micro_batch 8 x train.seq_len 32"), std::string::npos) << msg;
    EXPECT_EQ(e.kind(), ErrorKind::Runtime);
  }
  EXPECT_EQ(be->peak_allocated_bytes(), 0u);
  // Two CPU ranks on one host need twice what one does.
  cfg = tiny_run(1);
  const uint64_t one = estimate_rank_memory(cfg, DType::F32, 1, true, 0).total();
  EXPECT_NO_THROW(check_rank_memory(cfg, *be, 1, true, 2));
  EXPECT_GT(one, 0u);
  // The host's share: a step's micro-batches of token ids (once a bad_alloc at 2^31 - 1).
  cfg.train.grad_accum = 2147483647;
  try {
    check_rank_memory(cfg, *be, 1, true, 1);
    FAIL() << "not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token ids"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("train.grad_accum 2147483647"), std::string::npos) << e.what();
  }
  EXPECT_EQ(estimate_rank_memory(cfg, DType::F32, 1, true, 0).batches, 2147483647ull * 8 * 32 * 8);
  cfg.train.grad_accum = 1;
  // A checkpointing run keeps a host copy of its shards; a run from init_from loads the model in fp32.
  cfg.run.checkpoint_every = 10;
  cfg.model_options.init_from = "some/dir";
  const MemoryEstimate h = estimate_rank_memory(cfg, DType::BF16, 2, false, 0);
  EXPECT_EQ(h.checkpoint, 12u * ((cfg.model.num_params() + 1) / 2));
  EXPECT_EQ(h.loaded, 4u * cfg.model.num_params());
  EXPECT_EQ(h.total(), h.device() + h.host());
  // The largest dimensions validation lets through still estimate without overflow.
  cfg.model.hidden_size = cfg.model.intermediate_size = 1 << 29;
  cfg.model.num_heads = cfg.model.num_kv_heads = 1 << 20;
  cfg.model.num_layers = (1 << 30);
  cfg.model.vocab_size = 1 << 30;
  EXPECT_EQ(estimate_rank_memory(cfg, DType::F32, 1, true, 0).total(), UINT64_MAX);
  EXPECT_THROW(check_rank_memory(cfg, *be, 1, true, 1), Error);
}

}  // namespace
}  // namespace st

// Real processes over loopback TCP (Gloo): the same global batch trained on 1, 2 and
// 4 ranks, and HSDP 2x2, gives the same loss curve and the same final parameters;
// failures (a rank that dies, a rank that never comes) end the run with a clear
// message instead of a hang.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/model_config.h"
#include "core/collective.h"
#include "fsdp/shard_plan.h"
#include "io/safetensors.h"
#include "model/layout.h"
#include "model/qwen2.h"
#include "metrics/metrics.h"
#include "support/files.h"
#include "support/fork_ranks.h"
#include "support/metrics_jsonl.h"
#include "support/shell.h"
#include "support/temp_dir.h"

namespace {
namespace fs = std::filesystem;

using st::testing::fresh_path;
using st::testing::step_losses;
using st::testing::temp_path;

using Result = st::testing::ShellResult;
Result sh(const std::string& cmd) { return st::testing::run_shell(cmd); }

// Port k of this test process: one the kernel had free when first asked for, the same
// on every later call. (A fixed range of ports, 20000 + pid-dependent, once collided
// with the kernel's ephemeral ports, 32768-60999, which other tests' connections hold.)
int port(int k) {
  static std::map<int, int> ports;
  auto it = ports.find(k);
  if (it == ports.end()) it = ports.emplace(k, st::test::free_port()).first;
  return it->second;
}

const std::string kModel =
    " --model.preset=tiny --model.layers=2 --model.hidden_size=64 --model.intermediate_size=128"
    " --train.seq_len=32 --optim.warmup_steps=5 --run.progress=off --dist.timeout_s=60";

// Trains 20 steps of a 16-sequence global batch on `nproc` ranks, `accum` micro-batches
// per step.
// `master_port` (when given) instead of port(k).
std::vector<double> train(const std::string& name, int nproc, int k, const std::string& extra = "", int accum = 1,
                          int master_port = 0) {
  const fs::path out = fresh_path(name);
  const int micro = 16 / nproc / accum;
  const std::string cmd = std::string(SHARDTRAIN_BINARY) + " launch --nproc-per-node " + std::to_string(nproc) +
                          " --master-port " + std::to_string(master_port ? master_port : port(k)) + " -- train" + kModel +
                          " --train.steps=20 --train.micro_batch=" + std::to_string(micro) + " --run.out_dir=" +
                          out.string() + " --run.export_dir=" + (out / "model").string() +
                          " --run.export_dtype=f32" + extra;
  const Result r = sh(cmd);
  EXPECT_EQ(r.code, 0) << r.out;
  return step_losses(out / "metrics.jsonl");
}

void expect_same_curve(const std::vector<double>& a, const std::vector<double>& b, const std::string& what) {
  ASSERT_EQ(a.size(), 20u) << what;
  ASSERT_EQ(b.size(), 20u) << what;
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_LE(std::abs(a[i] - b[i]), 1e-5 * std::abs(a[i])) << what << " step " << i + 1 << ": " << a[i] << " vs " << b[i];
}

void expect_same_params(const std::string& a, const std::string& b) {
  const auto x = st::SafetensorsSet::open((temp_path(a) / "model").string());
  const auto y = st::SafetensorsSet::open((temp_path(b) / "model").string());
  ASSERT_EQ(x.names(), y.names());
  for (const std::string& name : x.names()) {
    const auto u = x.read_f32(name), v = y.read_f32(name);
    double diff = 0, scale = 0;
    for (size_t i = 0; i < u.size(); ++i) {
      diff = std::max(diff, static_cast<double>(std::abs(u[i] - v[i])));
      scale = std::max(scale, static_cast<double>(std::abs(u[i])));
    }
    EXPECT_LE(diff, 1e-4 * scale) << a << " vs " << b << ": " << name;
  }
}

TEST(MultiRankTraining, SameGlobalBatchSameCurveAtAnyWorldSize) {
  const auto one = train("w1", 1, 0);
  const auto two = train("w2", 2, 1);
  const auto four = train("w4", 4, 2);
  const auto hsdp = train("hsdp", 4, 3, " --dist.shard_group_size=2");
  // Accumulation (the replicas sum once per step) and gathered weights kept to backward.
  const auto hsdp_accum = train("hsdp_accum", 4, 6, " --dist.shard_group_size=2 --train.grad_accum=2", 2);
  const auto two_keep = train("w2_keep", 2, 7, " --dist.reshard_after_forward=false");
  expect_same_curve(one, two, "1 vs 2 ranks");
  expect_same_curve(one, four, "1 vs 4 ranks");
  expect_same_curve(one, hsdp, "1 rank vs HSDP 2x2");
  expect_same_params("w1", "w2");
  expect_same_params("w1", "w4");
  expect_same_params("w1", "hsdp");
  expect_same_curve(one, hsdp_accum, "1 rank vs HSDP 2x2 with 2 micro-batches per step");
  expect_same_curve(one, two_keep, "1 rank vs 2 ranks without resharding after forward");
  expect_same_params("w1", "hsdp_accum");
  expect_same_params("w1", "w2_keep");
  ASSERT_FALSE(one.empty());
  EXPECT_LT(one.back(), one.front());
}

// The rank-0 step records of a run trained by train().
std::map<int64_t, nlohmann::json> records(const std::string& name) {
  return st::testing::step_records(temp_path(name) / "metrics.jsonl");
}

// dist.reduce_dtype = bf16: the gradients travel in bf16, so every step's counted
// reduce-scatter bytes are half of fp32's (the all-gathers are unchanged), and with
// HSDP so are the replicas' all-reduces (beside the few scalar ones); the run trains,
// close to the fp32 curve (losses, gradient norms) but not equal to it.
TEST(MultiRankTraining, Bf16GradientReductionHalvesTheBytesAndTrains) {
  const auto fp32 = train("rd_fp32", 2, 0, " --train.seed=7", 1, st::test::free_port());
  const auto bf16 = train("rd_bf16", 2, 0, " --train.seed=7 --dist.reduce_dtype=bf16", 1, st::test::free_port());
  const std::string hsdp = " --train.seed=7 --dist.shard_group_size=2 --train.grad_accum=2";
  const auto hsdp32 = train("rd_hsdp32", 4, 0, hsdp, 2, st::test::free_port());
  const auto hsdp16 = train("rd_hsdp16", 4, 0, hsdp + " --dist.reduce_dtype=bf16", 2, st::test::free_port());
  for (const auto& [a, b, what] : {std::tuple{&fp32, &bf16, "FSDP 2"}, std::tuple{&hsdp32, &hsdp16, "HSDP 2x2"}}) {
    ASSERT_EQ(a->size(), 20u) << what;
    ASSERT_EQ(b->size(), 20u) << what;
    EXPECT_EQ((*a)[0], (*b)[0]) << what << ": step 1's loss comes before any reduction";
    EXPECT_NE(*a, *b) << what << ": bf16 reductions changed nothing";
    for (size_t i = 0; i < a->size(); ++i)
      EXPECT_LE(std::abs((*a)[i] - (*b)[i]), 0.02 * (*a)[i]) << what << " step " << i + 1;
    EXPECT_LT(b->back(), b->front() - 0.5) << what << ": bf16 did not train";
  }
  for (const auto& [full, half, what] :
       {std::tuple{"rd_fp32", "rd_bf16", "FSDP 2"}, std::tuple{"rd_hsdp32", "rd_hsdp16", "HSDP 2x2"}}) {
    const auto x = records(full), y = records(half);
    ASSERT_EQ(x.size(), 20u) << what;
    ASSERT_EQ(y.size(), 20u) << what;
    for (const auto& [step, r] : x) {
      const auto& h = y.at(step);
      const uint64_t rs = r["comm_reduce_scatter_bytes"], rs_half = h["comm_reduce_scatter_bytes"];
      EXPECT_GT(rs, 0u) << what;
      EXPECT_EQ(rs_half * 2, rs) << what << " step " << step;
      EXPECT_EQ(h["comm_all_gather_bytes"], r["comm_all_gather_bytes"]) << what << " step " << step;
      // The gradient each step is fp32's within bf16's rounding (a replica sum added
      // twice, say, would be far off).
      const double norm = r["grad_norm"], norm_half = h["grad_norm"];
      EXPECT_LE(std::abs(norm_half - norm), 0.01 * norm) << what << " step " << step;
      // all-reduce = the replicas' gradients + scalars (loss, tokens, norm, stop flag),
      // the same in both runs: fp32 = g + s, bf16 = g/2 + s.
      const int64_t ar = r["comm_all_reduce_bytes"], ar_half = h["comm_all_reduce_bytes"];
      const int64_t scalars = 2 * ar_half - ar;
      EXPECT_GE(scalars, 0) << what << " step " << step;
      EXPECT_LT(scalars, 256) << what << " step " << step;
      if (std::string(what) == "HSDP 2x2") EXPECT_GT(ar - ar_half, 1000) << what << ": no gradient all-reduce halved";
    }
  }
}

// train.matmul_dtype = fp8 (the CPU's exact emulation) under FSDP over 2 ranks and HSDP
// 2x2, every layer kind and the lm_head's gradients in FP8: each rank casts its own
// activations and gradients (its half of the batch; the delayed scales come from the
// amax of all ranks, but the first step's and the lm_head's from its own), so the curve
// is not one rank's bit for bit, but follows it within 0.5% at every step. With
// dist.fp8_gather=false the weights travel as they do without FP8 (gathered in the
// compute dtype, then cast), so every step's gathered and reduced bytes are those of
// the same run in f32.
TEST(MultiRankTraining, Fp8UnderFsdpAndHsdpFollowsOneRank) {
  const std::string fp8 = " --train.seed=11 --train.matmul_dtype=fp8 --train.fp8_layers=qkv,o,gate_up,down,lm_head_grad";
  const auto one = train("fp8_w1", 1, 0, fp8, 1, st::test::free_port());
  const auto two = train("fp8_w2", 2, 0, fp8, 1, st::test::free_port());
  const auto hsdp = train("fp8_hsdp", 4, 0, fp8 + " --dist.shard_group_size=2", 1, st::test::free_port());
  const auto f32 = train("fp8_f32_w2", 2, 0, " --train.seed=11", 1, st::test::free_port());
  const auto two_cast = train("fp8_w2_cast", 2, 0, fp8 + " --dist.fp8_gather=false", 1, st::test::free_port());
  ASSERT_EQ(one.size(), 20u);
  for (const auto& [run, what] : {std::pair{&two, "FSDP 2"}, std::pair{&hsdp, "HSDP 2x2"}}) {
    ASSERT_EQ(run->size(), 20u) << what;
    for (size_t i = 0; i < one.size(); ++i)
      EXPECT_LE(std::abs((*run)[i] - one[i]), 0.005 * one[i]) << what << " step " << i + 1;
    EXPECT_LT(run->back(), run->front() - 0.5) << what << ": did not train";
  }
  EXPECT_NE(two, f32) << "FP8 gave the f32 run's losses: nothing was quantized";
  EXPECT_EQ(two, two_cast) << "the FP8 weights gathered as codes changed the training";
  const auto x = records("fp8_w2_cast"), y = records("fp8_f32_w2");
  ASSERT_EQ(x.size(), 20u);
  ASSERT_EQ(y.size(), 20u);
  for (const auto& [step, r] : x) {
    EXPECT_GT(r["comm_all_gather_bytes"].get<uint64_t>(), 0u);
    EXPECT_EQ(r["comm_all_gather_bytes"], y.at(step)["comm_all_gather_bytes"]) << "step " << step;
    EXPECT_EQ(r["comm_reduce_scatter_bytes"], y.at(step)["comm_reduce_scatter_bytes"]) << "step " << step;
  }
}

// What rank 0 of a shard group of W sends for one step's block all-gathers (two per
// block: forward and backward) with dist.fp8_gather less than without, for kModel with
// the MLP in FP8: the ring passes on every part but its successor's (rank 1's), each
// rank's slice of the part before the MLP in the compute dtype (f32 on the CPU) and of
// the MLP as one-byte codes, one run of bytes with the gap that aligns the codes,
// where without it every part is a whole shard of f32.
uint64_t fp8_gather_saving(int W) {
  st::ModelConfig c = st::model_preset("tiny");
  c.num_layers = 2, c.hidden_size = 64, c.intermediate_size = 128;
  const st::ParamLayout layout(c);
  const st::ShardPlan plan(layout, W);
  st::Fp8Options o;
  o.on = true;
  const auto spans = st::Qwen2Model::fp8_gather_spans(layout, o);
  uint64_t saved = 0;
  for (int u = 0; u < layout.num_units(); ++u) {
    if (spans[u].empty()) continue;
    const size_t from = spans[u].front().offset;
    uint64_t with = 0;
    for (int q = 0; q < W; ++q) {
      if (q == 1 % W) continue;
      const st::ElemRange v = plan.valid_range_of(u, q);
      with += st::fp8_gather_byte(v.end, from, 4) - st::fp8_gather_byte(v.begin, from, 4);
    }
    saved += 2 * (4 * (W - 1) * plan.shard_numel(u) - with);
  }
  return saved;
}

// dist.fp8_gather (on by default): the MLP's FP8 weights all-gathered as e4m3 codes that
// each rank casts from its own part with the scale agreed from every rank's amax are
// the codes each rank would cast from the gathered weights, so FSDP over 2 ranks and
// HSDP 2x2 train the same curve bit for bit with and without it, the reductions
// unchanged, while every step's all-gathers send exactly the bytes the shard plan says
// fewer, over 2 and 4 ranks (at 4 this model's attention, a third of a block, fills
// the first rank's part). Attention alone in FP8 has no FP8 tail: nothing changes.
TEST(MultiRankTraining, Fp8GatherChangesNoBitAndSendsTheMlpAsBytes) {
  const std::string fp8 = " --train.seed=13 --train.matmul_dtype=fp8";
  for (const auto& [nproc, extra, W] : {std::tuple{2, std::string(), 2}, std::tuple{4, std::string(), 4},
                                        std::tuple{4, std::string(" --dist.shard_group_size=2"), 2}}) {
    const std::string what = std::to_string(nproc) + " ranks" + extra;
    const auto cast = train("fp8g_cast", nproc, 0, fp8 + extra + " --dist.fp8_gather=false", 1, st::test::free_port());
    const auto codes = train("fp8g_codes", nproc, 0, fp8 + extra, 1, st::test::free_port());
    ASSERT_EQ(codes.size(), 20u) << what;
    EXPECT_EQ(codes, cast) << what;
    const auto x = records("fp8g_cast"), y = records("fp8g_codes");
    ASSERT_EQ(y.size(), 20u) << what;
    const uint64_t saving = fp8_gather_saving(W);
    EXPECT_GT(saving, 0u) << what;
    for (const auto& [step, r] : x) {
      const uint64_t a = r["comm_all_gather_bytes"], b = y.at(step)["comm_all_gather_bytes"];
      EXPECT_EQ(a - b, saving) << what << " step " << step << ": " << a << " vs " << b;
      EXPECT_EQ(r["comm_reduce_scatter_bytes"], y.at(step)["comm_reduce_scatter_bytes"]) << what << " step " << step;
    }
  }
  const std::string attn = fp8 + " --train.fp8_layers=qkv,o";
  const auto cast = train("fp8g_attn_cast", 2, 0, attn + " --dist.fp8_gather=false", 1, st::test::free_port());
  const auto codes = train("fp8g_attn", 2, 0, attn, 1, st::test::free_port());
  EXPECT_EQ(codes, cast);
  const auto x = records("fp8g_attn_cast"), y = records("fp8g_attn");
  for (const auto& [step, r] : x) EXPECT_EQ(r["comm_all_gather_bytes"], y.at(step)["comm_all_gather_bytes"]);
}

// FP8 with delayed scaling over 2 ranks: the ranks agree on every step's amax (the
// largest of either, Comm::all_reduce_max), so the one history a checkpoint saves is
// each rank's own, and a run resumed from step 10 repeats steps 11-20 of the
// uninterrupted one bit for bit.
TEST(MultiRankTraining, Fp8DelayedScalingResumesBitForBitOnTwoRanks) {
  const std::string fp8 = " --train.seed=5 --train.matmul_dtype=fp8 --train.fp8_scaling=delayed"
                          " --train.fp8_layers=qkv,o,gate_up,down --run.checkpoint_every=10";
  const auto straight = train("fp8_resume_ref", 2, 0, fp8, 1, st::test::free_port());
  const fs::path step10 = temp_path("fp8_resume_ref") / "checkpoints" / "step-10";
  const auto resumed = train("fp8_resume", 2, 0, fp8 + " --run.resume=" + step10.string(), 1, st::test::free_port());
  ASSERT_EQ(straight.size(), 20u);
  ASSERT_EQ(resumed.size(), 10u);
  for (size_t i = 0; i < resumed.size(); ++i) EXPECT_EQ(resumed[i], straight[10 + i]) << "step " << 11 + i;
}

// Two pods of a Kubernetes Indexed Job, one rank each, started as the kubelet would
// (no launcher): each finds its rank in JOB_COMPLETION_INDEX, and together they train
// the same curve as one rank does.
TEST(MultiRankTraining, KubernetesIndexedJobPodsTrainTogether) {
  const auto one = train("k8s_w1", 1, 8);
  const fs::path out = fresh_path("k8s_pods");
  fs::create_directories(out);
  auto pod = [&](int index) {
    const std::string i = std::to_string(index);
    return "JOB_COMPLETION_INDEX=" + i + " SHARDTRAIN_NNODES=2 HOSTNAME=qwen-" + i +
           " SHARDTRAIN_SERVICE=qwen MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port(9)) + " " +
           SHARDTRAIN_BINARY + " train" + kModel + " --train.steps=20 --train.micro_batch=8 --run.out_dir=" +
           (out / ("pod" + i)).string();
  };
  const Result r = sh("(" + pod(1) + " > " + (out / "pod1.log").string() + " 2>&1; echo $? > " +
                      (out / "pod1.rc").string() + ") & " + pod(0) + "; rc=$?; wait; exit $rc");
  EXPECT_EQ(r.code, 0) << r.out;
  std::ifstream rc(out / "pod1.rc");
  int code = -1;
  rc >> code;
  EXPECT_EQ(code, 0) << st::testing::read_file(out / "pod1.log");
  expect_same_curve(one, step_losses(out / "pod0" / "metrics.jsonl"), "1 rank vs 2 Indexed Job pods");
}

// torchelastic's rule: rank 1 is SIGKILLed after step 13 (a test-only fault hook); the
// launcher stops both, starts both again, they resume from a checkpoint (step 5 is
// complete by then: the save of step 10 waits for it) and
// end with the loss of an uninterrupted run, bit for bit.
TEST(MultiRankTraining, RestartAfterARankIsKilledEndsWithTheSameLoss) {
  const auto straight = train("restart_ref", 2, 10, " --run.checkpoint_every=5");
  const int restart_port = st::test::free_port();  // the kernel's: no overlap with other tests' ranges
  auto command = [&](const fs::path& out, int restarts) {
    return std::string("SHARDTRAIN_TEST_FAULT=1:13:") + temp_path("restart_marker").string() + " " + SHARDTRAIN_BINARY +
           " launch --nproc-per-node 2 --max-restarts " + std::to_string(restarts) + " --master-port " +
           std::to_string(restart_port) + " -- train" + kModel +
           " --train.steps=20 --train.micro_batch=8 --run.checkpoint_every=5 --run.out_dir=" + out.string();
  };
  const fs::path out = fresh_path("restart");
  fs::remove(temp_path("restart_marker"));
  const Result r = sh(command(out, 1));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("launch: restart 1 of 1 after rank 1 was killed by signal 9"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("resumed: "), std::string::npos) << r.out;
  const auto resumed = step_losses(out / "metrics.jsonl");  // appended: steps 1-13, then from the checkpoint on
  ASSERT_FALSE(resumed.empty());
  ASSERT_EQ(straight.size(), 20u);
  EXPECT_EQ(resumed.back(), straight.back());
  // Without restarts the same fault ends the launch, naming the rank.
  fs::remove(temp_path("restart_marker"));
  const Result once = sh(command(fresh_path("restart_once"), 0));
  EXPECT_NE(once.code, 0) << once.out;
  EXPECT_NE(once.out.find("rank 1 was killed by signal 9"), std::string::npos) << once.out;
}

// A rank that fails on its configuration (exit 2) or its input files (exit 3) would fail
// the same way after a restart: the launcher says so and exits with that code at once.
TEST(MultiRankTraining, NoRestartAfterAConfigurationOrDataError) {
  const std::string launch = std::string(SHARDTRAIN_BINARY) + " launch --nproc-per-node 2 --max-restarts 3 --master-port " +
                             std::to_string(st::test::free_port()) + " -- train" + kModel + " --train.steps=2";
  const Result bad_key = sh(launch + " --train.micro_batch=0 --run.out_dir=" + fresh_path("norestart_usage").string());
  EXPECT_EQ(bad_key.code, 2) << bad_key.out;
  EXPECT_NE(bad_key.out.find("not restarting"), std::string::npos) << bad_key.out;
  EXPECT_NE(bad_key.out.find("a usage or configuration error"), std::string::npos) << bad_key.out;
  EXPECT_EQ(bad_key.out.find("restart 1 of 3"), std::string::npos) << bad_key.out;
  // A prepared folder whose index.json is cut short (the run directory beside it, so
  // that making one does not remove the other).
  const fs::path base = fresh_path("norestart_data"), tokens = base / "shards";
  fs::create_directories(tokens);
  { std::ofstream(tokens / "index.json") << "{\"version\": 1, \"shards\": ["; }
  const Result bad_data = sh(launch + " --data.source=tokens --data.paths=" + tokens.string() +
                             " --run.out_dir=" + (base / "run").string());
  EXPECT_EQ(bad_data.code, 3) << bad_data.out;
  EXPECT_NE(bad_data.out.find("index.json"), std::string::npos) << bad_data.out;
  EXPECT_NE(bad_data.out.find("an error in input data or model files"), std::string::npos) << bad_data.out;
  EXPECT_EQ(bad_data.out.find("restart 1 of 3"), std::string::npos) << bad_data.out;
}

// Shell that waits (up to a minute) until the run in `out` has logged a step, so that a
// signal sent next arrives mid-run however slow the machine's set-up is.
std::string once_training(const fs::path& out) {
  return "for i in $(seq 600); do grep -qs '\"step\"' " + (out / "metrics.jsonl").string() +
         " && break; sleep 0.1; done;";
}

// SIGTERM mid-run (what Kubernetes sends): the ranks stop at the next step, save a
// checkpoint, write an "interrupted" summary and exit 143; the same command continues.
TEST(MultiRankTraining, SigtermLeavesACheckpointAndAnInterruptedSummary) {
  const fs::path out = fresh_path("sigterm");
  const std::string cmd = std::string(SHARDTRAIN_BINARY) + " launch --nproc-per-node 2 --master-port " +
                          std::to_string(st::test::free_port()) + " -- train" + kModel +
                          " --train.steps=100000 --train.micro_batch=8 --run.checkpoint_every=1000 --run.out_dir=" +
                          out.string();
  const Result r = sh("{ " + cmd + " & pid=$!; " + once_training(out) + " kill -TERM $pid; wait $pid; }");
  EXPECT_EQ(r.code, 143) << r.out;
  EXPECT_NE(r.out.find("interrupted by signal 15"), std::string::npos) << r.out;
  std::ifstream in(out / "summary.json");
  const auto summary = nlohmann::json::parse(in);
  EXPECT_TRUE(summary["interrupted"].get<bool>()) << summary;
  const int done = summary["steps_done"];
  EXPECT_GT(done, 0);
  EXPECT_TRUE(fs::exists(out / "checkpoints" / ("step-" + std::to_string(done)) / "manifest.json")) << summary;
}

// A save that cannot finish within run.term_grace_s (a slow disk, simulated by a
// test-only delay in the writer): the run exits 143 when the grace period is over,
// saying so, and leaves no complete checkpoint that resume=auto could take.
TEST(MultiRankTraining, ASaveSlowerThanTheGracePeriodIsAbandoned) {
  const fs::path out = fresh_path("grace");
  const std::string cmd = std::string("SHARDTRAIN_TEST_SAVE_DELAY_S=60 ") + SHARDTRAIN_BINARY + " train" + kModel +
                          " --train.steps=100000 --train.micro_batch=8 --run.checkpoint_every=100000"
                          " --run.term_grace_s=2 --run.out_dir=" + out.string();
  const Result r = sh("{ " + cmd + " & pid=$!; " + once_training(out) + " kill -TERM $pid; wait $pid; }");
  EXPECT_EQ(r.code, 143) << r.out;
  EXPECT_NE(r.out.find("run.term_grace_s = 2 s passed since signal 15"), std::string::npos) << r.out;
  EXPECT_LT(r.seconds, 30) << r.out;
  EXPECT_FALSE(fs::exists(out / "checkpoints" / "latest")) << r.out;
  std::ifstream in(out / "summary.json");
  const auto summary = nlohmann::json::parse(in);
  EXPECT_TRUE(summary["interrupted"].get<bool>()) << summary;
  EXPECT_EQ(summary["checkpoint"], "") << summary;
}

// A disk that fills up mid-run (a small tmpfs): the save that does not fit stops the
// run with an error naming the file; the checkpoints before it stay complete and
// loadable, and metrics.jsonl holds whole lines only.
TEST(MultiRankTraining, AFullDiskStopsTheRunAndKeepsTheLastCheckpoint) {
  const fs::path disk = fresh_path("full_disk");
  fs::create_directories(disk);
  // The tiny model's checkpoint is 1.4 MB; 4 MB holds two and most of a third.
  const Result m = sh("mount -t tmpfs -o size=4m shardtrain-test " + disk.string() + " 2>&1");
  if (m.code != 0) GTEST_SKIP() << "cannot mount a small tmpfs here (needs root): " << m.out;
  struct Unmount {
    fs::path p;
    ~Unmount() { st::testing::run_shell("umount " + p.string()); }
  } unmount{disk};
  const fs::path out = disk / "run";
  const Result r = sh(std::string(SHARDTRAIN_BINARY) + " train" + kModel +
                      " --train.steps=40 --train.micro_batch=8 --run.checkpoint_every=2 --run.keep_last=0"
                      " --run.out_dir=" + out.string());
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(out.string()), std::string::npos) << r.out;  // names the path
  EXPECT_NE(r.out.find("No space left on device"), std::string::npos) << r.out;
  // Whole lines only, each valid JSON.
  std::ifstream in(out / "metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    EXPECT_TRUE(nlohmann::json::accept(line)) << line;
    ++lines;
  }
  EXPECT_GT(lines, 0);
  // The save that did not fit left nothing behind.
  for (const auto& e : fs::directory_iterator(out / "checkpoints"))
    EXPECT_EQ(e.path().extension(), "") << "left behind: " << e.path();
  // A metrics line that does not fit is cut off: the file keeps whole lines. The disk
  // is filled up to one page first (tmpfs counts in pages), which no whole number of
  // these lines fills exactly.
  {
    const fs::path log = disk / "full.jsonl";
    std::string fill;
    const Result df = sh("df -B1 --output=avail " + disk.string() + " | tail -1");
    const long long avail = std::atoll(df.out.c_str());
    ASSERT_GT(avail, 4096) << df.out;
    sh("head -c " + std::to_string(avail - 4096) + " /dev/zero > " + (disk / "filler").string() + " 2>/dev/null");
    st::MetricsLog m(log.string());
    bool failed = false;
    for (int i = 0; i < 1000 && !failed; ++i) {
      try {
        m.write(nlohmann::json{{"step", i}, {"text", std::string(50, 'x')}});
      } catch (const std::exception& e) {
        failed = true;
        EXPECT_NE(std::string(e.what()).find(log.string()), std::string::npos) << e.what();
      }
    }
    EXPECT_TRUE(failed) << "the disk never filled up";
    std::ifstream in(log);
    std::string l;
    while (std::getline(in, l)) EXPECT_TRUE(nlohmann::json::accept(l)) << l;
  }
  std::ifstream latest(out / "checkpoints" / "latest");
  std::string name;
  ASSERT_TRUE(std::getline(latest, name)) << r.out;
  const fs::path copy = fresh_path("full_disk_resume");
  fs::create_directories(copy);
  fs::copy(out / "checkpoints" / name, copy / name, fs::copy_options::recursive);
  const Result again = sh(std::string(SHARDTRAIN_BINARY) + " train" + kModel +
                          " --train.steps=40 --train.micro_batch=8 --run.resume=" + (copy / name).string() +
                          " --run.out_dir=" + (copy / "run").string());
  EXPECT_EQ(again.code, 0) << again.out;
  EXPECT_NE(again.out.find("resumed: "), std::string::npos) << again.out;
}

TEST(MultiRankTraining, ARankThatDiesStopsTheLaunchNamingIt) {
  const fs::path out = fresh_path("dies");
  const std::string train_cmd = std::string(SHARDTRAIN_BINARY) + " train" + kModel +
                                " --train.steps=100000 --train.micro_batch=2 --run.out_dir=" + out.string() +
                                " --dist.timeout_s=20";
  // Rank 1 is killed after 3 s, mid-training; rank 0 must not outlive it for long.
  const std::string script = "if [ \"$RANK\" = 1 ]; then exec timeout -s KILL 3 " + train_cmd + "; else exec " +
                             train_cmd + "; fi";
  const Result r = sh(std::string(SHARDTRAIN_BINARY) + " launch --nproc-per-node 2 --master-port " +
                      std::to_string(port(4)) + " --grace-period 5 --program /bin/sh -- -c '" + script + "'");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("rank 1"), std::string::npos) << r.out;
  EXPECT_LT(r.seconds, 40) << r.out;
}

TEST(MultiRankTraining, AMissingRankTimesOutNamingIt) {
  const fs::path out = fresh_path("missing");
  const Result r = sh("RANK=0 WORLD_SIZE=3 LOCAL_RANK=0 LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                      std::to_string(port(5)) + " " + SHARDTRAIN_BINARY + " train" + kModel +
                      " --train.steps=1 --train.micro_batch=2 --dist.timeout_s=3 --run.out_dir=" + out.string());
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_NE(r.out.find("1, 2"), std::string::npos) << r.out;  // the ranks that never arrived
  EXPECT_NE(r.out.find("127.0.0.1:" + std::to_string(port(5))), std::string::npos) << r.out;
  EXPECT_LT(r.seconds, 30) << r.out;
}

}  // namespace

// `shardtrain launch ... -- train --train.device=cuda` end to end: the ranks get their
// process groups from NCCL (a world of one under a launcher does too), train a few
// steps, and exit 0. Skips without a CUDA device; the 2-rank run needs 2 GPUs.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "support/fork_ranks.h"
#include "support/metrics_jsonl.h"
#include "support/shell.h"
#include "support/temp_dir.h"

#ifdef SHARDTRAIN_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace {
namespace fs = std::filesystem;

int gpu_count() {
#ifdef SHARDTRAIN_HAVE_CUDA
  return st::cuda::device_count(nullptr);
#else
  return 0;
#endif
}

using Result = st::testing::ShellResult;
Result sh(const std::string& cmd) {
  std::printf("$ %s\n", cmd.c_str());
  std::fflush(nullptr);
  return st::testing::run_shell(cmd);
}

bool contains(const std::string& s, const std::string& p) { return s.find(p) != std::string::npos; }

using st::testing::fresh_path;
using st::testing::step_losses;

// Random tokens: no data files needed wherever the test runs. NCCL_DEBUG=VERSION
// makes NCCL print its version line at set-up: proof that it ran.
Result launch_train(int nproc, int micro_batch, const fs::path& out) {
  return sh("NCCL_DEBUG=VERSION " + std::string(SHARDTRAIN_BINARY) + " launch --nproc-per-node " +
            std::to_string(nproc) + " --master-port " + std::to_string(st::test::free_port()) +
            " -- train --train.device=cuda --model.preset=tiny --train.steps=5 --train.seq_len=64"
            " --train.micro_batch=" + std::to_string(micro_batch) + " --data.source=random --run.progress=off"
            " --dist.timeout_s=120 --run.out_dir=" + out.string());
}

TEST(LaunchNcclGpu, OneRankTrainsThroughNccl) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const fs::path out = fresh_path("one");
  const Result r = launch_train(1, 4, out);
  std::printf("%s(exit %d after %.1f s)\n", r.out.c_str(), r.code, r.seconds);
  ASSERT_EQ(r.code, 0) << "the launched run failed; its output is above";
  EXPECT_TRUE(contains(r.out, "step 5/5")) << "no 'step 5/5' line";
  EXPECT_TRUE(contains(r.out, "comm: NCCL over 1 rank(s)")) << "the world of one did not get NCCL groups";
  EXPECT_TRUE(contains(r.out, "NCCL version")) << "NCCL printed no version line (NCCL_DEBUG=VERSION)";
  const std::vector<double> l = step_losses(out / "metrics.jsonl");
  ASSERT_EQ(l.size(), 5u) << "metrics.jsonl in " << out;
  for (double x : l) EXPECT_TRUE(std::isfinite(x));
}

// The same global batch of 4 sequences on 1 rank (micro batch 4) and on 2 ranks
// (micro batch 2 each, FSDP over both GPUs through NCCL): same data, same initial
// weights, so the losses agree up to bf16 rounding and summation order.
TEST(LaunchNcclGpu, TwoRanksFollowOneRank) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpu_count();
  const fs::path one = fresh_path("ref1"), two = fresh_path("two");
  const Result a = launch_train(1, 4, one);
  ASSERT_EQ(a.code, 0) << a.out;
  const Result b = launch_train(2, 2, two);
  std::printf("%s(exit %d after %.1f s)\n", b.out.c_str(), b.code, b.seconds);
  ASSERT_EQ(b.code, 0) << "the 2-rank run failed; its output is above";
  EXPECT_TRUE(contains(b.out, "comm: NCCL over 2 rank(s)")) << "no NCCL groups line";
  const std::vector<double> l1 = step_losses(one / "metrics.jsonl"), l2 = step_losses(two / "metrics.jsonl");
  ASSERT_EQ(l1.size(), 5u);
  ASSERT_EQ(l2.size(), 5u);
  for (size_t i = 0; i < l1.size(); ++i) {
    std::printf("step %zu  1 rank %.4f  2 ranks %.4f\n", i + 1, l1[i], l2[i]);
    EXPECT_NEAR(l2[i], l1[i], 0.02 + 0.01 * l1[i]) << "step " << i + 1;
  }
}

}  // namespace

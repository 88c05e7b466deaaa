// What a run does with its run directory: one run at a time (an flock on <out_dir>/.lock
// that names its holder and dies with it), restarts by the launcher that start again
// from step 0 when there is no checkpoint, and a run stopped before its first step that
// leaves nothing in the way of the corrected command.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/fork_ranks.h"
#include "support/metrics_jsonl.h"
#include "support/shell.h"
#include "support/temp_dir.h"
#include "train/run_dir_lock.h"

namespace st {
namespace {

namespace fs = std::filesystem;
using testing::caught_error;
using testing::fresh_path;
using testing::temp_dir;
using testing::temp_path;
using Result = testing::ShellResult;

Result sh(const std::string& cmd) { return testing::run_shell(cmd); }

const std::string kBin = SHARDTRAIN_BINARY;
const std::string kModel =
    " --model.preset=tiny --model.layers=2 --model.hidden_size=64 --model.intermediate_size=128"
    " --train.seq_len=32 --train.micro_batch=4 --optim.warmup_steps=2 --run.progress=off --dist.timeout_s=60";

std::string host_name() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

bool has(const Result& r, const std::string& part) { return r.out.find(part) != std::string::npos; }

// Shell that waits (up to a minute) until the run in `out` has logged a step.
std::string once_training(const fs::path& out) {
  return "for i in $(seq 600); do grep -qs '\"step\"' " + (out / "metrics.jsonl").string() +
         " && break; sleep 0.1; done;";
}

// ---- the lock itself ------------------------------------------------------------------

TEST(RunDirLock, ASecondLockIsRefusedNamingTheHolder) {
  const fs::path dir = fresh_path("lock_twice");
  std::optional<RunDirLock> first(std::in_place, dir.string(), "run.out_dir");
  ASSERT_TRUE(first->locked());
  EXPECT_TRUE(fs::exists(dir / ".lock"));
  const std::string holder = testing::read_file(dir / ".lock");
  EXPECT_NE(holder.find("pid " + std::to_string(::getpid()) + " on host " + host_name()), std::string::npos) << holder;
  // flock belongs to the open file: a second open in this process conflicts as another
  // process's would.
  const std::optional<Error> e = caught_error([&] { RunDirLock second(dir.string(), "run.out_dir"); });
  ASSERT_TRUE(e);
  const std::string msg = e->what();
  EXPECT_NE(msg.find("run.out_dir '" + dir.string() + "' is in use by another run (pid " +
                     std::to_string(::getpid()) + " on host " + host_name()),
            std::string::npos)
      << msg;
  EXPECT_EQ(e->kind(), ErrorKind::Usage);
  // A directory the lock created and nothing else wrote into goes with it.
  first.reset();
  EXPECT_FALSE(fs::exists(dir));
  // One that holds a run's files stays, and can be locked again.
  { RunDirLock again(dir.string(), "run.out_dir"); testing::write_file(dir / "metrics.jsonl", ""); }
  EXPECT_TRUE(fs::exists(dir / "metrics.jsonl"));
  EXPECT_NO_THROW(RunDirLock(dir.string(), "run.out_dir"));
  EXPECT_TRUE(fs::exists(dir / "metrics.jsonl"));
}

// A holder killed with SIGKILL (no destructor, no clean-up) leaves no stale lock.
TEST(RunDirLock, TheKernelReleasesTheLockOfAKilledHolder) {
  const fs::path dir = temp_dir("lock_killed");
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(p[0]);
    RunDirLock lock(dir.string(), "run.out_dir");
    (void)!::write(p[1], "x", 1);
    ::pause();
    ::_exit(0);
  }
  ::close(p[1]);
  char c;
  ASSERT_EQ(::read(p[0], &c, 1), 1);
  ::close(p[0]);
  const std::optional<Error> e = caught_error([&] { RunDirLock(dir.string(), "run.out_dir"); });
  ASSERT_TRUE(e);
  EXPECT_NE(std::string(e->what()).find("(pid " + std::to_string(child) + " on host"), std::string::npos) << e->what();
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_NO_THROW(RunDirLock(dir.string(), "run.out_dir"));
}

// ---- runs of the binary ------------------------------------------------------------------

// A second run in a run directory while the first trains is refused at once (exit 2),
// naming the first run's pid and host, and writes nothing there; the first goes on.
TEST(RunDirLock, ASecondTrainInTheSameOutDirIsRefused) {
  const fs::path out = fresh_path("lock_train");
  const std::string run = kBin + " train" + kModel + " --train.steps=100000 --run.checkpoint_every=3 --run.out_dir=" +
                          out.string();
  const Result r = sh("{ " + run + " > /dev/null 2>&1 & pid=$!; echo first_pid=$pid; " + once_training(out) + " " + run +
                      " --train.steps=7; echo second_rc=$?; kill -TERM $pid; wait $pid; echo first_rc=$?; }");
  const size_t at = r.out.find("first_pid=");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string pid = r.out.substr(at + 10, r.out.find('\n', at) - at - 10);
  EXPECT_TRUE(has(r, "second_rc=2")) << r.out;
  EXPECT_TRUE(has(r, "is in use by another run (pid " + pid + " on host " + host_name())) << r.out;
  EXPECT_TRUE(has(r, "first_rc=143")) << r.out;
  // The first run's records only: one per step, 1..N, and its own summary.
  const auto records = testing::step_records(out / "metrics.jsonl");
  int lines = 0;
  testing::for_each_step_record(out / "metrics.jsonl", [&](const nlohmann::json&) { ++lines; });
  EXPECT_EQ(static_cast<size_t>(lines), records.size());
  ASSERT_FALSE(records.empty());
  EXPECT_EQ(records.rbegin()->first, lines);
  std::ifstream in(out / "summary.json");
  const auto summary = nlohmann::json::parse(in);
  EXPECT_EQ(summary["steps"], 100000) << summary;
}

// In a launch of two ranks, rank 0 holds the lock; rank 1 still writes its checkpoint
// shards, and a second run is refused while they train.
TEST(RunDirLock, RankZeroLocksAMultiRankRunAndShardsAreStillWritten) {
  const fs::path out = fresh_path("lock_launch");
  const std::string launch = kBin + " launch --nproc-per-node 2 --master-port " + std::to_string(test::free_port()) +
                             " -- train" + kModel + " --train.steps=100000 --run.checkpoint_every=2 --run.out_dir=" +
                             out.string();
  const Result r = sh("{ " + launch + " > /dev/null 2>&1 & pid=$!; " + once_training(out) + " " + kBin + " train" +
                      kModel + " --train.steps=3 --run.out_dir=" + out.string() +
                      "; echo second_rc=$?; for i in $(seq 600); do test -e " + (out / "checkpoints/latest").string() +
                      " && break; sleep 0.1; done; kill -TERM $pid; wait $pid; echo first_rc=$?; }");
  EXPECT_TRUE(has(r, "second_rc=2")) << r.out;
  EXPECT_TRUE(has(r, "is in use by another run")) << r.out;
  EXPECT_TRUE(has(r, "first_rc=143")) << r.out;
  std::ifstream latest(out / "checkpoints/latest");
  std::string name;
  latest >> name;
  ASSERT_FALSE(name.empty()) << r.out;
  EXPECT_TRUE(fs::exists(out / "checkpoints" / name / "shard-00000-of-00002.safetensors"));
  EXPECT_TRUE(fs::exists(out / "checkpoints" / name / "shard-00001-of-00002.safetensors"));
  EXPECT_TRUE(fs::exists(out / "checkpoints" / name / "manifest.json"));
}

// ---- restarts and runs that never reached step 1 ----------------------------------------

// A rank killed before any checkpoint: the launcher's restart starts the run again from
// step 0 over the unfinished attempt (which a first start refuses), and finishes it.
TEST(Restart, WithoutACheckpointARestartStartsFromStepZero) {
  const fs::path out = fresh_path("restart_fresh");
  const fs::path marker = fresh_path("restart_fresh_marker");
  const Result r = sh("SHARDTRAIN_TEST_FAULT=1:3:" + marker.string() + " " + kBin +
                      " launch --nproc-per-node 2 --max-restarts 2 --master-port " +
                      std::to_string(test::free_port()) + " -- train" + kModel +
                      " --train.steps=6 --train.log_every=1 --run.out_dir=" + out.string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r, "launch: restart 1 of 2 after rank 1 was killed by signal 9")) << r.out;
  EXPECT_TRUE(has(r, "no checkpoint to continue from")) << r.out;
  EXPECT_TRUE(has(r, "starting again from step 0")) << r.out;
  EXPECT_FALSE(has(r, "restart 2 of 2")) << r.out;
  const auto records = testing::step_records(out / "metrics.jsonl");
  ASSERT_EQ(records.size(), 6u) << r.out;
  EXPECT_EQ(records.rbegin()->first, 6);
  std::ifstream in(out / "summary.json");
  const auto summary = nlohmann::json::parse(in);
  EXPECT_FALSE(summary.value("interrupted", false)) << summary;
  EXPECT_EQ(summary["steps"], 6) << summary;
}

// A run refused on its configuration before step 1 (an export target that cannot be
// written) leaves nothing, and the corrected command runs; so does a run over a
// directory whose metrics.jsonl holds no step (a run that never reached step 1).
TEST(Restart, ARunStoppedBeforeStepOneDoesNotBlockTheNext) {
  const fs::path base = temp_dir("before_step1"), out = base / "run";
  testing::write_file(base / "afile", "x");
  const std::string run = kBin + " train" + kModel + " --train.steps=2 --run.out_dir=" + out.string();
  const Result bad = sh(run + " --run.export_dir=" + (base / "afile" / "exp").string());
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_TRUE(has(bad, "afile")) << bad.out;
  EXPECT_FALSE(fs::exists(out)) << bad.out;
  const Result good = sh(run + " --run.export_dir=" + (base / "exp").string());
  EXPECT_EQ(good.code, 0) << good.out;
  EXPECT_EQ(testing::step_records(out / "metrics.jsonl").size(), 2u);
  // What a run stopped after its set-up but before its first step leaves: config.toml and
  // a metrics.jsonl without steps (here with a transport report), no summary.json.
  fs::remove(out / "summary.json");
  testing::write_file(out / "metrics.jsonl", "{\"transport_report\": {}}\n");
  const Result again = sh(run);
  EXPECT_EQ(again.code, 0) << again.out;
  // With a step in it, the unfinished run is refused (a usage error, which a launcher
  // does not restart), saying how to go on.
  fs::remove(out / "summary.json");
  const Result refused = sh(run);
  EXPECT_EQ(refused.code, 2) << refused.out;
  EXPECT_TRUE(has(refused, "holds an unfinished run")) << refused.out;
  EXPECT_TRUE(has(refused, "--run.resume=none")) << refused.out;
}

// The newest checkpoint without its manifest (removed by hand, or damaged) is passed
// over with a warning naming it, not in silence.
TEST(Restart, ANewestCheckpointWithoutItsManifestIsNamed) {
  const fs::path out = fresh_path("no_manifest");
  const std::string run = kBin + " train" + kModel + " --run.checkpoint_every=2 --run.keep_last=0 --run.out_dir=" +
                          out.string();
  ASSERT_EQ(sh(run + " --train.steps=4").code, 0);
  fs::remove(out / "checkpoints/step-4/manifest.json");
  const Result r = sh(run + " --train.steps=6");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r, "warning: run.resume=auto: passing over " + (out / "checkpoints/step-4").string() +
                         ": it has no manifest.json")) << r.out;
  EXPECT_TRUE(has(r, "resumed: " + (out / "checkpoints/step-2").string())) << r.out;
}

}  // namespace
}  // namespace st

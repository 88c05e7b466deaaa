// `shardtrain launch` says how each rank ended, with its pid, as it ends, and after a
// failure lists every rank's state. Ranks are /bin/sh scripts that write their pid
// ($$: the shell is the rank process) to files, and order themselves through those
// files rather than by sleeping.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "support/shell.h"
#include "support/temp_dir.h"

namespace {
namespace fs = std::filesystem;
using st::testing::run_shell;
using st::testing::temp_dir;

std::string pid_of(const fs::path& f) {
  std::ifstream in(f);
  std::string pid;
  in >> pid;
  return pid;
}

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

std::string launch(const std::string& args, const std::string& script) {
  return std::string(SHARDTRAIN_BINARY) + " launch " + args + " --program /bin/sh -- -c '" + script + "'";
}

TEST(LaunchStates, EveryRankThatExitsIsNamedWithItsPid) {
  const fs::path d = temp_dir("ok");
  const auto r = run_shell(launch("--nproc-per-node 2", "echo $$ > " + d.string() + "/pid.$RANK"));
  ASSERT_EQ(r.code, 0) << r.out;
  for (int rank : {0, 1}) {
    const std::string pid = pid_of(d / ("pid." + std::to_string(rank)));
    ASSERT_FALSE(pid.empty());
    EXPECT_TRUE(contains(r.out, "launch: rank " + std::to_string(rank) + " (pid " + pid + "): exited 0\n")) << r.out;
  }
  EXPECT_FALSE(contains(r.out, "every rank at the end")) << r.out;  // the summary is for failures
}

// Rank 2 exits 0; then rank 1 fails with 3; rank 0, still running, gets SIGTERM from
// the launcher and dies of it. Each end is printed as it happens, then all three.
TEST(LaunchStates, AFailureEndsWithEveryRanksState) {
  const fs::path d = temp_dir("fail");
  const std::string dir = d.string();
  const std::string script =
      "echo $$ > " + dir + "/pid.$RANK; "
      "if [ $RANK = 2 ]; then exit 0; fi; "
      "if [ $RANK = 1 ]; then "
      // Fail once rank 0 is up and rank 2 has ended (and been reaped: kill -0 fails).
      "  while [ ! -s " + dir + "/pid.0 ] || [ ! -s " + dir + "/pid.2 ] || kill -0 $(cat " + dir +
      "/pid.2) 2>/dev/null; do sleep 0.05; done; exit 3; fi; "
      "sleep 30";
  const auto r = run_shell(launch("--nproc-per-node 3", script));
  EXPECT_EQ(r.code, 3) << r.out;
  const std::string p0 = pid_of(d / "pid.0"), p1 = pid_of(d / "pid.1"), p2 = pid_of(d / "pid.2");
  const std::string s0 = "rank 0 (pid " + p0 + "): killed by signal 15 (SIGTERM), after the launcher sent SIGTERM";
  const std::string s1 = "rank 1 (pid " + p1 + "): failed with exit code 3";
  const std::string s2 = "rank 2 (pid " + p2 + "): exited 0";
  // As each ended, in that order.
  const size_t a = r.out.find("launch: " + s2 + "\n"), b = r.out.find("launch: " + s1 + "\n"),
               c = r.out.find("launch: " + s0 + "\n");
  ASSERT_NE(a, std::string::npos) << r.out;
  ASSERT_NE(b, std::string::npos) << r.out;
  ASSERT_NE(c, std::string::npos) << r.out;
  EXPECT_LT(a, b) << r.out;
  EXPECT_LT(b, c) << r.out;
  // Then every rank, in rank order.
  const std::string summary = "launch: every rank at the end (the first failure: rank 1 exited with status 3):\n"
                              "launch:   " + s0 + "\nlaunch:   " + s1 + "\nlaunch:   " + s2 + "\n";
  EXPECT_TRUE(contains(r.out, summary)) << "expected\n" << summary << "in\n" << r.out;
}

TEST(LaunchStates, ARankKilledBySignalIsNamed) {
  const fs::path d = temp_dir("killed");
  const auto r = run_shell(launch("--nproc-per-node 1", "echo $$ > " + d.string() + "/pid.$RANK; kill -KILL $$"));
  EXPECT_EQ(r.code, 128 + 9) << r.out;
  const std::string s = "rank 0 (pid " + pid_of(d / "pid.0") + "): killed by signal 9 (SIGKILL)";
  EXPECT_TRUE(contains(r.out, "launch: " + s + "\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "launch:   " + s + "\n")) << r.out;
}

}  // namespace

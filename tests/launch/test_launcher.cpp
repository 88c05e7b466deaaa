// `shardtrain launch` through the real binary: the env contract each rank sees, the
// "[rank R] " output relay, stopping everything when one rank fails, and signals.
// Ranks are small /bin/sh scripts; they synchronise through files in a temp dir
// instead of sleeping, so the tests hold on a loaded machine.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "launch/launcher.h"
#include "support/temp_dir.h"

extern char** environ;

namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using st::testing::temp_dir;

struct Result {
  int status = 0;  // wait status of the launcher
  std::string out;  // its stdout and stderr together
  double seconds = 0;
  int code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }
};

// A launcher started in the background, its stdout+stderr on a pipe.
struct Launched {
  pid_t pid = -1;
  int fd = -1;
  Clock::time_point started;
};

Launched start(const std::vector<std::string>& args, const std::vector<std::string>& extra_env = {}) {
  std::vector<std::string> argv = {SHARDTRAIN_BINARY, "launch"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<std::string> env(extra_env);
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  std::vector<char*> cargv, cenv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (auto& e : env) cenv.push_back(e.data());
  cenv.push_back(nullptr);

  int p[2];
  EXPECT_EQ(pipe2(p, O_CLOEXEC), 0);
  Launched l;
  l.started = Clock::now();
  l.pid = fork();
  if (l.pid == 0) {
    dup2(p[1], 1);
    dup2(p[1], 2);
    execve(cargv[0], cargv.data(), cenv.data());
    _exit(127);
  }
  close(p[1]);
  l.fd = p[0];
  return l;
}

// Reads until EOF and reaps; a launcher still alive after `limit_s` is killed so a
// broken launcher fails the test instead of hanging it.
Result finish(Launched l, double limit_s = 30) {
  Result r;
  const auto deadline = l.started + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit_s));
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      ADD_FAILURE() << "launcher still running after " << limit_s << " s; killing it";
      kill(l.pid, SIGKILL);
      break;
    }
    pollfd pfd{l.fd, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(left)) <= 0) continue;
    const ssize_t n = read(l.fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    r.out.append(buf, static_cast<size_t>(n));
  }
  close(l.fd);
  waitpid(l.pid, &r.status, 0);
  r.seconds = std::chrono::duration<double>(Clock::now() - l.started).count();
  return r;
}

Result launch(const std::vector<std::string>& args, const std::vector<std::string>& extra_env = {}) {
  return finish(start(args, extra_env));
}

bool wait_for_files(const std::vector<fs::path>& files, double limit_s = 10) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(limit_s);
  while (Clock::now() < deadline) {
    bool all = true;
    for (const auto& f : files) all = all && fs::exists(f) && fs::file_size(f) > 0;
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

pid_t read_pid(const fs::path& f) {
  std::ifstream in(f);
  pid_t pid = -1;
  in >> pid;
  return pid;
}

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

TEST(Launch, EachRankSeesTheContractAndItsLinesArePrefixed) {
  Result r = launch({"--nproc-per-node", "3", "--program", "/bin/sh", "--", "-c",
                     "echo rank $RANK of $WORLD_SIZE local $LOCAL_RANK"});
  ASSERT_EQ(r.code(), 0) << r.out;
  for (int i = 0; i < 3; ++i) {
    const std::string i_s = std::to_string(i);
    EXPECT_TRUE(contains(r.out, "[rank " + i_s + "] rank " + i_s + " of 3 local " + i_s + "\n")) << r.out;
  }
}

TEST(Launch, MultiNodePlacementAndForeignRankVariablesRemoved) {
  // As if started inside an srun step and an mpirun: those placements must not reach the ranks.
  Result r = launch({"--nproc-per-node", "2", "--nnodes", "3", "--node-rank", "1", "--master-addr", "10.1.2.3",
                     "--master-port", "1234", "--program", "/bin/sh", "--", "-c",
                     "echo R=$RANK W=$WORLD_SIZE L=$LOCAL_RANK LW=$LOCAL_WORLD_SIZE N=$NODE_RANK G=$GROUP_RANK "
                     "M=$MASTER_ADDR:$MASTER_PORT S=${SLURM_PROCID-unset} O=${OMPI_COMM_WORLD_RANK-unset} "
                     "P=${PMI_RANK-unset} J=$SLURM_JOB_ID"},
                    {"SLURM_PROCID=7", "SLURM_NTASKS=8", "SLURM_LOCALID=1", "SLURM_JOB_ID=42",
                     "OMPI_COMM_WORLD_RANK=5", "PMI_RANK=5", "RANK=99"});
  ASSERT_EQ(r.code(), 0) << r.out;
  EXPECT_TRUE(contains(r.out, "[rank 2] R=2 W=6 L=0 LW=2 N=1 G=1 M=10.1.2.3:1234 S=unset O=unset P=unset J=42\n"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "[rank 3] R=3 W=6 L=1 LW=2 N=1 G=1 M=10.1.2.3:1234 S=unset O=unset P=unset J=42\n"))
      << r.out;
}

// In a Kubernetes Indexed Job pod `launch` takes its node rank, node count and master
// from the pod's contract; options given on the command line still win.
TEST(Launch, IndexedJobPodPlacesItsRanks) {
  const std::vector<std::string> pod = {"JOB_COMPLETION_INDEX=1", "SHARDTRAIN_NNODES=2", "HOSTNAME=train-1",
                                        "SHARDTRAIN_SERVICE=train-svc", "MASTER_PORT=29600"};
  const std::string show = "echo R=$RANK W=$WORLD_SIZE N=$NODE_RANK M=$MASTER_ADDR:$MASTER_PORT "
                           "J=${JOB_COMPLETION_INDEX-unset}";
  Result r = launch({"--nproc-per-node", "2", "--program", "/bin/sh", "--", "-c", show}, pod);
  ASSERT_EQ(r.code(), 0) << r.out;
  EXPECT_TRUE(contains(r.out, "[rank 2] R=2 W=4 N=1 M=train-0.train-svc:29600 J=unset\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "[rank 3] R=3 W=4 N=1 M=train-0.train-svc:29600 J=unset\n")) << r.out;
  r = launch({"--nproc-per-node", "1", "--master-addr", "10.9.9.9", "--program", "/bin/sh", "--", "-c", show}, pod);
  ASSERT_EQ(r.code(), 0) << r.out;
  EXPECT_TRUE(contains(r.out, "[rank 1] R=1 W=2 N=1 M=10.9.9.9:29600 J=unset\n")) << r.out;
  r = launch({"--nproc-per-node", "1", "--program", "/bin/true"}, {"JOB_COMPLETION_INDEX=0"});
  EXPECT_NE(r.code(), 0);
  EXPECT_TRUE(contains(r.out, "SHARDTRAIN_NNODES")) << r.out;
}

TEST(Launch, RankEnvironmentFunction) {
  st::LaunchOptions opt;
  opt.nproc_per_node = 4;
  opt.nnodes = 2;
  opt.node_rank = 1;
  auto env = st::rank_environment(opt, 3, {{"PATH", "/bin"}, {"PMIX_RANK", "1"}, {"PET_NNODES", "9"}});
  EXPECT_EQ(env["RANK"], "7");
  EXPECT_EQ(env["WORLD_SIZE"], "8");
  EXPECT_EQ(env["LOCAL_RANK"], "3");
  EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
  EXPECT_EQ(env["MASTER_PORT"], "29500");
  EXPECT_EQ(env["PATH"], "/bin");
  EXPECT_EQ(env.count("PMIX_RANK"), 0u);
  EXPECT_EQ(env.count("PET_NNODES"), 0u);
  EXPECT_EQ(env.count("SHARDTRAIN_JOB_ID"), 0u);
  // The job's identity: the option's, else the environment's as it is.
  EXPECT_EQ(st::rank_environment(opt, 0, {{"SHARDTRAIN_JOB_ID", "outer"}})["SHARDTRAIN_JOB_ID"], "outer");
  opt.job_id = "job-7";
  EXPECT_EQ(st::rank_environment(opt, 0, {{"SHARDTRAIN_JOB_ID", "outer"}})["SHARDTRAIN_JOB_ID"], "job-7");
}

// Every launch gives its ranks one identity of its own (the rendezvous refuses ranks
// of another job); --job-id or SHARDTRAIN_JOB_ID choose it.
TEST(Launch, EachLaunchHasItsOwnJobIdentity) {
  auto ids = [](const Result& r) {
    std::vector<std::string> out;
    std::istringstream in(r.out);
    for (std::string line; std::getline(in, line);)
      if (const size_t at = line.find("id="); at != std::string::npos) out.push_back(line.substr(at + 3));
    return out;
  };
  const std::vector<std::string> args = {"--nproc-per-node", "2", "--program", "/bin/sh", "--", "-c", "echo id=$SHARDTRAIN_JOB_ID"};
  const Result a = launch(args), b = launch(args);
  ASSERT_EQ(a.code(), 0) << a.out;
  const auto ia = ids(a), ib = ids(b);
  ASSERT_EQ(ia.size(), 2u) << a.out;
  ASSERT_EQ(ib.size(), 2u) << b.out;
  EXPECT_FALSE(ia[0].empty());
  EXPECT_EQ(ia[0], ia[1]);  // one job
  EXPECT_EQ(ib[0], ib[1]);
  EXPECT_NE(ia[0], ib[0]);  // two jobs
  std::vector<std::string> named = args;
  named.insert(named.begin(), {"--job-id", "mine"});
  EXPECT_EQ(ids(launch(named)), (std::vector<std::string>{"mine", "mine"}));
  EXPECT_EQ(ids(launch(args, {"SHARDTRAIN_JOB_ID=outer"})), (std::vector<std::string>{"outer", "outer"}));
}

// A one-node launch gives its ranks one random job secret of its own (64 hex digits);
// --secret-file or SHARDTRAIN_JOB_SECRET choose it; a short one is refused.
TEST(Launch, EachLaunchHasItsOwnJobSecret) {
  auto secrets = [](const Result& r) {
    std::vector<std::string> out;
    std::istringstream in(r.out);
    for (std::string line; std::getline(in, line);)
      if (const size_t at = line.find("secret="); at != std::string::npos) out.push_back(line.substr(at + 7));
    return out;
  };
  const std::vector<std::string> args = {"--nproc-per-node", "2", "--program", "/bin/sh", "--", "-c",
                                         "echo secret=$SHARDTRAIN_JOB_SECRET"};
  const Result a = launch(args), b = launch(args);
  ASSERT_EQ(a.code(), 0) << a.out;
  const auto sa = secrets(a), sb = secrets(b);
  ASSERT_EQ(sa.size(), 2u) << a.out;
  ASSERT_EQ(sb.size(), 2u) << b.out;
  EXPECT_EQ(sa[0].size(), 64u) << sa[0];
  EXPECT_EQ(sa[0].find_first_not_of("0123456789abcdef"), std::string::npos) << sa[0];
  EXPECT_EQ(sa[0], sa[1]);  // one job
  EXPECT_NE(sa[0], sb[0]);  // two jobs
  EXPECT_EQ(secrets(launch(args, {"SHARDTRAIN_JOB_SECRET=from-the-environment"})),
            (std::vector<std::string>{"from-the-environment", "from-the-environment"}));
  const fs::path dir = temp_dir("launch_secret");
  std::ofstream(dir / "good") << "a-secret-of-twenty-bytes\n";
  std::ofstream(dir / "short") << "tiny\n";
  std::vector<std::string> from_file = args;
  from_file.insert(from_file.begin(), {"--secret-file", (dir / "good").string()});
  EXPECT_EQ(secrets(launch(from_file)), (std::vector<std::string>{"a-secret-of-twenty-bytes", "a-secret-of-twenty-bytes"}));
  std::vector<std::string> too_short = args;
  too_short.insert(too_short.begin(), {"--secret-file", (dir / "short").string()});
  const Result s = launch(too_short);
  EXPECT_EQ(s.code(), 2) << s.out;
  EXPECT_NE(s.out.find("the secret is 4 bytes; at least 16 are needed"), std::string::npos) << s.out;
  std::vector<std::string> missing = args;
  missing.insert(missing.begin(), {"--secret-file", (dir / "nothing").string()});
  EXPECT_EQ(launch(missing).code(), 2);
  fs::remove_all(dir);
}

TEST(Launch, StderrPartialLastLineAndBusyRanksNeverMixMidLine) {
  // Three ranks writing as fast as they can; every relayed line must be one whole
  // line of one rank, with that rank's prefix.
  Result r = launch({"--nproc-per-node", "3", "--program", "/bin/sh", "--", "-c",
                     "i=0; while [ $i -lt 400 ]; do echo \"r$RANK i$i abcdefghijklmnopqrstuvwxyz0123456789\"; "
                     "i=$((i+1)); done; echo oops >&2; printf 'no newline'"});
  ASSERT_EQ(r.code(), 0) << r.out;
  std::istringstream in(r.out);
  std::string line;
  int data_lines = 0;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string p = "[rank " + std::to_string(rank) + "] ";
    EXPECT_TRUE(contains(r.out, p + "oops\n")) << r.out;
    EXPECT_TRUE(contains(r.out, p + "no newline\n")) << r.out;
  }
  while (std::getline(in, line)) {
    if (line.starts_with("launch: ")) continue;
    ASSERT_TRUE(line.starts_with("[rank ")) << line;
    const std::string rank(1, line[6]);
    const std::string body = line.substr(9);
    if (body == "oops" || body == "no newline") continue;
    ASSERT_TRUE(body.starts_with("r" + rank + " i")) << line;
    ASSERT_TRUE(body.ends_with(" abcdefghijklmnopqrstuvwxyz0123456789")) << line;
    ++data_lines;
  }
  EXPECT_EQ(data_lines, 3 * 400);
}

TEST(Launch, FailingRankStopsTheOthersQuickly) {
  const fs::path d = temp_dir("fail");
  // Rank 1 fails only once ranks 0 and 2 are up, so there is something to stop.
  const std::string script = "echo $$ > " + d.string() + "/pid.$RANK; if [ \"$RANK\" = 1 ]; then "
                             "while [ ! -s " + d.string() + "/pid.0 ] || [ ! -s " + d.string() + "/pid.2 ]; do "
                             "sleep 0.05; done; exit 3; fi; sleep 30";
  Result r = launch({"--nproc-per-node", "3", "--program", "/bin/sh", "--", "-c", script});
  EXPECT_EQ(r.code(), 3) << r.out;
  EXPECT_LT(r.seconds, 20.0);
  EXPECT_TRUE(contains(r.out, "launch: rank 1 exited with status 3; stopping the other ranks")) << r.out;
  for (int rank : {0, 2}) {
    const pid_t pid = read_pid(d / ("pid." + std::to_string(rank)));
    ASSERT_GT(pid, 0);
    EXPECT_EQ(kill(pid, 0), -1) << "rank " << rank << " (pid " << pid << ") is still alive";
    EXPECT_EQ(errno, ESRCH);
  }
}

TEST(Launch, RankKilledBySignalIsNamed) {
  Result r = launch({"--nproc-per-node", "2", "--program", "/bin/sh", "--", "-c",
                     "[ \"$RANK\" = 1 ] && kill -KILL $$; sleep 30"});
  EXPECT_NE(r.code(), 0) << r.out;
  EXPECT_LT(r.seconds, 20.0);
  EXPECT_TRUE(contains(r.out, "launch: rank 1 was killed by signal 9 (SIGKILL)")) << r.out;
}

// Every start tells its ranks which one it is (SHARDTRAIN_RESTART_COUNT: 0, 1, ...), and
// giving up names the failure that began it all as well as the last one.
TEST(Launch, RestartsAreCountedAndGivingUpNamesTheFirstFailure) {
  Result r = launch({"--nproc-per-node", "2", "--max-restarts", "2", "--program", "/bin/sh", "--", "-c",
                     "echo start=$SHARDTRAIN_RESTART_COUNT; [ \"$RANK\" = 1 ] || exit 0; "
                     "[ \"$SHARDTRAIN_RESTART_COUNT\" = 0 ] && kill -KILL $$; exit 1"});
  EXPECT_EQ(r.code(), 1) << r.out;
  for (const char* start : {"[rank 1] start=0", "[rank 1] start=1", "[rank 1] start=2"})
    EXPECT_TRUE(contains(r.out, start)) << start << "\n" << r.out;
  EXPECT_TRUE(contains(r.out, "launch: restart 1 of 2 after rank 1 was killed by signal 9")) << r.out;
  EXPECT_TRUE(contains(r.out, "launch: giving up after 2 restarts; the first failure: rank 1 was killed by signal 9 "
                              "(SIGKILL); the last: rank 1 exited with status 1"))
      << r.out;
  EXPECT_EQ(st::rank_environment(st::LaunchOptions{}, 0, {})["SHARDTRAIN_RESTART_COUNT"], "0");
}

// A rank that fails on its input (exit 3) can make a peer fail first (exit 4: the
// connection it closed). The launch still does not restart: the input error would
// repeat. Rank 1 exits 3 once the launcher stops it, after rank 0's exit 4.
TEST(Launch, NoRestartWhenAnyRankFailedOnItsInput) {
  const fs::path d = temp_dir("input_error");
  const std::string up = (d / "up").string();
  Result r = launch({"--nproc-per-node", "2", "--max-restarts", "3", "--program", "/bin/sh", "--", "-c",
                     "echo start=$SHARDTRAIN_RESTART_COUNT; if [ \"$RANK\" = 1 ]; then trap 'exit 3' TERM; touch " + up +
                         "; sleep 30 & wait; else while [ ! -e " + up + " ]; do sleep 0.05; done; exit 4; fi"});
  EXPECT_EQ(r.code(), 3) << r.out;
  EXPECT_FALSE(contains(r.out, "restart 1 of 3")) << r.out;
  EXPECT_FALSE(contains(r.out, "start=1")) << r.out;
  EXPECT_TRUE(contains(r.out, "launch: not restarting: rank 1 exited with status 3 (an error in input data or model "
                              "files), which a restart would repeat; the first failure: rank 0 exited with status 4"))
      << r.out;
}

// The same without restarts: the launch exits with the input error's code, not the
// first failure's, and names both.
TEST(Launch, InputErrorCodeWinsOverTheFailureItCaused) {
  const fs::path d = temp_dir("input_error0");
  const std::string up = (d / "up").string();
  Result r = launch({"--nproc-per-node", "2", "--program", "/bin/sh", "--", "-c",
                     "if [ \"$RANK\" = 1 ]; then trap 'exit 3' TERM; touch " + up +
                         "; sleep 30 & wait; else while [ ! -e " + up + " ]; do sleep 0.05; done; exit 4; fi"});
  EXPECT_EQ(r.code(), 3) << r.out;
  EXPECT_TRUE(contains(r.out, "launch: exiting with its status: rank 1 exited with status 3 (an error in input data "
                              "or model files); the first failure: rank 0 exited with status 4"))
      << r.out;
}

TEST(Launch, SigtermIsForwardedToEveryRank) {
  const fs::path d = temp_dir("term");
  const std::string script = "trap 'echo term > " + d.string() + "/term.$RANK; exit 0' TERM; echo up > " +
                             d.string() + "/up.$RANK; sleep 30 & wait";
  Launched l = start({"--nproc-per-node", "2", "--program", "/bin/sh", "--", "-c", script});
  ASSERT_TRUE(wait_for_files({d / "up.0", d / "up.1"})) << finish(l, 1).out;
  kill(l.pid, SIGTERM);
  Result r = finish(l);
  EXPECT_NE(r.code(), 0) << r.out;
  EXPECT_TRUE(contains(r.out, "launch: got SIGTERM; forwarding it to the ranks")) << r.out;
  EXPECT_TRUE(fs::exists(d / "term.0")) << r.out;
  EXPECT_TRUE(fs::exists(d / "term.1")) << r.out;
}

TEST(Launch, RankIgnoringSigtermIsKilledAfterTheGracePeriod) {
  // Rank 1 fails; rank 0 ignores SIGTERM (and so do its `sleep`s) and never ends.
  const fs::path d = temp_dir("grace");
  const std::string script = "if [ \"$RANK\" = 1 ]; then while [ ! -s " + d.string() +
                             "/up.0 ]; do sleep 0.05; done; exit 4; fi; "
                             "trap '' TERM; echo up > " + d.string() + "/up.0; while :; do sleep 0.1; done";
  Result r = launch({"--nproc-per-node", "2", "--grace-period", "1", "--program", "/bin/sh", "--", "-c", script});
  EXPECT_EQ(r.code(), 4) << r.out;
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_TRUE(contains(r.out, "launch: rank 1 exited with status 4")) << r.out;
  EXPECT_TRUE(contains(r.out, "launch: rank 0 still running 1 s after SIGTERM; sending SIGKILL")) << r.out;
}

TEST(Launch, SecondSignalKillsAtOnce) {
  const fs::path d = temp_dir("twice");
  const std::string script = "trap '' TERM INT; echo up > " + d.string() + "/up.$RANK; while :; do sleep 0.1; done";
  // A grace period far beyond the test's limit: only the second signal can end this quickly.
  Launched l = start({"--nproc-per-node", "2", "--grace-period", "60", "--program", "/bin/sh", "--", "-c", script});
  ASSERT_TRUE(wait_for_files({d / "up.0", d / "up.1"})) << finish(l, 1).out;
  kill(l.pid, SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  kill(l.pid, SIGINT);
  Result r = finish(l, 20);
  EXPECT_EQ(r.code(), 128 + SIGINT) << r.out;
  EXPECT_TRUE(contains(r.out, "killing them now")) << r.out;
}

TEST(Launch, BadArgumentsAreClearErrors) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--nproc-per-node", "2"}, "nothing to run"},
      {{"--nproc-per-node", "2", "--"}, "nothing to run"},
      {{"--nproc-per-node", "0", "--", "presets"}, "--nproc-per-node must be at least 1"},
      {{"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "2", "--", "presets"}, "--node-rank 2 is out of range"},
      {{"--nproc-per-node", "2", "--master-port", "70000", "--", "presets"}, "--master-port must be in 1..65535"},
      {{"--nproc-per-node", "2", "train", "--config", "x.toml"}, "a rank's own arguments go after `--`"},
      {{"--", "presets"}, "--nproc-per-node is required"},
      {{"--nproc-per-node", "1", "--program", "/nonexistent/prog", "--", "x"}, "cannot execute /nonexistent/prog"},
      {{"--nproc-per-node", "1", "--program", "no-such-program-here", "--", "x"}, "not found on PATH"},
  };
  for (const Case& c : cases) {
    Result r = launch(c.args);
    EXPECT_NE(r.code(), 0) << r.out;
    EXPECT_TRUE(contains(r.out, c.message)) << "expected '" << c.message << "' in:\n" << r.out;
    EXPECT_FALSE(contains(r.out, "[rank ")) << r.out;
  }
}

TEST(Launch, RunsAShardtrainSubcommandInEachRank) {
  Result r = launch({"--nproc-per-node", "2", "--", "presets"});
  ASSERT_EQ(r.code(), 0) << r.out;
  for (const char* p : {"[rank 0] ", "[rank 1] "}) {
    EXPECT_TRUE(contains(r.out, std::string(p) + "preset ")) << r.out;
    EXPECT_TRUE(contains(r.out, std::string(p) + "tiny ")) << r.out;
  }
}

}  // namespace

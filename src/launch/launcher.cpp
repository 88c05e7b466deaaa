// The local spawner behind `shardtrain launch`.
//
// Process layout. Each rank is fork+execve'd into its own process group, with stdin
// from /dev/null and stdout/stderr on two pipes that the launcher reads. Own groups
// mean a Ctrl-C in the terminal reaches only the launcher, which forwards it exactly
// once, and that a signal we send reaches whatever the rank started (a shell's
// `sleep`, a helper process) instead of leaving it behind holding the pipes. Since
// ranks are then not in the terminal's foreground group, they must not read the tty:
// hence /dev/null. PR_SET_PDEATHSIG takes a rank down if the launcher dies by SIGKILL.
//
// Event loop. One thread, poll() on the rank pipes plus a self-pipe that the signal
// handlers (SIGCHLD, SIGINT, SIGTERM, SIGHUP) write the signal number into; after
// every wake-up the ranks are reaped with waitpid(WNOHANG). Deadlines (SIGTERM ->
// SIGKILL) become poll timeouts, so nothing spins. Output is relayed whole lines at a
// time from this single thread, so lines of different ranks never mix mid-line.
//
// States. When a rank ends the launcher prints "launch: rank R (pid P): exited 0" (or
// "failed with exit code N", "killed by signal S (NAME)"); when the launch fails it
// ends with every rank's state, the first failure named.
#include "launch/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "core/error.h"

extern char** environ;

namespace st {
namespace {

using Clock = std::chrono::steady_clock;

// After SIGKILL a process normally disappears at once; one stuck in the kernel
// (uninterruptible I/O, a wedged driver) may not, and the launcher should not hang
// on it forever.
constexpr auto kKillWait = std::chrono::seconds(5);
// A "line" longer than this without a newline is relayed in pieces, each ending in a
// newline, so one rank printing a huge blob cannot make the launcher buffer it all.
constexpr size_t kMaxLine = 64 * 1024;

// Rank placement set by other launchers. A `shardtrain launch` started inside an
// srun step or an mpirun/PyTorchJob process would otherwise hand its ranks two
// placements (e.g. SLURM_PROCID=0 in all of them next to RANK=0..N-1), and the
// rank-side detection would have to guess or fail; the children see only ours.
// Job-level variables (SLURM_JOB_ID, ...) are kept: they describe the job, not a rank.
constexpr const char* kForeignPrefixes[] = {"OMPI_COMM_WORLD_", "PMI_", "PMIX_", "PET_"};
constexpr const char* kForeignNames[] = {"SLURM_PROCID",         "SLURM_NTASKS",      "SLURM_NPROCS",
                                         "SLURM_LOCALID",        "SLURM_NODEID",      "JOB_COMPLETION_INDEX",
                                         "SHARDTRAIN_NNODES",    "SHARDTRAIN_NPROC_PER_NODE"};

constexpr int kHandledSignals[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP};

int g_signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  // A full pipe already holds a pending wake-up, so a failed write loses nothing.
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// Installs the handlers for the duration of a launch and restores the caller's.
class SignalGuard {
 public:
  SignalGuard() {
    ST_CHECK(g_signal_pipe[0] < 0, "launch: only one launch may run at a time in a process");
    if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) fail("launch: pipe: ", std::strerror(errno));
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (size_t i = 0; i < std::size(kHandledSignals); ++i) sigaction(kHandledSignals[i], &sa, &saved_[i]);
  }
  ~SignalGuard() {
    for (size_t i = 0; i < std::size(kHandledSignals); ++i) sigaction(kHandledSignals[i], &saved_[i], nullptr);
    close(g_signal_pipe[0]);
    close(g_signal_pipe[1]);
    g_signal_pipe[0] = g_signal_pipe[1] = -1;
  }
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;

 private:
  struct sigaction saved_[std::size(kHandledSignals)] {};
};

void write_all(int fd, const std::string& s) {
  const char* p = s.data();
  size_t n = s.size();
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w >= 0) {
      p += w;
      n -= static_cast<size_t>(w);
    } else if (errno == EAGAIN) {  // our stdout was handed to us non-blocking
      pollfd pfd{fd, POLLOUT, 0};
      poll(&pfd, 1, 1000);
    } else if (errno != EINTR) {
      return;  // stdout gone: drop the output but keep supervising the ranks
    }
  }
}

// One of a rank's output pipes, and the bytes after its last newline.
struct Stream {
  int fd = -1;  // read end, -1 once closed
  int to = 1;   // where its lines go: 1 or 2
  std::string pending;
};

enum class ReadResult { kData, kEmpty, kClosed };

struct Rank {
  int rank = 0;  // global
  pid_t pid = -1;
  bool running = false;
  int status = 0;  // from waitpid once reaped
  int sent = 0;    // the last signal the launcher sent it before it ended (0: none)
  Stream out, err;
};

// A wait status that is not an exit: "killed by signal 9 (SIGKILL)[, core dumped]" or
// "ended with wait status N".
std::string not_exited(int status) {
  if (WIFSIGNALED(status))
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" + signal_name(WTERMSIG(status)) + ")" +
           (WCOREDUMP(status) ? ", core dumped" : "");
  return "ended with wait status " + std::to_string(status);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  return (WIFSIGNALED(status) ? "was " : "") + not_exited(status);
}

// "rank 1 exited with status 3", "rank 0 was killed by signal 9 (SIGKILL)".
std::string rank_failure(int rank, int status) { return "rank " + std::to_string(rank) + " " + describe_status(status); }

// A rank's state as its line says it: "exited 0", "failed with exit code 3", "killed
// by signal 9 (SIGKILL)" (or "still running": left behind after SIGKILL), and the
// signal the launcher had sent it, if any.
std::string rank_state(const Rank& r) {
  if (r.running) return "still running";
  std::string s;
  if (WIFEXITED(r.status))
    s = WEXITSTATUS(r.status) == 0 ? "exited 0" : "failed with exit code " + std::to_string(WEXITSTATUS(r.status));
  else
    s = not_exited(r.status);
  if (r.sent) s += ", after the launcher sent " + signal_name(r.sent);
  return s;
}

bool succeeded(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
int exit_code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

// PATH lookup done here rather than by execvp in the child, so "not found" is an
// ordinary error before any rank starts.
std::string resolve_program(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = end > start ? dirs.substr(start, end - start) : ".";
    const std::string candidate = dir + "/" + program;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  fail("launch: program '", program, "' not found on PATH");
}

std::string self_path() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) fail("launch: cannot find this binary through /proc/self/exe: ", std::strerror(errno));
  return std::string(buf, static_cast<size_t>(n));
}

class Launcher {
 public:
  explicit Launcher(const LaunchOptions& opt) : opt_(opt) {}

  int run() {
    std::string exec_path, argv0;
    if (opt_.program.empty()) {
      // execve of /proc/self/exe runs exactly the binary that is running now, even if
      // the file on disk was replaced by a rebuild in the meantime.
      exec_path = "/proc/self/exe";
      argv0 = self_path();
    } else {
      exec_path = resolve_program(opt_.program);
      argv0 = opt_.program;
    }
    std::vector<std::string> argv = {argv0};
    argv.insert(argv.end(), opt_.args.begin(), opt_.args.end());

    std::map<std::string, std::string> base;
    for (char** e = environ; *e; ++e) {
      const char* eq = std::strchr(*e, '=');
      if (eq) base.emplace(std::string(*e, static_cast<size_t>(eq - *e)), std::string(eq + 1));
    }

    SignalGuard guard;  // before the first fork, so no SIGCHLD or Ctrl-C is missed
    const int first = opt_.node_rank * opt_.nproc_per_node;
    std::fprintf(stderr, "launch: starting ranks %d..%d of %d (node %d of %d): %s; master %s:%d\n", first,
                 first + opt_.nproc_per_node - 1, opt_.nnodes * opt_.nproc_per_node, opt_.node_rank, opt_.nnodes,
                 argv0.c_str(), opt_.master_addr.c_str(), opt_.master_port);
    if (opt_.nnodes > 1 && (opt_.master_addr == "127.0.0.1" || opt_.master_addr == "localhost"))
      std::fprintf(stderr, "launch: warning: --nnodes %d with --master-addr %s: ranks on other nodes cannot reach "
                   "it; pass node 0's address\n", opt_.nnodes, opt_.master_addr.c_str());
    std::fflush(nullptr);  // buffered output of ours must come out before the ranks'

    ranks_.resize(static_cast<size_t>(opt_.nproc_per_node));
    try {
      for (int local = 0; local < opt_.nproc_per_node; ++local)
        spawn(ranks_[static_cast<size_t>(local)], local, exec_path, argv, rank_environment(opt_, local, base));
    } catch (...) {
      kill_and_reap_all();
      throw;
    }
    supervise();
    for (Rank& r : ranks_) {
      drain(r, r.out, true);
      drain(r, r.err, true);
    }
    if (first_failure_status_) {
      // Every rank's end in one place: the first failure, and what became of the others.
      std::string lines = "launch: every rank at the end (the first failure: " + failure_ + "):\n";
      for (const Rank& r : ranks_) lines += "launch:   " + rank_line(r) + "\n";
      std::fputs(lines.c_str(), stderr);
      return exit_code_of(*first_failure_status_);
    }
    if (interrupted_by_) return 128 + *interrupted_by_;
    return 0;
  }

  bool interrupted() const { return interrupted_by_.has_value(); }
  const std::string& failure() const { return failure_; }

  // The failure a restart would repeat, if any: the first failure when it was a usage or
  // configuration error (exit 2) or an input one (exit 3); else the first rank, in rank
  // order, that exited 2 or 3 of its own while the others stopped. A rank that fails on
  // its input can make a peer fail first (a connection the failing rank closed), and a
  // rank stopped by the launcher's SIGTERM exits 143, not 2 or 3.
  struct Repeating {
    int code = 0;
    std::string what;  // "rank 1 exited with status 3"
  };
  std::optional<Repeating> repeating_failure() const {
    auto repeats = [](int status) {
      return WIFEXITED(status) && (WEXITSTATUS(status) == kExitUsage || WEXITSTATUS(status) == kExitData);
    };
    if (!first_failure_status_) return std::nullopt;
    if (repeats(*first_failure_status_)) return Repeating{exit_code_of(*first_failure_status_), failure_};
    for (const Rank& r : ranks_)
      if (!r.running && repeats(r.status))
        return Repeating{WEXITSTATUS(r.status), rank_failure(r.rank, r.status)};
    return std::nullopt;
  }

 private:
  void spawn(Rank& r, int local, const std::string& exec_path, const std::vector<std::string>& argv,
             const std::map<std::string, std::string>& env) {
    // Everything the child touches is prepared here: between fork and execve only
    // async-signal-safe calls are allowed (OpenBLAS threads exist in this process).
    std::vector<std::string> env_strings;
    for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
    std::vector<char*> cargv, cenv;
    for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    for (const auto& e : env_strings) cenv.push_back(const_cast<char*>(e.c_str()));
    cenv.push_back(nullptr);

    int out[2], err[2], status_pipe[2];
    if (pipe2(out, O_CLOEXEC) != 0) fail("launch: pipe: ", std::strerror(errno));
    if (pipe2(err, O_CLOEXEC) != 0) fail("launch: pipe: ", std::strerror(errno));
    // Closed by a successful execve; carries errno when execve fails.
    if (pipe2(status_pipe, O_CLOEXEC) != 0) fail("launch: pipe: ", std::strerror(errno));
    const int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);

    // Blocked across fork so our handlers never run in the child before exec.
    sigset_t block, old_mask;
    sigemptyset(&block);
    for (int sig : kHandledSignals) sigaddset(&block, sig);
    pthread_sigmask(SIG_BLOCK, &block, &old_mask);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid == 0) {
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      for (int sig : kHandledSignals) sigaction(sig, &dfl, nullptr);
      pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);  // the launcher died before prctl took effect
      if (devnull >= 0) dup2(devnull, 0);
      dup2(out[1], 1);
      dup2(err[1], 2);
      execve(exec_path.c_str(), cargv.data(), cenv.data());
      const int e = errno;
      [[maybe_unused]] ssize_t n = write(status_pipe[1], &e, sizeof(e));
      _exit(127);
    }
    const int fork_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
    close(out[1]);
    close(err[1]);
    close(status_pipe[1]);
    if (devnull >= 0) close(devnull);
    if (pid < 0) {
      close(out[0]);
      close(err[0]);
      close(status_pipe[0]);
      fail("launch: fork: ", std::strerror(fork_errno));
    }
    // Also set from this side: whichever runs first, the group exists before we may
    // signal it (EACCES once the child has exec'd is fine).
    setpgid(pid, pid);
    r.rank = opt_.node_rank * opt_.nproc_per_node + local;
    r.pid = pid;
    r.running = true;
    r.out = Stream{out[0], 1, {}};
    r.err = Stream{err[0], 2, {}};
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);

    int exec_errno = 0;
    ssize_t n;
    do n = read(status_pipe[0], &exec_errno, sizeof(exec_errno));
    while (n < 0 && errno == EINTR);
    close(status_pipe[0]);
    if (n == static_cast<ssize_t>(sizeof(exec_errno)))
      fail("launch: cannot execute ", exec_path, ": ", std::strerror(exec_errno));
  }

  void supervise() {
    std::vector<pollfd> fds;
    std::vector<std::pair<Rank*, Stream*>> owners;  // fds[i + 1] belongs to owners[i]
    while (any_running()) {
      fds.assign(1, pollfd{g_signal_pipe[0], POLLIN, 0});
      owners.clear();
      for (Rank& r : ranks_)
        for (Stream* s : {&r.out, &r.err})
          if (s->fd >= 0) {
            fds.push_back(pollfd{s->fd, POLLIN, 0});
            owners.emplace_back(&r, s);
          }
      if (poll(fds.data(), fds.size(), poll_timeout_ms()) < 0 && errno != EINTR)
        fail("launch: poll: ", std::strerror(errno));

      if (fds[0].revents & POLLIN) {
        unsigned char sigs[64];
        ssize_t n;
        while ((n = read(g_signal_pipe[0], sigs, sizeof(sigs))) > 0)
          for (ssize_t i = 0; i < n; ++i)
            if (sigs[i] != SIGCHLD) on_launcher_signal(sigs[i]);
      }
      for (size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents) read_some(*owners[i - 1].first, *owners[i - 1].second);
      reap();  // every wake-up, not only on SIGCHLD: cheap, and nothing can be missed

      const auto now = Clock::now();
      if (term_deadline_ && !kill_deadline_ && now >= *term_deadline_ && any_running()) {
        std::fprintf(stderr, "launch: %s still running %g s after %s; sending SIGKILL\n", running_list().c_str(),
                     opt_.grace_s, signal_name(stop_signal_).c_str());
        signal_running(SIGKILL);
        kill_deadline_ = now + kKillWait;
      }
      if (kill_deadline_ && now >= *kill_deadline_ && any_running()) {
        std::fprintf(stderr, "launch: %s did not exit after SIGKILL; leaving them behind\n", running_list().c_str());
        return;
      }
    }
  }

  void on_launcher_signal(int sig) {
    if (!stopping_) {
      std::fprintf(stderr, "launch: got %s; forwarding it to the ranks (send it again to kill them)\n",
                   signal_name(sig).c_str());
      interrupted_by_ = sig;
      begin_stop(sig);
    } else if (!kill_deadline_) {
      std::fprintf(stderr, "launch: got %s while stopping the ranks; killing them now\n", signal_name(sig).c_str());
      if (!interrupted_by_) interrupted_by_ = sig;
      signal_running(SIGKILL);
      kill_deadline_ = Clock::now() + kKillWait;
    }
  }

  void begin_stop(int sig) {
    stopping_ = true;
    stop_signal_ = sig;
    signal_running(sig);
    term_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opt_.grace_s));
  }

  void reap() {
    for (Rank& r : ranks_) {
      if (!r.running) continue;
      int status = 0;
      pid_t p;
      do p = waitpid(r.pid, &status, WNOHANG);
      while (p < 0 && errno == EINTR);
      if (p == 0) continue;
      if (p < 0) status = 255 << 8;  // ECHILD: reaped behind our back; count it as a failure
      r.running = false;
      r.status = status;
      // Its last words (an error message, usually) come before our verdict on it.
      drain(r, r.out, false);
      drain(r, r.err, false);
      std::fprintf(stderr, "launch: %s\n", rank_line(r).c_str());
      if (!succeeded(status) && !stopping_) {
        first_failure_status_ = status;
        failure_ = rank_failure(r.rank, status);
        std::fprintf(stderr, "launch: %s%s\n", failure_.c_str(), any_running() ? "; stopping the other ranks" : "");
        begin_stop(SIGTERM);
      }
    }
  }

  // Signals each running rank's whole process group (see the top of the file). Ranks
  // already reaped are left alone: their group id may be reused once they are gone.
  void signal_running(int sig) {
    for (Rank& r : ranks_)
      if (r.running) {
        r.sent = sig;
        if (kill(-r.pid, sig) != 0) kill(r.pid, sig);
      }
  }

  void kill_and_reap_all() {
    signal_running(SIGKILL);
    for (Rank& r : ranks_) {
      if (r.running) {
        while (waitpid(r.pid, &r.status, 0) < 0 && errno == EINTR) {
        }
        r.running = false;
      }
      drain(r, r.out, true);
      drain(r, r.err, true);
    }
  }

  ReadResult read_some(const Rank& r, Stream& s) {
    char buf[65536];
    ssize_t n;
    do n = read(s.fd, buf, sizeof(buf));
    while (n < 0 && errno == EINTR);
    if (n < 0 && errno == EAGAIN) return ReadResult::kEmpty;
    if (n <= 0) {  // EOF (or a broken pipe): the last partial line goes out with a newline
      if (!s.pending.empty()) write_all(s.to, prefix(r) + s.pending + "\n");
      s.pending.clear();
      close(s.fd);
      s.fd = -1;
      return ReadResult::kClosed;
    }
    s.pending.append(buf, static_cast<size_t>(n));
    std::string lines;  // all complete lines in one write
    size_t start = 0, nl;
    while ((nl = s.pending.find('\n', start)) != std::string::npos) {
      lines += prefix(r);
      lines.append(s.pending, start, nl + 1 - start);
      start = nl + 1;
    }
    s.pending.erase(0, start);
    if (s.pending.size() >= kMaxLine) {
      lines += prefix(r) + s.pending + "\n";
      s.pending.clear();
    }
    if (!lines.empty()) write_all(s.to, lines);
    return ReadResult::kData;
  }

  // Reads what is in the pipe now. A grandchild of an exited rank may still hold the
  // write end, so "no more data right now" is where a drain ends unless `close_it`.
  void drain(const Rank& r, Stream& s, bool close_it) {
    while (s.fd >= 0 && read_some(r, s) == ReadResult::kData) {
    }
    if (close_it && s.fd >= 0) {
      if (!s.pending.empty()) write_all(s.to, prefix(r) + s.pending + "\n");
      s.pending.clear();
      close(s.fd);
      s.fd = -1;
    }
  }

  static std::string prefix(const Rank& r) { return "[rank " + std::to_string(r.rank) + "] "; }
  // "rank 2 (pid 4242): failed with exit code 3"
  static std::string rank_line(const Rank& r) {
    return "rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + "): " + rank_state(r);
  }

  bool any_running() const {
    for (const Rank& r : ranks_)
      if (r.running) return true;
    return false;
  }

  std::string running_list() const {
    std::string names;
    int count = 0;
    for (const Rank& r : ranks_)
      if (r.running) names += (count++ ? ", " : "") + std::to_string(r.rank);
    return (count == 1 ? "rank " : "ranks ") + names;
  }

  int poll_timeout_ms() const {
    std::optional<Clock::time_point> next = kill_deadline_ ? kill_deadline_ : term_deadline_;
    if (!next) return -1;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(*next - Clock::now()).count();
    return static_cast<int>(std::clamp<long long>(left, 0, INT_MAX));
  }

  const LaunchOptions& opt_;
  std::vector<Rank> ranks_;
  bool stopping_ = false;
  int stop_signal_ = SIGTERM;
  std::optional<Clock::time_point> term_deadline_, kill_deadline_;
  std::optional<int> first_failure_status_;  // wait status of the rank that made us stop
  std::string failure_;                      // "rank 1 was killed by signal 9 (SIGKILL)"
  std::optional<int> interrupted_by_;
};

}  // namespace

void validate_launch_options(const LaunchOptions& opt) {
  ST_CHECK_CONFIG(opt.nproc_per_node >= 1, "launch: --nproc-per-node must be at least 1 (got ", opt.nproc_per_node, ")");
  ST_CHECK_CONFIG(opt.nnodes >= 1, "launch: --nnodes must be at least 1 (got ", opt.nnodes, ")");
  ST_CHECK_CONFIG(opt.node_rank >= 0 && opt.node_rank < opt.nnodes, "launch: --node-rank ", opt.node_rank,
           " is out of range for --nnodes ", opt.nnodes, " (node ranks are 0..", opt.nnodes - 1, ")");
  ST_CHECK_CONFIG(static_cast<long long>(opt.nnodes) * opt.nproc_per_node <= INT_MAX,
           "launch: --nnodes x --nproc-per-node is too large");
  ST_CHECK_CONFIG(opt.master_port >= 1 && opt.master_port <= 65535, "launch: --master-port must be in 1..65535 (got ",
           opt.master_port, ")");
  ST_CHECK_CONFIG(!opt.master_addr.empty(), "launch: --master-addr must not be empty");
  ST_CHECK_CONFIG(std::isfinite(opt.grace_s) && opt.grace_s >= 0 && opt.grace_s <= 3600,
                  "launch: --grace-period must be a number of seconds in [0, 3600] (got ", opt.grace_s, ")");
  ST_CHECK_CONFIG(!opt.args.empty() || !opt.program.empty(),
           "launch: nothing to run: put each rank's shardtrain command after `--`, e.g.\n"
           "  shardtrain launch --nproc-per-node 4 -- train --config configs/tiny.toml");
}

std::map<std::string, std::string> rank_environment(const LaunchOptions& opt, int local_rank,
                                                    std::map<std::string, std::string> env) {
  std::erase_if(env, [](const auto& kv) {
    for (const char* p : kForeignPrefixes)
      if (kv.first.starts_with(p)) return true;
    for (const char* n : kForeignNames)
      if (kv.first == n) return true;
    return false;
  });
  env["RANK"] = std::to_string(opt.node_rank * opt.nproc_per_node + local_rank);
  env["WORLD_SIZE"] = std::to_string(opt.nnodes * opt.nproc_per_node);
  env["LOCAL_RANK"] = std::to_string(local_rank);
  env["LOCAL_WORLD_SIZE"] = std::to_string(opt.nproc_per_node);
  env["GROUP_RANK"] = env["NODE_RANK"] = std::to_string(opt.node_rank);
  env["GROUP_WORLD_SIZE"] = std::to_string(opt.nnodes);
  env["MASTER_ADDR"] = opt.master_addr;
  env["MASTER_PORT"] = std::to_string(opt.master_port);
  // A restarted rank may start over a run directory its failed predecessor left
  // unfinished (torchrun's TORCHELASTIC_RESTART_COUNT, under our own name).
  env["SHARDTRAIN_RESTART_COUNT"] = std::to_string(opt.restart);
  if (!opt.job_id.empty()) env["SHARDTRAIN_JOB_ID"] = opt.job_id;  // the rendezvous refuses other jobs' ranks
  if (!opt.job_secret.empty()) env["SHARDTRAIN_JOB_SECRET"] = opt.job_secret;  // and processes without the secret
  // The launcher prefixes every line with the rank already; the rank need not.
  env["SHARDTRAIN_RANK_PREFIXED"] = "1";
  return env;
}

int launch_local_ranks(const LaunchOptions& opt) {
  validate_launch_options(opt);
  std::string first_failure;  // what made the first restart necessary
  auto failures = [&](const std::string& last) {
    return first_failure.empty() || first_failure == last ? "the last failure: " + last
                                                          : "the first failure: " + first_failure + "; the last: " + last;
  };
  for (int attempt = 0;; ++attempt) {
    LaunchOptions this_start = opt;
    this_start.restart = attempt;
    Launcher launcher(this_start);
    const int code = launcher.run();
    // Restart on a rank's failure (torchelastic's rule: stop them all, start them all),
    // never when the launcher itself was told to stop.
    // A rank that exits 2 (usage/configuration) or 3 (input data or model files) would
    // fail the same way again: no restart, and the launch exits with that code, also
    // when another rank's failure (caused by it) came first.
    const auto repeating = launcher.interrupted() ? std::nullopt : launcher.repeating_failure();
    if (repeating && (opt.max_restarts > 0 || repeating->code != code)) {
      const std::string first = !first_failure.empty()                  ? first_failure
                                : launcher.failure() != repeating->what ? launcher.failure()
                                                                        : "";
      std::fprintf(stderr, "launch: %s%s (%s)%s%s\n", opt.max_restarts > 0 ? "not restarting: " : "exiting with its status: ",
                   repeating->what.c_str(),
                   repeating->code == kExitUsage ? "a usage or configuration error"
                                                 : "an error in input data or model files",
                   opt.max_restarts > 0 ? ", which a restart would repeat" : "",
                   first.empty() ? "" : ("; the first failure: " + first).c_str());
      return repeating->code;
    }
    if (code == 0 || launcher.interrupted() || attempt >= opt.max_restarts) {
      if (code != 0 && opt.max_restarts > 0 && !launcher.interrupted())
        std::fprintf(stderr, "launch: giving up after %d restart%s; %s\n", opt.max_restarts,
                     opt.max_restarts == 1 ? "" : "s", failures(launcher.failure()).c_str());
      return code;
    }
    if (first_failure.empty()) first_failure = launcher.failure();
    std::fprintf(stderr, "launch: restart %d of %d after %s\n", attempt + 1, opt.max_restarts,
                 launcher.failure().c_str());
    std::fflush(nullptr);
  }
}

}  // namespace st

// Test helpers for multi-rank tests: each rank is a forked child process, the way
// ranks really run (their own sockets, their own Gloo threads, exiting for real).
// The parent only forks and collects, so it never holds threads across a fork.
#pragma once
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace st::test {

// A TCP port that was free a moment ago (bound to port 0, then released).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Runs fn(rank) for rank 0..world-1, each in a forked child. Returns one entry per
// rank: "" when fn returned, else the exception's message (or how the child died).
// Children still running after deadline_s are killed and reported as such.
inline std::vector<std::string> run_ranks(int world, const std::function<void(int)>& fn, double deadline_s = 60) {
  std::fflush(nullptr);  // or buffered output would be written once per child
  std::vector<pid_t> pids(world);
  std::vector<int> pipes(world);
  for (int r = 0; r < world; ++r) {
    int p[2];
    if (::pipe(p) != 0) return std::vector<std::string>(world, "pipe failed");
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      for (int q = 0; q < r; ++q) ::close(pipes[q]);
      std::string err;
      try {
        fn(r);
      } catch (const std::exception& e) {
        err = e.what();
        if (err.empty()) err = "exception without a message";
      } catch (...) {
        err = "unknown exception";
      }
      for (size_t off = 0; off < err.size();) {
        const ssize_t n = ::write(p[1], err.data() + off, err.size() - off);
        if (n <= 0) break;
        off += static_cast<size_t>(n);
      }
      std::fflush(nullptr);
      ::_exit(err.empty() ? 0 : 1);  // no atexit handlers, no gtest teardown in children
    }
    ::close(p[1]);
    pids[r] = pid;
    pipes[r] = p[0];
  }
  std::vector<std::string> out(world);
  std::vector<bool> open(world, true);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(deadline_s);
  int left = world;
  while (left > 0) {
    std::vector<pollfd> fds;
    std::vector<int> which;
    for (int r = 0; r < world; ++r)
      if (open[r]) {
        fds.push_back({pipes[r], POLLIN, 0});
        which.push_back(r);
      }
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (ms.count() <= 0 || ::poll(fds.data(), fds.size(), static_cast<int>(ms.count())) == 0) break;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      char buf[4096];
      const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        out[which[i]].append(buf, static_cast<size_t>(n));
      } else {
        open[which[i]] = false;
        --left;
      }
    }
  }
  for (int r = 0; r < world; ++r) {
    if (open[r]) {
      ::kill(pids[r], SIGKILL);
      out[r] = "still running after " + std::to_string(deadline_s) + " s: killed";
    }
    ::close(pipes[r]);
    int status = 0;
    ::waitpid(pids[r], &status, 0);
    if (out[r].empty() && WIFSIGNALED(status)) out[r] = "killed by signal " + std::to_string(WTERMSIG(status));
    if (out[r].empty() && WIFEXITED(status) && WEXITSTATUS(status) != 0)
      out[r] = "exited with status " + std::to_string(WEXITSTATUS(status));
  }
  return out;
}

}  // namespace st::test

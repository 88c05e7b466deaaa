#include "deploy/tools.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.h"

extern char** environ;

namespace st {

std::string shell_word(const std::string& w) {
  const bool safe = !w.empty() && w.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                                      "@%+=:,./_-") == std::string::npos;
  if (safe) return w;
  std::string q = "'";
  for (char c : w) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string shell_line(const std::vector<std::string>& argv) {
  std::string s;
  for (const std::string& a : argv) s += (s.empty() ? "" : " ") + shell_word(a);
  return s;
}

std::string ToolRun::line() const { return shell_line(argv); }

std::string ToolRun::err_tail(size_t lines) const {
  const std::string& text = err.empty() ? out : err;
  std::vector<std::string> all;
  std::stringstream ss(text);
  for (std::string l; std::getline(ss, l);) all.push_back(l);
  std::string tail;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) tail += "  | " + all[i] + "\n";
  return tail;
}

bool tool_on_path(const std::string& tool) {
  if (tool.find('/') != std::string::npos) return ::access(tool.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "");
  for (std::string dir; std::getline(ss, dir, ':');) {
    const std::string p = (dir.empty() ? "." : dir) + "/" + tool;
    struct stat st;
    if (::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0) return true;
  }
  return false;
}

std::string install_hint(const std::string& tool) {
  if (tool == "kubectl" || tool == "helm")
    return "scripts/get_kube_tools.sh installs kubectl 1.35 and helm 4.1 into .tools/bin (put it on PATH)";
  if (tool == "eksctl") return "install eksctl 0.230 or later: https://eksctl.io/installation/";
  if (tool == "aws") return "install the AWS CLI v2: https://docs.aws.amazon.com/cli/latest/userguide/getting-started-install.html";
  return "install it and put it on PATH";
}

ToolRun ToolRunner::run(const std::vector<std::string>& argv) const {
  ST_CHECK(!argv.empty(), "deploy: empty command");
  ToolRun r;
  r.argv = argv;
  const auto t0 = std::chrono::steady_clock::now();
  int out_pipe[2], err_pipe[2];
  ST_CHECK(::pipe2(out_pipe, O_CLOEXEC) == 0 && ::pipe2(err_pipe, O_CLOEXEC) == 0, "deploy: pipe failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err_pipe[1], 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, argv[0].c_str(), &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (rc != 0) {
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    r.code = 127;
    r.err = argv[0] + ": cannot run it (" + std::string(std::strerror(rc)) + "); " + install_hint(argv[0]);
  } else {
    pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
    std::string* bufs[2] = {&r.out, &r.err};
    int open_fds = 2;
    char buf[65536];
    while (open_fds > 0) {
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        break;
      }
      for (int i = 0; i < 2; ++i) {
        if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
        if (n > 0) {
          bufs[i]->append(buf, static_cast<size_t>(n));
        } else if (n == 0 || errno != EINTR) {
          ::close(fds[i].fd);
          fds[i].fd = -1;
          --open_fds;
        }
      }
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!log_.empty()) {
    std::ofstream log(log_, std::ios::app);
    log << "$ " << r.line() << "\n" << r.out << (r.out.empty() || r.out.back() == '\n' ? "" : "\n");
    if (!r.err.empty()) log << "[stderr]\n" << r.err << (r.err.back() == '\n' ? "" : "\n");
    char tail[64];
    std::snprintf(tail, sizeof tail, "exit %d after %.1f s\n\n", r.code, r.seconds);
    log << tail;
  }
  return r;
}

}  // namespace st

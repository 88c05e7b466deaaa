// Runs a shell command for a test and returns its exit code, its output (stdout and
// stderr together) and how long it took: the binary as a user runs it.
#pragma once
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <string>

namespace st::testing {

struct ShellResult {
  int code;         // exit status; -1 when killed by a signal
  std::string out;  // stdout and stderr together
  double seconds;
};

inline ShellResult run_shell(const std::string& cmd) {
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while (p && (n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = p ? pclose(p) : -1;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, s};
}

}  // namespace st::testing

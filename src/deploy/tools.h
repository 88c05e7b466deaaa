// Running the real command-line tools `deploy` drives (aws, eksctl, helm, kubectl):
// one process per call, stdout and stderr captured apart, every command and its
// output appended to a log, and a missing tool named with how to install it.
#pragma once
#include <string>
#include <vector>

namespace st {

struct ToolRun {
  std::vector<std::string> argv;
  int code = 0;          // exit status; 128 + signal when killed; 127 when it could not start
  std::string out, err;  // stdout, stderr
  double seconds = 0;
  std::string line() const;  // the command as a shell would show it
  std::string err_tail(size_t lines = 12) const;
};

class ToolRunner {
 public:
  // log_path "": no log. Otherwise each run is appended there ("$ command", its
  // output, "exit N after S s").
  explicit ToolRunner(std::string log_path = "") : log_(std::move(log_path)) {}
  ToolRun run(const std::vector<std::string>& argv) const;
  const std::string& log_path() const { return log_; }

 private:
  std::string log_;
};

// Whether `tool` is an executable on PATH.
bool tool_on_path(const std::string& tool);
// How to get it ("scripts/get_kube_tools.sh puts kubectl 1.35 into .tools/bin", ...).
std::string install_hint(const std::string& tool);

// A POSIX shell word / command line for messages and logs.
std::string shell_word(const std::string& w);
std::string shell_line(const std::vector<std::string>& argv);

}  // namespace st

// What a run reports: one line per logged step, a JSONL record per step in the run
// directory, and a progress bar redrawn in place when stdout is a terminal.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace st {

struct StepMetrics {
  int step = 0;            // 1-based, as printed
  int total_steps = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  double tokens_per_s = 0; // this step's global tokens / its wall time
  double step_s = 0;       // this step's wall time
  double elapsed_s = 0;    // since training began
  int64_t tokens = 0;      // global tokens seen so far
  double tflops = 0;       // model TFLOP/s per rank (flops_per_token x tokens/s / ranks)
  double mfu = 0;          // tflops / peak; 0 when the peak is unknown
};

std::string format_step_line(const StepMetrics& m);

class MetricsLog {
 public:
  // Opens path, truncated or (append, a resumed run) appended to; an empty path
  // writes nothing.
  explicit MetricsLog(const std::string& path, bool append = false);
  void write(const nlohmann::json& record);  // one line, flushed
  void write_step(const StepMetrics& m);

 private:
  std::ofstream out_;
  std::string path_;
};

// The run.progress choices: auto (a bar only on a terminal), on, off.
const std::vector<std::string>& progress_modes();

class ProgressBar {
 public:
  // mode: "auto" (only when stdout is a terminal), "on", "off".
  explicit ProgressBar(const std::string& mode);
  bool enabled() const { return enabled_; }
  void update(const StepMetrics& m);
  void clear();  // erase the bar before printing a normal line

 private:
  bool enabled_ = false, drawn_ = false;
};

}  // namespace st

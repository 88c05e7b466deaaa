// What a run reports: one line per logged step, a JSONL record per step in the run
// directory, and a progress bar redrawn in place when stdout is a terminal.
// (TensorBoard events: metrics/tb_events.h.)
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
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
  // The backend's high-water mark of allocated memory: since the start for step 1,
  // since the end of step 1 after it (the trainer resets it there); 0 where the
  // backend does not track it. The backend has no "allocated now" query.
  size_t peak_memory_bytes = 0;
  double eta_s = -1;       // time left (EtaEstimator); < 0 when not known
  // This rank's collectives in the step (comm/comm_stats.h): bytes sent, by kind (a
  // ring rank receives as much), the part sent to a rank on another node, and the
  // host time spent inside collectives (on the CPU backend, what compute waited for).
  uint64_t comm_all_gather_bytes = 0, comm_reduce_scatter_bytes = 0, comm_all_reduce_bytes = 0,
           comm_broadcast_bytes = 0;
  uint64_t comm_inter_node_bytes = 0;
  double comm_blocked_s = 0;
  uint64_t comm_bytes() const {
    return comm_all_gather_bytes + comm_reduce_scatter_bytes + comm_all_reduce_bytes + comm_broadcast_bytes;
  }
};

// "step 12/300 | loss ... | elapsed 1m02s | eta 4m40s" (eta only when known).
std::string format_step_line(const StepMetrics& m);

// A duration as people read it: "45s", "3m20s", "1h02m"; "?" when negative or not finite.
std::string human_duration(double seconds);

// The time a run has left: the steps still to go times the mean time of the most
// recent steps (the last `window`). The first step a process runs includes its
// warm-up, so it counts only until a second step is known.
class EtaEstimator {
 public:
  explicit EtaEstimator(size_t window = 20) : window_(window) {}
  // Adds the time of step `step` (1-based) of `total_steps`; returns the seconds left.
  double update(int step, int total_steps, double step_s);

 private:
  size_t window_;
  std::deque<double> recent_;
  double first_s_ = -1;
};

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

class ProgressBar {
 public:
  // mode: "auto" (only when stdout is a terminal), "on", "off".
  explicit ProgressBar(const std::string& mode);
  bool enabled() const { return enabled_; }
  // "[#####.....] 120/300  40% loss 2.3456 12.3K tok/s eta 3m20s", redrawn in place.
  void update(const StepMetrics& m);
  void clear();  // erase the bar before printing a normal line

 private:
  bool enabled_ = false, drawn_ = false;
};

}  // namespace st

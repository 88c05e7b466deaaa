// `shardtrain report --scaleout OUT`: the emulated cluster's results (bench/scaleout.sh
// writes OUT/scaleout.json; docs/scaleout_bench.md lists its fields) as one HTML page:
// the sweep's header, a plot of steps/s against link rate (measured and predicted, one
// pair of lines per shape and strategy), the runs' table and the faults' table.
//
//   ScaleoutData d = read_scaleout("bench-out/scaleout");   // the folder or its scaleout.json
//   write_report("scaleout.html", render_scaleout_page(d));
//   write_report("docs/scaleout_steps.svg", render_scaleout_svg(d));   // the plot alone
//
// Errors (st::Error, exit 3) name the file and the record ("runs[4]: \"step_s\" ...").
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace st {

struct ScaleoutRun {
  int nodes = 0, ranks_per_node = 0;
  std::string strategy;               // "fsdp" | "hsdp"
  std::optional<double> link_mbit;    // none: no limit
  double delay_ms = 0;
  bool ok = false;                    // every node exited 0 with every step done
  bool overlap = false;               // dist.overlap (absent in older sweeps, which ran without it)
  std::optional<double> step_s, tokens_per_s, predicted_step_s, tcp_one_flow_mbit;
  std::optional<double> exposed_comm_s;  // rank 0's median comm_blocked_s
  std::vector<double> tx_bytes_per_step;  // per node, from the interface counters
  std::optional<double> comm_inter_tx_bytes_per_step;  // what the run's own comm_* fields counted
  std::string name;

  std::string series() const;  // "2x1 fsdp" ("2x1 fsdp, no overlap"): the runs a line joins
};

struct ScaleoutFault {
  std::string kind, outcome, name;
  bool meets_goal = false;
  std::vector<int> exit_codes;
  std::string node0_error;  // node 0's last error line ("" when none)
};

struct ScaleoutData {
  std::string path;  // the scaleout.json read
  std::string date, commit, kernel;
  int nproc = 0;
  std::string params;  // the model's size as the bench wrote it ("20.66M")
  std::string load_start, load_end;
  bool netem = false;
  std::vector<ScaleoutRun> runs;
  std::vector<ScaleoutFault> faults;
};

// `path` is scaleout.json or the folder holding it.
ScaleoutData read_scaleout(const std::string& path);

// The plot alone: a standalone SVG document (for docs/), and the whole page.
std::string render_scaleout_svg(const ScaleoutData& d);
std::string render_scaleout_page(const ScaleoutData& d);

}  // namespace st

// What `shardtrain report` reads from a run directory (what `shardtrain train` writes
// under run.out_dir): config.toml (config/run_config.h's tolerant reader),
// metrics.jsonl, summary.json (metrics/run_summary.h), maybe profile.json, and the
// labels that tell runs apart on the page.
//
//   std::vector<RunData> runs = {read_run("runs/a"), read_run("runs/b")};
//   label_runs(runs);                         // "a (mb16)", "b (mb8)"
//
// Errors (st::Error) name the file, and the line for metrics.jsonl and JSON files.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/run_config.h"
#include "fabric/transport_report.h"
#include "metrics/run_summary.h"

namespace st {

// One step record of metrics.jsonl, as written by MetricsLog::write_step; a key the
// record does not have (or null: a non-finite number) is left out of `values`.
struct StepRecord {
  int step = 0;
  nlohmann::json values;  // the record's numeric fields by key
};

struct RunData {
  std::string dir;    // as given
  std::string name;   // the directory's own name ("r8" for runs/r8/)
  std::string label;  // in legends and headers: name, plus what sets it apart (label_runs)

  RunConfig config;           // config.toml, as `shardtrain train --config` reads it
  std::string model_note;     // why the model's dimensions are unknown ("" when they are known)
  std::optional<RunSummary> summary;        // summary.json, when the run wrote one
  std::optional<FabricReport> transport;    // the last {"transport_report": ...} of metrics.jsonl
  std::optional<nlohmann::json> profile;    // profile.json, when there
  std::vector<StepRecord> steps;            // by step; a step logged twice (a resumed run) keeps its last record

  // Ranks: summary.json's "world", else the transport report's rank count, else the
  // tokens one step added over micro_batch x seq_len x grad_accum; 0 when unknown.
  int world = 0;
  std::string world_from;  // "summary.json", "transport report", "tokens per step"

  bool finished() const { return summary && summary->finished(); }
  bool interrupted() const { return summary && !summary->finished(); }
};

// Reads one run directory. A directory that is missing, or lacks config.toml or
// metrics.jsonl, a metrics.jsonl line that is not a JSON object or whose step record
// has a non-numeric field ("<dir>/metrics.jsonl:7: ..."), and a summary.json or
// profile.json that is not JSON or not of the expected shape are errors naming the
// file (and line). No summary.json is not an error: the run is unfinished.
RunData read_run(const std::string& dir);

// Sets each run's label: `labels[i]` when given (then labels.size() must equal
// runs.size()), else the directory's name (with its parent where two names are the
// same), followed by what differs between the runs: "mb16" (micro_batch), "ga4"
// (grad_accum), "T2048" (seq_len), "w8" (world size), the transport ("efa", "ib",
// "socket") and the device ("cpu", "cuda"), e.g. "r8 (mb8)".
void label_runs(std::vector<RunData>& runs, const std::vector<std::string>& labels = {});

// The device the run trained on: summary.json's backend, else train.device.
std::string backend_of(const RunData& r);
// Tokens one rank takes per optimizer step: micro_batch x seq_len x grad_accum.
long long tokens_per_rank_step(const RunConfig& c);

}  // namespace st

// summary.json: what a run leaves in run.out_dir when it ends. A finished run writes
// its totals (steps, world, throughput, MFU, peak memory, ...); a run stopped by a
// signal writes "interrupted": true, the signal, the steps done and where its
// checkpoint is, and "checkpoint_incomplete" when run.term_grace_s passed before
// that checkpoint was written. The trainer reads it to tell a finished run in
// run.out_dir from one that stopped half way; `shardtrain report` reads it for the
// run's status and totals.
//
// Every key is optional: a field is written only when it is set, and reading sets
// only the keys the file has (a summary of another version or a hand-written one),
// so a summary read and written again gives the same bytes. The text is
// nlohmann::json's dump(1): one key a line, in sorted order. Keys it does not know
// are ignored.
//
// It belongs to the metrics room (core and nlohmann::json only), so the report reads it
// without linking the trainer.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace st {

struct RunSummary {
  // Every summary.
  std::optional<int> steps;  // train.steps
  // A run stopped by a signal.
  std::optional<bool> interrupted;  // true; a finished run's summary has no "interrupted"
  std::optional<int> signal;
  std::optional<int> steps_done;
  std::optional<std::string> checkpoint;             // where to continue from; "" when nothing was saved
  std::optional<std::string> checkpoint_incomplete;  // why the checkpoint of steps_done is not there
  std::optional<double> last_loss;
  // A finished run.
  std::optional<int> world;  // ranks (read only when a whole number)
  std::optional<std::string> backend, model;
  std::optional<int> seq_len, micro_batch, grad_accum;
  std::optional<double> first_loss, final_loss;
  std::optional<double> tokens_per_s, tokens_per_s_per_rank;  // global and per rank, mean after step 1
  std::optional<double> flops_per_token, tflops_per_rank, mfu, peak_tflops;
  std::optional<uint64_t> peak_memory_bytes;       // per rank, after step 1 (a negative number reads as 0)
  std::optional<double> first_step_after_start_s;  // from the process start to the end of the first step
  // Rank 0's collectives per step (bytes sent, the part to other nodes, host time
  // inside collectives), mean after step 1; runs of more than one rank.
  std::optional<double> comm_bytes_per_step, comm_inter_node_bytes_per_step, comm_blocked_s_per_step;

  bool finished() const { return !interrupted.value_or(false); }
};

void to_json(nlohmann::json& j, const RunSummary& s);
// A key of the wrong type is an error naming the key; from_json says "summary.json".
void from_json(const nlohmann::json& j, RunSummary& s);
// As from_json, with errors that name `path` and the line of the key in `text`
// (the file's text; "" for none): "<path>:3: \"world\" must be a number, got string".
RunSummary run_summary_from_json(const nlohmann::json& j, const std::string& path, const std::string& text);

// summary.json's bytes (the caller writes them, e.g. with write_text_atomic).
std::string run_summary_text(const RunSummary& s);
// Reads summary.json. A file that cannot be read, is not a JSON object, or has a key
// of the wrong type is an st::Error (kind Data) naming the file and, where it can,
// the line.
RunSummary read_run_summary(const std::string& path);

}  // namespace st

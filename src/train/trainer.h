// The training loop: data -> forward/backward per micro-batch -> gradient
// reduction -> clipping -> AdamW, with the step line, JSONL metrics and progress bar.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/profiler.h"
#include "data/source.h"
#include "comm/comm.h"
#include "comm/process_groups.h"
#include "fabric/transport_report.h"
#include "fsdp/fsdp.h"
#include "model/layout.h"
#include "model/qwen2.h"
#include "metrics/metrics.h"
#include "config/run_config.h"
#include "train/schedule.h"

namespace st {

struct CheckpointManifest;
struct CheckpointSchedule;
class GraceWatchdog;
struct RunSummary;
struct StopRequest;

struct TrainResult {
  std::vector<double> losses;      // per step, mean over the global batch
  std::vector<double> grad_norms;  // per step, before clipping
  double tokens_per_s = 0;         // global, over all steps but the first
  double tflops_per_rank = 0;      // model FLOPs, same steps
  double mfu = 0;                  // 0 when the device peak is unknown
  size_t peak_memory_bytes = 0;    // backend's high-water mark (0 when not tracked)
  // This rank's collectives per step, mean over the same steps (comm/comm_stats.h).
  double comm_bytes_per_step = 0, comm_inter_node_bytes_per_step = 0, comm_blocked_s_per_step = 0;
};

class Trainer {
 public:
  // out_dir empty: nothing is written to disk (tests). `groups` outlives the trainer.
  // `fabric`: the transport report of an NCCL run (null otherwise).
  Trainer(const RunConfig& cfg, Backend& backend, ProcessGroups& groups,
          std::shared_ptr<const FabricReport> fabric = nullptr);
  ~Trainer();

  void print_header() const;
  // What the memory table adds up to: shards, the gathered peak, activations, workspace.
  size_t estimated_peak_bytes() const;
  GatheredMemory gathered_estimate() const;  // gathered units at the peak of a step
  // "memory in step 1: peak X measured, Y estimated; gathered units ..." (rank 0 prints it).
  std::string memory_check_line(size_t measured_peak) const;
  // One optimizer step (0-based); returns its metrics.
  StepMetrics step(int s);
  // All cfg.steps steps with output; `verbose` false prints nothing.
  TrainResult run(bool verbose = true);
  // The launcher's restart count (DistEnv::restart_count): a restart without a
  // checkpoint starts again from step 0 over the unfinished run its failed
  // predecessor left, which a first start refuses.
  void set_restart_count(int count) { restart_count_ = count; }

  // Writes the current weights in Hugging Face format (collective; rank 0 writes).
  void export_model(const std::string& dir, DType dtype);

  Fsdp& params() { return *fsdp_; }
  // Where checkpoints go ("" when the run writes nothing).
  std::string checkpoint_dir() const;
  const ParamLayout& layout() const { return *layout_; }

 private:
  // Loads the checkpoint run.resume names (collective); returns the steps already done.
  int resume();
  // Refuses (or, under run.resume_config=override, warns about) resuming from the
  // checkpoint at `path` under other settings than its own (collective; rank 0 reads).
  void check_resume_settings(const std::string& path);
  // After a resume's load: the model continues from the checkpoint's FP8 scaling state
  // where it has one that fits (else says why, with delayed scaling).
  void restore_fp8_scaling(const CheckpointManifest& m, const std::string& path);
  // run.profile: opens, counts and closes the window around step s; prints the table.
  void profile_step(int s, int first, const StepMetrics& m, bool out);

  // The parts of run(), in its order.
  struct RunState;
  // run.out_dir (config.toml, metrics.jsonl, tb/), the header, the transport check.
  RunState open_outputs(int start, bool out);
  CheckpointSchedule checkpoint_schedule(RunState& st) const;
  // Step s into the result, metrics.jsonl, TensorBoard and the profile window.
  void record_step(RunState& st, int s, StepMetrics& m);
  // The step line (and after the first step, its memory and start-up lines), the bar.
  void print_step(RunState& st, const StepMetrics& m, bool first, size_t step1_peak, bool stop);
  // After a stop at step `done`: run.term_grace_s for its checkpoint (null: no stop).
  std::unique_ptr<GraceWatchdog> watch_grace(const StopRequest& stop, int done, bool out);
  // summary.json of an interrupted run; throws st::Interrupted.
  [[noreturn]] void stop_interrupted(RunState& st, int sig);
  // The done line, summary.json and run.export_dir.
  TrainResult finish(RunState& st);
  RunSummary finished_summary(const TrainResult& r) const;

  RunConfig cfg_;
  // run.profile: every op goes through this timing wrapper of the backend.
  std::unique_ptr<ProfilingBackend> prof_;
  Backend& be_;
  Comm& comm_;   // the whole world: data positions, loss and token counts
  Comm& shard_;  // the ranks that shard the model together
  Comm* replicate_;
  std::shared_ptr<CommStats> comm_stats_;  // what the three groups moved (comm/comm_stats.h)
  std::shared_ptr<const FabricReport> fabric_;  // NCCL runs: the transport report (null otherwise)
  std::unique_ptr<ParamLayout> layout_;
  std::unique_ptr<ShardPlan> plan_;
  std::unique_ptr<Fsdp> fsdp_;
  std::unique_ptr<Qwen2Model> model_;
  std::unique_ptr<TokenSource> data_;
  LrSchedule schedule_;
  std::vector<Batch> batches_;
  int64_t tokens_seen_ = 0;
  double flops_per_token_ = 0, peak_tflops_ = 0;
  // The backend's workspace before the first step (cuBLASLt's), and what cuDNN attention
  // will add at its first call (attention_workspace_bytes; 0 on the CPU).
  size_t base_workspace_ = 0, attention_workspace_ = 0;
  double t_start_ = 0;
  std::string resumed_from_;
  double load_s_ = 0;
  double profile_ms_ = 0;  // step time summed over the profile window
  double first_step_after_start_ = 0;  // seconds from process start to the end of the first step
  int restart_count_ = 0;
};

}  // namespace st

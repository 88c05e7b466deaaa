// Saving and loading the sharded training state (fp32 master weights, AdamW m and
// v) as the checkpoints of io/checkpoint.h. Both are collective over the world.
// Loading works at any world size and shard group size: each rank takes its slice of
// every unit from the saved shards by range arithmetic (ShardPlan::pieces_from).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "fsdp/fsdp.h"
#include "io/checkpoint.h"
#include "config/model_config.h"

namespace st {

struct CheckpointSave {
  std::string dir;            // the checkpoint directory (step-N goes inside)
  int step = 0;               // optimizer steps done
  uint64_t tokens_seen = 0;
  uint64_t seed = 0;
  std::string run_config;     // TOML, for the record
  int keep_last = 0;          // > 0: prune to this many afterwards
  nlohmann::json fp8_scaling;  // the manifest's FP8 scaling state (null: none)
};

// When a run saves (run.checkpoint_every) and what each of its saves records.
struct CheckpointSchedule {
  CheckpointSave save;  // dir ("": the run saves nothing), seed, run_config, keep_last; step and tokens_seen per save
  int every = 0;        // after every `every`-th step and after the last one; 0: never
  int last_step = 0;    // train.steps
  // Prints a line about a save (the trainer's: on rank 0, past its progress bar).
  std::function<void(const std::string&)> say;
  // The FP8 scaling state to record with each save (asked on rank 0, at the save's
  // step boundary); unset or null: none.
  std::function<nlohmann::json()> fp8_scaling;
};

// A checkpoint written in the background while training goes on: begin() copies
// this rank's shards to host memory (the only part that stops training) and starts
// a thread that writes and hashes its file; poll() at a step boundary commits the
// checkpoint (rank 0 writes the manifest last and renames step-N.tmp) once every
// writer has finished. Each shard group's first replica writes its shard rank's
// file. A failure on any rank is an st::Error on every rank at the next poll, and
// leaves only step-N.tmp behind. One save at a time: begin waits for the last.
class CheckpointWriter {
 public:
  CheckpointWriter() = default;
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Collective over the world.
  void begin(const CheckpointSave& what, const ModelConfig& model, Fsdp& fsdp, Comm& world, Comm& shard,
             Comm* replicate);
  // Collective while a save is pending: commits it when every writer is done (or,
  // with wait, after waiting for this rank's). Returns the committed directory, or
  // "" while it is still being written (or when none is pending).
  std::string poll(Comm& world, bool wait);
  bool pending() const { return pending_; }

  // A run's schedule at the boundary after step `step` (collective): commits a save
  // that has finished meanwhile; then, when a save is due (or `stop` asks for one and
  // the run saves at all), waits for the one in flight and begins this one, and
  // waits for it too when it is the last step's or a stop's. Says what it does.
  void maybe_save(const CheckpointSchedule& when, int step, uint64_t tokens_seen, bool stop, const ModelConfig& model,
                  Fsdp& fsdp, Comm& world, Comm& shard, Comm* replicate);
  // After a run's last step (collective): waits for a save still in flight.
  void finish(const CheckpointSchedule& when, Comm& world);

 private:
  void join();
  // The host copy for pieces of these sizes (floats, in save order): page-locked
  // chunks of at least 1 GiB, allocated at the first save and kept. Page-locking
  // 18.5 GB takes about 10 s and holds up every CUDA call of the process meanwhile
  // (allocated on a thread at the start, it delayed the first step by as much), so it
  // is paid once, at the first save.
  void ensure_host(Backend& owner, const std::vector<size_t>& pieces);
  void free_host();
  struct State;
  std::shared_ptr<State> state_;
  bool pending_ = false;
  double began_ = 0;  // when the save in flight had its shards copied (maybe_save)
  // The shards' host copy, kept from one save to the next (page-locked where the
  // backend offers it, so the copy runs at the bus's rate).
  struct HostChunk {
    float* data = nullptr;
    bool pinned = false;
  };
  Backend* host_owner_ = nullptr;
  std::vector<HostChunk> host_chunks_;
  std::vector<size_t> host_sizes_;   // the piece sizes the layout was made for
  std::vector<float*> host_pieces_;  // where each piece goes
};

// begin + poll(wait): the whole save, synchronously. Returns the directory written.
std::string save_checkpoint(const CheckpointSave& what, const ModelConfig& model, Fsdp& fsdp, Comm& world,
                            Comm& shard, Comm* replicate);

// Loads step_dir into fsdp. Rank 0 checks every file's size and hash first; a
// corrupt, truncated or missing file, or a checkpoint of another model, is an
// st::Error on every rank naming the file (rank 0) before any state changes.
CheckpointManifest load_checkpoint(const std::string& step_dir, const ModelConfig& model, Fsdp& fsdp, Comm& world,
                                   Comm& shard);

// The model's dimensions as the manifest records them.
nlohmann::json model_identity(const ModelConfig& m);

}  // namespace st

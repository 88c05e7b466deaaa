// Saving and loading the sharded training state (fp32 master weights, AdamW m and
// v) as the checkpoints of io/checkpoint.h. Both are collective over the world.
// Loading works at any world size and shard group size: each rank takes its slice of
// every unit from the saved shards by range arithmetic (ShardPlan::pieces_from).
#pragma once
#include <string>

#include "comm/comm.h"
#include "fsdp/fsdp.h"
#include "io/checkpoint.h"
#include "model/config.h"

namespace st {

struct CheckpointSave {
  std::string dir;            // the checkpoint directory (step-N goes inside)
  int step = 0;               // optimizer steps done
  uint64_t tokens_seen = 0;
  uint64_t seed = 0;
  std::string run_config;     // TOML, for the record
  int keep_last = 0;          // > 0: prune to this many afterwards
};

// Writes step-N: each shard group's first replica writes its shard rank's file, rank
// 0 the manifest last. Returns the directory written. A failure on any rank is an
// st::Error on every rank, and leaves only step-N.tmp behind.
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

// Sharded training checkpoints on disk. A checkpoint of step N is a directory
//   <checkpoint_dir>/step-N/
//     shard-00000-of-00004.safetensors   one per shard rank: per unit "<unit>.master",
//     ...                                "<unit>.m", "<unit>.v" (f32, the rank's slice)
//     manifest.json                      written last: step, the shard plan, the model,
//                                        the run config, the data position, the FP8
//                                        scaling state (FP8 runs), and each file's
//                                        size and XXH3-128 hash
// It is written as step-N.tmp/ (files and the directory fsynced), renamed to step-N/,
// and then the file `latest` (naming it) is replaced atomically; so a directory
// without the .tmp suffix and with a manifest is complete, and a killed save leaves
// only a .tmp directory, which nothing ever loads.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace st {

struct CheckpointFile {
  std::string name;     // relative to the checkpoint directory
  uint64_t bytes = 0;
  std::string xxh3;     // XXH3-128 of the whole file, 32 hex digits
};

struct CheckpointUnit {
  std::string name;     // "embed", "layers.3", "final"
  uint64_t numel = 0, padded_numel = 0, shard_numel = 0;
};

struct CheckpointManifest {
  int step = 0;                        // optimizer steps done; training resumes at step + 1
  int shard_world = 1;                 // ranks the units were split over (a shard group)
  int replicas = 1;                    // HSDP shard groups holding the same shards
  std::vector<CheckpointUnit> units;   // the shard plan
  nlohmann::json model;                // the model's dimensions (must match to load)
  std::string run_config;              // the run config as TOML, for the record
  uint64_t seed = 0;
  uint64_t tokens_seen = 0;
  std::vector<CheckpointFile> files;
  // The FP8 scaling state (train/fp8_scaling_record.h's form); null when the run saved
  // none (not FP8, or a checkpoint from before it was saved).
  nlohmann::json fp8_scaling;
  nlohmann::json to_json() const;
  static CheckpointManifest from_json(const nlohmann::json& j, const std::string& where);
};

// "shard-00001-of-00004.safetensors"
std::string checkpoint_shard_file(int shard_rank, int shard_world);
// "<dir>/step-<step>"
std::string checkpoint_step_dir(const std::string& dir, int step);

// XXH3-128 of a file, as 32 hex digits; st::Error naming the file when unreadable.
std::string file_xxh3(const std::string& path);

// Writes manifest.json into `tmp_dir` (fsynced), then renames tmp_dir to its final
// name (tmp_dir without ".tmp"), fsyncs the parent, and points `<parent>/latest` at it.
void commit_checkpoint(const std::string& tmp_dir, const CheckpointManifest& m);

// The newest complete checkpoint under `dir` (the one `latest` names when it is
// complete, else the highest step-N with a manifest), or nullopt when there is none.
// `passed_over` (when given) gets the step-N directories newer than that one which
// have no manifest (damaged, or emptied by hand), newest first, for a warning.
std::optional<std::string> find_latest_checkpoint(const std::string& dir,
                                                  std::vector<std::string>* passed_over = nullptr);

// Reads and checks a checkpoint directory: the manifest parses, every file it lists
// exists with its size and (with verify_hashes) its hash. st::Error naming the file.
CheckpointManifest read_checkpoint(const std::string& step_dir, bool verify_hashes);

// Removes all but the newest `keep` complete checkpoints (and any stale .tmp ones).
// Each goes all or nothing: it is renamed to step-N.deleting first, which nothing
// loads, and then removed; one left by a process killed half way is removed next time.
void prune_checkpoints(const std::string& dir, int keep);

}  // namespace st

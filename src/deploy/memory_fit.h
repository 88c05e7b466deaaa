// Whether the cluster file's run fits its GPUs, by the trainer's own memory plan
// (train/memory_plan.h): one rank's GPU memory against what a process sees of the
// node's GPU (InstanceFacts::gpu_usable_gib), and the host RAM of a node's ranks
// against the worker pod's memory. A run that does not fit is refused, naming the
// first change that makes it fit, tried in order: a smaller train.micro_batch (with
// train.grad_accum keeping the sequences per step), each train.recompute choice,
// bf16 optimizer state and master weights, train.offload = optimizer, then
// optimizer+master (each of these three alone, then with the recompute choice that
// leaves the least on the GPU), then all of them together. Every change takes a
// smaller micro-batch where the configured one does not fit with it.
//
// The deploy room may not link the trainer (tests/rooms), so the planner comes in as
// a MemoryPlanner: the command line fills it with the trainer's functions
// (cli/deploy_memory.h), tests may give their own.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "deploy/cluster_file.h"
#include "deploy/preflight.h"

namespace st {

// One rank's memory: bytes on its GPU, and in host RAM beside it.
struct RankMemory {
  size_t device = 0;
  size_t host = 0;
};

struct MemoryPlanner {
  // One rank's memory for `cfg` over `world` ranks (cfg.dist.shard_group_size applies).
  std::function<RankMemory(const RunConfig& cfg, int world)> plan;
  // The largest train.micro_batch whose GPU memory fits in `limit` bytes, everything
  // else as in cfg; 0 when not even one fits.
  std::function<int(const RunConfig& cfg, int world, size_t limit)> largest_micro_batch;
};

// A change to the run config, tried when the run does not fit.
struct FitChange {
  std::string what;                                      // "a smaller train.micro_batch", ...
  std::vector<std::pair<std::string, std::string>> set;  // run-config key -> TOML value ("2", "\"norm\"")
  RankMemory rank;                                       // one rank's memory with the change
  size_t host_node = 0;                                  // ranks per node x rank.host
  bool fits_gpu = false, fits_host = false;
  bool fits() const { return fits_gpu && fits_host; }
};

struct MemoryFit {
  std::string skipped;         // non-empty: not checked, and why
  std::string gpu_model;
  double usable_gib = 0;       // per GPU
  bool usable_derived = false; // [nodes.gpu.facts] without gpu_usable_gib: 15/16 of gpu_memory_gib
  size_t gpu_limit = 0;        // bytes per GPU
  size_t host_limit = 0;       // bytes per node: the worker pod's memory
  int world = 0, shard_world = 0, ranks_per_node = 0;
  RankMemory rank;             // the run as configured
  size_t host_node = 0;
  bool fits_gpu = true, fits_host = true;
  std::vector<std::pair<std::string, int>> per_recompute;  // largest micro-batch that fits, per choice
  std::vector<FitChange> tried;  // when it does not fit: the changes, in the order tried
  int first_fit = -1;            // the first of `tried` that fits; -1: none
  bool fits() const { return fits_gpu && fits_host; }
};

MemoryFit check_memory_fit(const ClusterSpec& spec, const MemoryPlanner& planner);

// The refusal when the run does not fit (key train.config, or train.set without a
// config file), naming the first change that fits with its [train.set] lines and
// command-line overrides; a note when the check was skipped. Empty when it fits.
std::vector<Finding> memory_findings(const ClusterSpec& spec, const MemoryFit& fit);

// The plan's memory section (memory.txt), lines ending "\n".
std::string memory_fit_text(const ClusterSpec& spec, const MemoryFit& fit);
nlohmann::json memory_fit_json(const MemoryFit& fit);

}  // namespace st

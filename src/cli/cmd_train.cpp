#include <filesystem>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include <iostream>

#include "cli/commands.h"
#include "cli/rank_bringup.h"
#include "train/matmul_precision.h"
#include "train/memory_check.h"
#include "train/memory_plan.h"
#include "backend/backend.h"
#include "core/error.h"
#include "core/memory.h"
#include "launch/env.h"
#include "config/run_config.h"
#include "core/files.h"
#include "train/run_dir_lock.h"
#include "train/trainer.h"

namespace st {
namespace {

// `path` is `dir` or lies below it (after resolving what exists of both).
bool path_is_within(const std::string& path, const std::string& dir) {
  if (dir.empty()) return false;
  auto resolved = [](const std::string& x) {
    std::error_code ec;
    return std::filesystem::weakly_canonical(x, ec).lexically_normal().string();
  };
  return path_within(resolved(path), resolved(dir));
}

// --run.dry_run=true: the memory plan of one rank for the world this would run in (or
// run.dry_run_world), checked against run.gpu_memory_gib, the GPU here or host RAM.
// Nothing is allocated, no run directory is touched.
int dry_run(const RunConfig& cfg) {
  const DistEnv env = detect_dist_env(environ_map());
  const int world = cfg.run.dry_run_world > 0 ? cfg.run.dry_run_world : env.world;
  const int shard = cfg.dist.shard_group_size > 0 ? cfg.dist.shard_group_size : world;
  ST_CHECK_CONFIG(shard <= world && world % shard == 0, "dist.shard_group_size = ", cfg.dist.shard_group_size,
                  " does not divide the world of ", world, " ranks (run.dry_run_world or WORLD_SIZE)");
  const Device device = cfg.train.device == "cuda" ? Device::CUDA : Device::CPU;
  size_t limit = 0;
  std::string source;
  if (device == Device::CPU) {
    limit = host_memory_available_bytes(), source = "host RAM (MemAvailable)";
  } else if (cfg.run.gpu_memory_gib > 0) {
    limit = size_t(cfg.run.gpu_memory_gib * double(size_t(1) << 30)), source = "run.gpu_memory_gib";
  } else if (cuda_available()) {
    limit = make_cuda_backend(env.local_rank)->memory_available_bytes(), source = "this GPU's free memory";
  }
  const size_t workspace = device == Device::CUDA ? kCudaPlannedWorkspaceBytes : 0;
  std::cout << format_memory_plan(cfg, device, world, shard, world == 1, workspace, limit, source) << std::flush;
  return 0;
}

}  // namespace

Command add_train_command(CLI::App& root) {
  struct State {
    std::string config;
    ConfigOverrides overrides;
  };
  auto state = std::make_shared<State>();
  CLI::App* app = root.add_subcommand(
      "train",
      "Train a Qwen2 model. With no options: the `tiny` preset on the CPU over the text files in\n"
      "/usr/share/common-licenses (byte-level tokens), 300 steps, a few minutes on 2 cores.\n"
      "Settings come from the defaults, then --config FILE, then --section.key=value options.");
  app->add_option("-c,--config", state->config, "TOML run config, e.g. configs/tiny.toml")->check(CLI::ExistingFile);
  app->add_option_function<std::string>(
         "--init-from", [state](const std::string& dir) { state->overrides.emplace_back("model.init_from", dir); },
         "Hugging Face model directory to start from (same as --model.init_from)")
      ->trigger_on_parse();
  app->add_option_function<std::string>(
         "--expect-transport",
         [state](const std::string& t) { state->overrides.emplace_back("fabric.expect_transport", t); },
         "refuse to train unless NCCL uses this transport: efa, ib, socket, nvlink, shm (same as "
         "--fabric.expect_transport)")
      ->trigger_on_parse();
  add_config_options(*app, state->overrides);
  return {app, [state] {
            RunConfig cfg = load_run_config(state->config, state->overrides);
            if (cfg.run.dry_run) return dry_run(cfg);
            const DistEnv env = detect_dist_env(environ_map());
            // Rank 0 owns the run directory (config, metrics, summary, the checkpoints'
            // manifests and renames): it locks it before anything there is read or
            // written, NCCL's logs included, and before it meets the other ranks, so that
            // a second run is refused at once. Other ranks write only their checkpoint
            // shards into the step directory that rank 0 commits.
            std::unique_ptr<RunDirLock> out_lock, ckpt_lock;
            if (env.rank == 0) {
              if (!cfg.run.out_dir.empty()) out_lock = std::make_unique<RunDirLock>(cfg.run.out_dir, "run.out_dir");
              if (!cfg.run.checkpoint_dir.empty() && !path_is_within(cfg.run.checkpoint_dir, cfg.run.out_dir))
                ckpt_lock = std::make_unique<RunDirLock>(cfg.run.checkpoint_dir, "run.checkpoint_dir");
            }
            RankContext rank = bring_up_rank(env, cfg.train.device, cfg.dist, &cfg.fabric, cfg.run.out_dir);
            // Before anything big is allocated; the ranks of one host share its RAM.
            const int shard_world = rank.groups.shard->world();
            check_matmul_dtype(cfg, *rank.backend);
            check_rank_memory(cfg, *rank.backend, shard_world, shard_world == 1 && !rank.groups.replicate,
                              rank.env.local_world);
            Trainer trainer(cfg, *rank.backend, rank.groups, rank.fabric);
            trainer.set_restart_count(rank.env.restart_count);
            trainer.run();
            return 0;
          }};
}

}  // namespace st

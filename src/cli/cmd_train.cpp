#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "backend/factory.h"
#include "cli/commands.h"
#include "core/log.h"
#include "dist/env.h"
#include "dist/process_groups.h"
#include "train/run_config.h"
#include "train/trainer.h"

#ifdef SHARDTRAIN_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace st {
namespace {

// This rank's GPU: LOCAL_RANK, wrapped around the devices it can see, so N ranks on
// a host with N GPUs get one each, and a rank that was given a single GPU
// (CUDA_VISIBLE_DEVICES per rank) takes that one.
int local_device(const std::string& device, const DistEnv& env) {
#ifdef SHARDTRAIN_HAVE_CUDA
  if (device == "cuda") {
    const int n = cuda::device_count(nullptr);
    if (n > 0) return env.local_rank % n;
  }
#endif
  return 0;  // the CPU, or no device: make_backend says why
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
            const DistEnv env = detect_dist_env(environ_map());
            set_log_rank(env.rank, env.world);
            auto backend = make_backend(cfg.device, local_device(cfg.device, env));
            FabricOptions fabric;
            fabric.transport = cfg.fabric_transport;
            fabric.socket_ifname = cfg.fabric_socket_ifname;
            fabric.expect_transport = cfg.fabric_expect_transport;
            fabric.log_dir = cfg.fabric_log_dir.empty() ? cfg.out_dir + "/nccl" : cfg.fabric_log_dir;
            ProcessGroups groups = init_process_groups(env, *backend, cfg.shard_group_size, cfg.timeout_s, &fabric);
            Trainer trainer(cfg, *backend, groups);
            trainer.run();
            return 0;
          }};
}

}  // namespace st

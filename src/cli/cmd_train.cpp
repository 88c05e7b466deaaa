#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/rank_bringup.h"
#include "train/memory_check.h"
#include "config/run_config.h"
#include "train/trainer.h"

namespace st {
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
            RankContext rank = bring_up_rank(cfg.train.device, cfg.dist, &cfg.fabric, cfg.run.out_dir);
            // Before anything big is allocated; the ranks of one host share its RAM.
            const int shard_world = rank.groups.shard->world();
            check_rank_memory(cfg, *rank.backend, shard_world, shard_world == 1 && !rank.groups.replicate,
                              rank.env.local_world);
            Trainer trainer(cfg, *rank.backend, rank.groups, rank.fabric);
            trainer.run();
            return 0;
          }};
}

}  // namespace st

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
  add_config_options(*app, state->overrides);
  return {app, [state] {
            RunConfig cfg = load_run_config(state->config, state->overrides);
            const DistEnv env = detect_dist_env(environ_map());
            set_log_rank(env.rank, env.world);
            auto backend = make_backend(cfg.device);
            ProcessGroups groups = init_process_groups(env, *backend, cfg.shard_group_size, cfg.timeout_s);
            Trainer trainer(cfg, *backend, groups);
            trainer.run();
            return 0;
          }};
}

}  // namespace st

#include <cstdio>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/log.h"
#include "config/model_config.h"

namespace st {

Command add_presets_command(CLI::App& root) {
  CLI::App* app = root.add_subcommand("presets", "List the built-in model presets (model.preset) and their sizes.");
  return {app, [] {
            std::printf("%-14s %7s %6s %6s %4s %4s %7s %6s %9s\n", "preset", "layers", "hidden", "ffn", "H", "KV",
                        "vocab", "tied", "params");
            for (const auto& name : model_preset_names()) {
              const ModelConfig c = model_preset(name);
              std::printf("%-14s %7d %6d %6d %4d %4d %7d %6s %9s\n", name.c_str(), c.num_layers, c.hidden_size,
                          c.intermediate_size, c.num_heads, c.num_kv_heads, c.vocab_size,
                          c.tie_word_embeddings ? "yes" : "no", human_count(static_cast<double>(c.num_params())).c_str());
            }
            return 0;
          }};
}

}  // namespace st

#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/validators.h"
#include "core/error.h"
#include "io/hf_checkpoint.h"
#include "config/model_config.h"
#include "model/init.h"
#include "model/layout.h"

namespace st {

Command add_export_command(CLI::App& root) {
  struct State {
    std::string init_from, preset, out, dtype = "bf16";
    uint64_t seed = 1234;
    double max_shard_gb = 5.0;
    bool force = false;
  };
  auto s = std::make_shared<State>();
  CLI::App* app = root.add_subcommand(
      "export",
      "Write a model in Hugging Face format (config.json + model.safetensors) that\n"
      "transformers' Qwen2ForCausalLM.from_pretrained loads. The weights come from a\n"
      "Hugging Face directory (--init-from: converts dtype or sharding) or from a preset's\n"
      "seeded initialisation (--preset, --seed). To export a trained model, train with\n"
      "--run.export_dir=DIR.");
  auto* from = app->add_option("--init-from", s->init_from, "Hugging Face model directory to read")
                   ->check(CLI::ExistingDirectory);
  auto* preset = app->add_option("--preset", s->preset, "model preset to initialise (see `shardtrain presets`)");
  from->excludes(preset);
  app->add_option("--seed", s->seed, "seed of the preset's initialisation")->capture_default_str();
  app->add_option("--out", s->out, "output directory")->required();
  app->add_option("--dtype", s->dtype, "weight dtype")->check(CLI::IsMember({"bf16", "f32"}))->capture_default_str();
  app->add_option("--max-shard-gb", s->max_shard_gb, "split into files of at most this many GB (with an index)")
      ->check(finite_in(0.001, 1e6))
      ->capture_default_str();
  app->add_flag("--force", s->force, "replace a model already in --out");
  return {app, [s] {
            ST_CHECK_CONFIG(!s->init_from.empty() || !s->preset.empty(), "export: give --init-from DIR or --preset NAME");
            check_export_dir(s->out, s->force);
            const ModelConfig cfg = s->init_from.empty() ? model_preset(s->preset) : load_hf_config(s->init_from);
            const ParamLayout layout(cfg);
            std::vector<std::vector<float>> units;
            if (!s->init_from.empty()) {
              units = load_hf_weights(s->init_from, layout);
            } else {
              for (const Unit& u : layout.units()) {
                std::vector<float> v(u.numel);
                init_unit_values(u, s->seed, 0.02, 0, u.numel, v.data());
                units.push_back(std::move(v));
              }
            }
            ExportOptions o;
            o.dtype = s->dtype == "f32" ? DType::F32 : DType::BF16;
            o.max_shard_bytes = static_cast<uint64_t>(s->max_shard_gb * 1e9);
            o.overwrite = s->force;
            o.config_from = s->init_from;  // keep the source's other config.json keys
            export_hf_model(s->out, layout, units, o);
            std::printf("exported %s (%s, %s) to %s\n", cfg.source.c_str(), s->dtype.c_str(),
                        cfg.tie_word_embeddings ? "tied embeddings" : "untied", s->out.c_str());
            return 0;
          }};
}

}  // namespace st

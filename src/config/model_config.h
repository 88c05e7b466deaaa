// Qwen2 model dimensions: from a named preset or a Hugging Face config.json.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace st {

struct ModelConfig {
  std::string source;             // preset name or config.json path, for messages
  int vocab_size = 0;
  int hidden_size = 0;            // C
  int intermediate_size = 0;      // F
  int num_layers = 0;             // L
  int num_heads = 0;              // H
  int num_kv_heads = 0;           // KV
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 1e6;
  bool tie_word_embeddings = true;

  int head_dim() const { return hidden_size / num_heads; }
  // Parameters of the model (tied embedding counted once).
  long long num_params() const;
};

// The [model] section of the run configuration: where the model comes from, and
// experiment overrides of its dimensions (0 keeps the preset's / config.json's value).
struct ModelOptions {
  std::string preset = "tiny";   // one of model_preset_names()
  std::string config;            // Hugging Face config.json (file or directory); wins over preset
  std::string init_from;         // Hugging Face model directory whose weights start the run
  int layers = 0, hidden_size = 0, intermediate_size = 0, heads = 0, kv_heads = 0, vocab_size = 0;
};

// Names of the built-in presets: tiny, qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-3b, qwen2.5-7b,
// qwen2.5-14b (the published config.json dimensions).
std::vector<std::string> model_preset_names();
// Throws st::Error listing the known names when `name` is unknown.
ModelConfig model_preset(const std::string& name);
// Reads a Hugging Face config.json (a file, or a directory holding one). Requires
// model_type "qwen2" (or absent) and hidden_act "silu"; other keys are ignored.
// Errors name the file and the key.
ModelConfig load_hf_config(const std::string& path);
// The config.json that transformers' Qwen2ForCausalLM reads back to this config.
nlohmann::json hf_config_json(const ModelConfig& cfg);
// Throws st::Error naming `cfg.source` and the key for: non-positive sizes,
// hidden_size % num_heads, num_heads % num_kv_heads, odd head_dim, eps <= 0, theta <= 0.
void validate_model_config(const ModelConfig& cfg);

}  // namespace st

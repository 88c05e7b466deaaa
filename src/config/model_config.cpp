// Qwen2 model dimensions: built-in presets, Hugging Face config.json in and out, and
// the checks every consumer of a ModelConfig relies on.
#include "config/model_config.h"

#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace st {

namespace {

// The published Qwen2.5 base-model dimensions (config.json of each Hugging Face repo).
ModelConfig qwen25(const char* name, int C, int F, int L, int H, int KV, int V, bool tied,
                   int max_pos = 32768, double eps = 1e-6) {
  ModelConfig c;
  c.source = name;
  c.vocab_size = V;
  c.hidden_size = C;
  c.intermediate_size = F;
  c.num_layers = L;
  c.num_heads = H;
  c.num_kv_heads = KV;
  c.max_position_embeddings = max_pos;
  c.rms_norm_eps = eps;
  c.rope_theta = 1e6;
  c.tie_word_embeddings = tied;
  return c;
}

std::vector<ModelConfig> presets() {
  ModelConfig tiny;  // byte-level (vocab 256), small enough to train on a CPU in minutes
  tiny.source = "tiny";
  tiny.vocab_size = 256;
  tiny.hidden_size = 128;
  tiny.intermediate_size = 384;
  tiny.num_layers = 4;
  tiny.num_heads = 4;
  tiny.num_kv_heads = 2;
  tiny.max_position_embeddings = 1024;
  tiny.rms_norm_eps = 1e-6;
  tiny.rope_theta = 10000;
  tiny.tie_word_embeddings = true;
  return {
      tiny,
      qwen25("qwen2.5-0.5b", 896, 4864, 24, 14, 2, 151936, true),
      qwen25("qwen2.5-1.5b", 1536, 8960, 28, 12, 2, 151936, true),
      qwen25("qwen2.5-3b", 2048, 11008, 36, 16, 2, 151936, true),
      qwen25("qwen2.5-7b", 3584, 18944, 28, 28, 4, 152064, false, 131072),
      qwen25("qwen2.5-14b", 5120, 13824, 48, 40, 8, 152064, false, 131072, 1e-5),
  };
}

const char* json_type_name(const nlohmann::json& j) {
  if (j.is_number_integer()) return "an integer";
  if (j.is_number_float()) return "a floating-point number";
  if (j.is_string()) return "a string";
  if (j.is_boolean()) return "a boolean";
  if (j.is_null()) return "null";
  if (j.is_array()) return "an array";
  return "an object";
}

// Typed access to a config.json object; every error names the file and the key.
struct JsonReader {
  const nlohmann::json& j;
  const std::string& file;

  const nlohmann::json* find(const char* key) const {
    auto it = j.find(key);
    return it == j.end() ? nullptr : &*it;
  }
  int get_int(const char* key, const int* fallback = nullptr) const {
    const nlohmann::json* v = find(key);
    if (!v) {
      if (fallback) return *fallback;
      fail_data(file, ": missing required key '", key, "'");
    }
    if (!v->is_number_integer())
      fail_data(file, ": key '", key, "' must be an integer, got ", json_type_name(*v));
    long long x = v->get<long long>();
    if (x < INT_MIN || x > INT_MAX) fail_data(file, ": key '", key, "' (", x, ") does not fit in 32 bits");
    return static_cast<int>(x);
  }
  double get_double(const char* key, double fallback) const {
    const nlohmann::json* v = find(key);
    if (!v) return fallback;
    if (!v->is_number()) fail_data(file, ": key '", key, "' must be a number, got ", json_type_name(*v));
    return v->get<double>();
  }
  bool get_bool(const char* key, bool fallback) const {
    const nlohmann::json* v = find(key);
    if (!v) return fallback;
    if (!v->is_boolean()) fail_data(file, ": key '", key, "' must be a boolean, got ", json_type_name(*v));
    return v->get<bool>();
  }
  // Keys that must hold one particular string when present.
  void expect_string(const char* key, const char* wanted, const char* why) const {
    const nlohmann::json* v = find(key);
    if (!v) return;
    if (!v->is_string()) fail_data(file, ": key '", key, "' must be a string, got ", json_type_name(*v));
    if (v->get<std::string>() != wanted)
      fail_data(file, ": ", key, " is '", v->get<std::string>(), "', expected '", wanted, "' (", why, ")");
  }
};

}  // namespace

long long ModelConfig::num_params() const {
  // In 128 bits, saturated: dimensions that validation refuses (a memory estimate, a
  // message about them) count without overflow.
  using I = __int128;
  const I V = vocab_size, C = hidden_size, F = intermediate_size;
  const I kv_dim = static_cast<I>(num_kv_heads) * (num_heads ? C / num_heads : 0);
  const I per_layer = (C * C + C)              // q_proj (with bias)
                      + 2 * (C * kv_dim + kv_dim)  // k_proj, v_proj (with bias)
                      + C * C                  // o_proj (no bias)
                      + 3 * C * F              // gate, up, down
                      + 2 * C;                 // input and post-attention RMSNorm
  const I n = V * C + num_layers * per_layer + C + (tie_word_embeddings ? 0 : V * C);
  return n > LLONG_MAX ? LLONG_MAX : n < LLONG_MIN ? LLONG_MIN : static_cast<long long>(n);
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const ModelConfig& c : presets()) names.push_back(c.source);
  return names;
}

ModelConfig model_preset(const std::string& name) {
  for (const ModelConfig& c : presets())
    if (c.source == name) return c;
  std::string known;
  for (const std::string& n : model_preset_names()) known += (known.empty() ? "" : ", ") + n;
  fail_config("unknown model preset '", name, "' (known presets: ", known, ")");
}

ModelConfig load_hf_config(const std::string& path) {
  namespace fs = std::filesystem;
  std::string file = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) file = (fs::path(path) / "config.json").string();
  std::ifstream in(file);
  if (!in) fail_data(file, ": cannot open model config (expected a config.json or a directory holding one)");

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail_data(file, ": invalid JSON: ", e.what());
  }
  if (!j.is_object()) fail_data(file, ": expected a JSON object at the top level, got ", json_type_name(j));

  const JsonReader r{j, file};
  r.expect_string("model_type", "qwen2", "only Qwen2 models are supported");
  r.expect_string("hidden_act", "silu", "the Qwen2 MLP is implemented with SiLU only");
  if (r.get_bool("use_sliding_window", false))
    fail_data(file, ": use_sliding_window is true; sliding-window attention is not supported");
  // transformers 5 lists each layer's attention kind; only full attention is implemented.
  if (const nlohmann::json* lt = r.find("layer_types"); lt && !lt->is_null()) {
    if (!lt->is_array()) fail_data(file, ": layer_types must be a list, got ", json_type_name(*lt));
    for (size_t i = 0; i < lt->size(); ++i)
      if ((*lt)[i] != "full_attention")
        fail_data(file, ": layer_types[", i, "] is ", (*lt)[i].dump(), "; only full_attention layers are supported");
  }
  // transformers 5 writes RoPE settings as rope_parameters {"rope_type": "default",
  // "rope_theta": ...}; older versions a top-level rope_theta and rope_scaling null.
  // Only plain (default) RoPE is implemented: any scaling type is an error.
  double rope_theta = r.get_double("rope_theta", 10000.0);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const nlohmann::json* rp = r.find(key);
    if (!rp || rp->is_null()) continue;
    if (!rp->is_object()) fail_data(file, ": ", key, " must be an object or null, got ", json_type_name(*rp));
    std::string type = "default";
    for (const char* tkey : {"rope_type", "type"})
      if (auto it = rp->find(tkey); it != rp->end()) {
        if (!it->is_string()) fail_data(file, ": ", key, ".", tkey, " must be a string");
        type = it->get<std::string>();
      }
    if (type != "default")
      fail_data(file, ": ", key, " asks for RoPE type '", type, "' (", rp->dump(), "); only default RoPE is supported");
    if (auto it = rp->find("rope_theta"); it != rp->end()) {
      if (!it->is_number()) fail_data(file, ": ", key, ".rope_theta must be a number");
      rope_theta = it->get<double>();
    }
  }

  ModelConfig c;
  c.source = file;
  c.vocab_size = r.get_int("vocab_size");
  c.hidden_size = r.get_int("hidden_size");
  c.intermediate_size = r.get_int("intermediate_size");
  c.num_layers = r.get_int("num_hidden_layers");
  c.num_heads = r.get_int("num_attention_heads");
  c.num_kv_heads = r.get_int("num_key_value_heads", &c.num_heads);  // absent: plain MHA
  const int default_max_pos = 32768;
  c.max_position_embeddings = r.get_int("max_position_embeddings", &default_max_pos);
  // Defaults are transformers' Qwen2Config defaults, so that a sparse config.json means
  // here what it means there (note rope_theta 10000 and untied embeddings).
  c.rms_norm_eps = r.get_double("rms_norm_eps", 1e-6);
  c.rope_theta = rope_theta;
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  try {
    validate_model_config(c);
  } catch (const Error& e) {
    throw Error(e.what(), ErrorKind::Data);  // the file's dimensions, not the user's settings
  }

  // Newer configs may spell head_dim out; we only implement head_dim = hidden / heads.
  if (const nlohmann::json* hd = r.find("head_dim"); hd && !hd->is_null()) {
    const int head_dim = r.get_int("head_dim");
    if (head_dim != c.head_dim())
      fail_data(file, ": head_dim (", head_dim, ") differs from hidden_size / num_attention_heads (",
           c.head_dim(), "); only head_dim = hidden_size / num_attention_heads is supported");
  }
  return c;
}

nlohmann::json hf_config_json(const ModelConfig& c) {
  // Key for key what transformers writes for Qwen2ForCausalLM, so that
  // AutoModelForCausalLM.from_pretrained reads our checkpoints without warnings.
  return nlohmann::json{
      {"architectures", {"Qwen2ForCausalLM"}},
      {"attention_dropout", 0.0},
      {"hidden_act", "silu"},
      {"hidden_size", c.hidden_size},
      {"initializer_range", 0.02},
      {"intermediate_size", c.intermediate_size},
      {"max_position_embeddings", c.max_position_embeddings},
      {"max_window_layers", c.num_layers},
      {"model_type", "qwen2"},
      {"num_attention_heads", c.num_heads},
      {"num_hidden_layers", c.num_layers},
      {"num_key_value_heads", c.num_kv_heads},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_scaling", nullptr},
      {"rope_theta", c.rope_theta},
      {"sliding_window", nullptr},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"torch_dtype", "bfloat16"},
      {"use_cache", true},
      {"use_sliding_window", false},
      {"vocab_size", c.vocab_size},
  };
}

void validate_model_config(const ModelConfig& c) {
  const std::string& src = c.source.empty() ? std::string("model config") : c.source;
  auto positive = [&](const char* key, long long v) {
    if (v <= 0) fail_config(src, ": ", key, " must be positive, got ", v);
  };
  positive("vocab_size", c.vocab_size);
  positive("hidden_size", c.hidden_size);
  positive("intermediate_size", c.intermediate_size);
  positive("num_hidden_layers", c.num_layers);
  positive("num_attention_heads", c.num_heads);
  positive("num_key_value_heads", c.num_kv_heads);
  positive("max_position_embeddings", c.max_position_embeddings);
  // The fused q|k|v (at most 3 x hidden) and gate|up (2 x intermediate) widths and the
  // unit count are 32-bit in the op interface and the layout.
  auto at_most = [&](const char* key, long long v, long long limit, const char* why) {
    if (v > limit) fail_config(src, ": ", key, " (", v, ") is larger than supported (at most ", limit, ": ", why, ")");
  };
  at_most("hidden_size", c.hidden_size, INT_MAX / 3, "the fused q|k|v width, 3 x hidden_size, is a 32-bit int");
  at_most("intermediate_size", c.intermediate_size, INT_MAX / 2, "the fused gate|up width is a 32-bit int");
  at_most("num_hidden_layers", c.num_layers, INT_MAX - 2, "units are counted in 32 bits");
  if (c.hidden_size % c.num_heads != 0)
    fail_config(src, ": hidden_size (", c.hidden_size, ") is not divisible by num_attention_heads (",
         c.num_heads, ")");
  // Grouped-query attention shares each KV head among num_heads / num_kv_heads query heads.
  if (c.num_heads % c.num_kv_heads != 0)
    fail_config(src, ": num_attention_heads (", c.num_heads, ") is not divisible by num_key_value_heads (",
         c.num_kv_heads, ")");
  // RoPE rotates pairs of channels, so each head needs an even width.
  if (c.head_dim() % 2 != 0)
    fail_config(src, ": head_dim = hidden_size / num_attention_heads = ", c.head_dim(),
         " is odd; rotary embeddings need an even head_dim");
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps))
    fail_config(src, ": rms_norm_eps must be a positive number, got ", c.rms_norm_eps);
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta))
    fail_config(src, ": rope_theta must be a positive number, got ", c.rope_theta);
  // 2^48 parameters would need petabytes (the memory check refuses far smaller models);
  // num_params() counts in 128 bits, saturated, so it cannot wrap here.
  const long long params = c.num_params();
  if (params > (1LL << 48))
    fail_config(src, ": the model would have about ", static_cast<double>(params),
                " parameters (vocab_size ", c.vocab_size, ", hidden_size ", c.hidden_size, ", intermediate_size ",
                c.intermediate_size, ", num_hidden_layers ", c.num_layers, "), more than 2^48: far beyond any memory");
}

}  // namespace st

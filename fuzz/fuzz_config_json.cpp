// libFuzzer target for the Hugging Face config.json reader (st::load_hf_config). An
// st::Error is the expected rejection; a crash, a sanitizer report, any other
// exception or an accepted config that breaks what acceptance promises is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fuzz_util.h"
#include "config/model_config.h"

namespace {

bool same(const st::ModelConfig& a, const st::ModelConfig& b) {
  return a.vocab_size == b.vocab_size && a.hidden_size == b.hidden_size &&
         a.intermediate_size == b.intermediate_size && a.num_layers == b.num_layers && a.num_heads == b.num_heads &&
         a.num_kv_heads == b.num_kv_heads && a.max_position_embeddings == b.max_position_embeddings &&
         a.rms_norm_eps == b.rms_norm_eps && a.rope_theta == b.rope_theta &&
         a.tie_word_embeddings == b.tie_word_embeddings;
}

// Accepted: the dimensions validate_model_config promises, a parameter count (every
// consumer prints one), and the config.json we would export reads back the same.
void check_accepted(const st::ModelConfig& c) {
  if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.intermediate_size <= 0 || c.num_layers <= 0 ||
      c.num_heads <= 0 || c.num_kv_heads <= 0 || c.max_position_embeddings <= 0)
    __builtin_trap();
  if (c.hidden_size % c.num_heads || c.num_heads % c.num_kv_heads || c.head_dim() % 2) __builtin_trap();
  if (c.num_params() <= 0) __builtin_trap();
  const std::string again = fuzz::scratch_dir() + "/exported.json";
  fuzz::write_file(again, st::hf_config_json(c).dump());
  if (!same(st::load_hf_config(again), c)) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::scratch_dir() + "/config.json";
  fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  st::ModelConfig c;
  try {
    c = st::load_hf_config(path);
  } catch (const st::Error& e) {
    fuzz::rejected(e);
    return 0;
  }
  check_accepted(c);
  return 0;
}

#include "metrics/run_summary.h"

#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "core/json_file.h"

namespace st {
namespace {
using nlohmann::json;

// Every key, in the order a reader checks them: the numbers, the strings, then
// "interrupted" (so the first error a file gives stays the same).
template <class Summary, class F>
void each_field(Summary& s, F&& f) {
  f("steps", s.steps);
  f("world", s.world);
  f("seq_len", s.seq_len);
  f("micro_batch", s.micro_batch);
  f("grad_accum", s.grad_accum);
  f("first_loss", s.first_loss);
  f("final_loss", s.final_loss);
  f("tokens_per_s", s.tokens_per_s);
  f("tokens_per_s_per_rank", s.tokens_per_s_per_rank);
  f("flops_per_token", s.flops_per_token);
  f("tflops_per_rank", s.tflops_per_rank);
  f("mfu", s.mfu);
  f("peak_tflops", s.peak_tflops);
  f("peak_memory_bytes", s.peak_memory_bytes);
  f("first_step_after_start_s", s.first_step_after_start_s);
  f("comm_bytes_per_step", s.comm_bytes_per_step);
  f("comm_inter_node_bytes_per_step", s.comm_inter_node_bytes_per_step);
  f("comm_blocked_s_per_step", s.comm_blocked_s_per_step);
  f("signal", s.signal);
  f("steps_done", s.steps_done);
  f("last_loss", s.last_loss);
  f("backend", s.backend);
  f("model", s.model);
  f("checkpoint", s.checkpoint);
  f("checkpoint_incomplete", s.checkpoint_incomplete);
  f("interrupted", s.interrupted);
}

// A byte count as written (an unsigned integer); any other number is taken as
// near as it goes, a negative one as 0.
uint64_t byte_count(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  const double d = v.get<double>();
  return d > 0 ? static_cast<uint64_t>(std::min(d, 1.8e19)) : 0;
}

}  // namespace

void to_json(json& j, const RunSummary& s) {
  j = json::object();
  each_field(s, [&](const char* key, const auto& field) {
    if (field) j[key] = *field;
  });
}

RunSummary run_summary_from_json(const json& j, const std::string& path, const std::string& text) {
  if (!j.is_object()) fail_data(path, ": expected a JSON object, got ", j.type_name());
  RunSummary s;
  each_field(s, [&](const char* key, auto& field) {
    using T = typename std::remove_reference_t<decltype(field)>::value_type;
    if (!j.contains(key)) return;
    const json& v = j.at(key);
    if constexpr (std::is_same_v<T, bool>) {
      if (!v.is_boolean()) fail_data(path, ": \"", key, "\" must be true or false, got ", v.type_name());
      field = v.get<bool>();
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!v.is_string()) fail_data(where_key(path, text, key), ": \"", key, "\" must be a string, got ", v.type_name());
      field = v.get<std::string>();
    } else {
      require_number(j, key, path, text);
      if constexpr (std::is_same_v<T, uint64_t>) field = byte_count(v);
      else field = v.get<T>();
    }
  });
  // Ranks are a whole number; any other "world" is not used (report then counts the
  // ranks another way).
  if (s.world && !j.at("world").is_number_integer()) s.world.reset();
  return s;
}

void from_json(const json& j, RunSummary& s) { s = run_summary_from_json(j, "summary.json", ""); }

std::string run_summary_text(const RunSummary& s) { return json(s).dump(1) + "\n"; }

RunSummary read_run_summary(const std::string& path) {
  std::string text;
  const json j = read_json_object(path, text);
  return run_summary_from_json(j, path, text);
}

}  // namespace st

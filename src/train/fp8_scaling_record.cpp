#include "train/fp8_scaling_record.h"

#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "io/json_integer.h"

namespace st {
namespace {

std::string to_hex(const std::vector<float>& v) {
  std::string out(v.size() * 8, '0');
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, &v[i], sizeof bits);
    char buf[9];
    std::snprintf(buf, sizeof buf, "%08x", bits);
    std::memcpy(&out[i * 8], buf, 8);
  }
  return out;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::vector<float> from_hex(const nlohmann::json& j, const char* key, size_t n, const std::string& where) {
  const nlohmann::json& v = j.at(key);
  if (!v.is_string()) fail_data(where, ": '", key, "' must be a string of hex digits, got ", v.dump());
  const std::string& s = v.get_ref<const std::string&>();
  if (s.size() != n * 8)
    fail_data(where, ": '", key, "' holds ", s.size(), " hex digits, ", n * 8, " expected (", n, " f32 values)");
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits = 0;
    for (size_t k = 0; k < 8; ++k) {
      const int d = hex_digit(s[i * 8 + k]);
      if (d < 0) fail_data(where, ": '", key, "' has '", s[i * 8 + k], "' at ", i * 8 + k, ", not a hex digit");
      bits = bits << 4 | static_cast<uint32_t>(d);
    }
    std::memcpy(&out[i], &bits, sizeof bits);
  }
  return out;
}

}  // namespace

nlohmann::json fp8_scaling_json(const Fp8ScalingState& s) {
  return {{"layers", s.layers},   {"kinds", s.kinds},   {"bf16_end_blocks", s.bf16_end_blocks},
          {"history_len", s.history_len}, {"rolls", s.rolls}, {"begun", s.begun},
          {"dlogits_casts", s.dlogits_casts}, {"amax", to_hex(s.amax)}, {"history", to_hex(s.history)}};
}

Fp8ScalingState fp8_scaling_from_json(const nlohmann::json& j, const std::string& where) {
  try {
    if (!j.is_object()) fail_data(where, ": expected an object, got ", j.dump());
    Fp8ScalingState s;
    try {
      s.layers = integer_at<int>(j, "layers", where);
      s.kinds = integer_at<unsigned>(j, "kinds", where);
      s.bf16_end_blocks = integer_at<int>(j, "bf16_end_blocks", where);
      s.history_len = integer_at<int>(j, "history_len", where);
      s.rolls = integer_at<int>(j, "rolls", where);
      s.dlogits_casts = integer_at<uint64_t>(j, "dlogits_casts", where);
    } catch (const Error& e) {
      fail_data(e.what());  // integer_at's message, as a data error
    }
    if (!j.at("begun").is_boolean()) fail_data(where, ": 'begun' must be true or false, got ", j.at("begun").dump());
    s.begun = j.at("begun").get<bool>();
    // Bounds before the sizes below are computed from them.
    if (s.layers < 1 || s.layers > (1 << 16) || s.history_len < 0 || s.history_len > 1024 || s.rolls < 0 ||
        s.bf16_end_blocks < 0)
      fail_data(where, ": layers ", s.layers, ", history_len ", s.history_len, ", rolls ", s.rolls,
                " or bf16_end_blocks ", s.bf16_end_blocks, " out of range");
    const size_t n = s.history_len ? size_t(s.layers) * 4 * 2 : 0;
    s.amax = from_hex(j, "amax", n, where);
    s.history = from_hex(j, "history", n * size_t(s.history_len), where);
    return s;
  } catch (const nlohmann::json::exception& e) {
    fail_data(where, ": ", e.what());
  }
}

}  // namespace st

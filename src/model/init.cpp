#include "model/init.h"

#include <algorithm>
#include <string_view>

#include "core/rng.h"

namespace st {
namespace {
bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
}  // namespace

void init_unit_values(const Unit& unit, uint64_t seed, double std, size_t begin, size_t end, float* out) {
  std::fill(out, out + (end - begin), 0.0f);
  for (const ParamSpec& p : unit.params) {
    const size_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo >= hi) continue;
    float* dst = out + (lo - begin);
    if (p.shape.size() == 1) {  // norms are 1, biases 0
      const bool is_norm = ends_with(p.name, "layernorm.weight") || ends_with(p.name, "norm.weight");
      std::fill(dst, dst + (hi - lo), is_norm ? 1.0f : 0.0f);
      continue;
    }
    const CounterRng rng(seed, hash_name(p.name));
    for (size_t i = lo; i < hi; ++i) *dst++ = static_cast<float>(std * rng.normal(i - p.offset));
  }
}

}  // namespace st

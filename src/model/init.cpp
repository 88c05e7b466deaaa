#include "model/init.h"

#include <algorithm>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"

namespace st {
namespace {
bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// init_unit_values on one thread.
void init_serial(const Unit& unit, uint64_t seed, double std, size_t begin, size_t end, float* out) {
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

}  // namespace

void init_unit_values(const Unit& unit, uint64_t seed, double std, size_t begin, size_t end, float* out) {
  // Every value is a pure function of its index, so large ranges split across threads
  // give the same bits (a 1.5B-parameter model would otherwise take a minute here).
  parallel_ranges(end - begin, size_t{1} << 22, [&](size_t lo, size_t hi) {
    init_serial(unit, seed, std, begin + lo, begin + hi, out + lo);
  });
}

void init_unit_tensor(Backend& be, const Unit& unit, uint64_t seed, double std, size_t begin, size_t end, Tensor out) {
  ST_CHECK(out.numel == end - begin, "init_unit_tensor: ", out.numel, " elements for the range [", begin, ", ", end, ")");
  be.zero(out);  // padding
  for (const ParamSpec& p : unit.params) {
    const size_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo >= hi) continue;
    Tensor dst = out.slice(lo - begin, hi - lo);
    if (p.shape.size() == 1) {  // norms are 1, biases 0
      const bool is_norm = ends_with(p.name, "layernorm.weight") || ends_with(p.name, "norm.weight");
      if (is_norm) be.fill(dst, 1.0);
      continue;
    }
    be.fill_normal(dst, CounterRng(seed, hash_name(p.name)).key, lo - p.offset, std);
  }
}

}  // namespace st

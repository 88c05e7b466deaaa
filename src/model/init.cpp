#include "model/init.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"

namespace st {
namespace {

// Calls fn(p, lo, hi) for each param of `unit` that overlaps [begin, end), with
// [lo, hi) the overlap in unit elements.
template <class F>
void for_each_param_in(const Unit& unit, size_t begin, size_t end, F&& fn) {
  for (const ParamSpec& p : unit.params) {
    const size_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo < hi) fn(p, lo, hi);
  }
}

// RMSNorm weights ("model.norm.weight", "*_layernorm.weight") start at 1; the other
// 1-D params are biases.
bool is_norm_weight(const ParamSpec& p) { return p.name.ends_with("norm.weight"); }

// init_unit_values on one thread.
void init_serial(const Unit& unit, uint64_t seed, double std, size_t begin, size_t end, float* out) {
  std::fill(out, out + (end - begin), 0.0f);
  for_each_param_in(unit, begin, end, [&](const ParamSpec& p, size_t lo, size_t hi) {
    float* dst = out + (lo - begin);
    if (p.shape.size() == 1) {  // norms are 1, biases 0
      std::fill(dst, dst + (hi - lo), is_norm_weight(p) ? 1.0f : 0.0f);
      return;
    }
    const CounterRng rng(seed, hash_name(p.name));
    for (size_t i = lo; i < hi; ++i) *dst++ = static_cast<float>(std * rng.normal(i - p.offset));
  });
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
  for_each_param_in(unit, begin, end, [&](const ParamSpec& p, size_t lo, size_t hi) {
    Tensor dst = out.slice(lo - begin, hi - lo);
    if (p.shape.size() == 1) {  // norms are 1, biases 0
      if (is_norm_weight(p)) be.fill(dst, 1.0);
      return;
    }
    be.fill_normal(dst, CounterRng(seed, hash_name(p.name)).key, lo - p.offset, std);
  });
}

}  // namespace st

// Learning rate: linear warmup to the peak over `warmup` steps, then cosine decay
// to peak * min_ratio at the last step. Steps are 0-based.
#pragma once
#include <algorithm>
#include <cmath>

#include "config/options.h"  // OptimOptions

namespace st {

struct LrSchedule {
  double peak = 3e-3;
  double min_ratio = 0.1;
  int warmup = 0;
  int total = 1;

  double at(int step) const {
    if (step < warmup) return peak * (step + 1) / warmup;
    const int span = std::max(1, total - 1 - warmup);
    const double progress = std::min(1.0, static_cast<double>(step - warmup) / span);
    const double lo = peak * min_ratio;
    return lo + 0.5 * (peak - lo) * (1.0 + std::cos(M_PI * progress));
  }

  static LrSchedule from(const OptimOptions& o, int total_steps) {
    return LrSchedule{o.lr, o.min_lr_ratio, o.warmup_steps, total_steps};
  }
};

}  // namespace st

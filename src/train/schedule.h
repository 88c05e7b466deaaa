// Learning rate: linear warmup to the peak over `warmup` steps, then cosine decay
// to peak * min_ratio at the last step. Steps are 0-based.
#pragma once
#include <algorithm>
#include <cmath>

namespace st {

// The [optim] section of the run configuration: AdamW and its schedule.
struct OptimOptions {
  double lr = 3e-3;            // peak learning rate
  double min_lr_ratio = 0.1;   // cosine decay ends at lr * min_lr_ratio
  int warmup_steps = 20;       // linear warmup
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;   // decoupled; 2-D weights only
  double grad_clip = 1.0;      // global gradient norm; 0 disables
};

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

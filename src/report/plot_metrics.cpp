#include "report/plot_metrics.h"

namespace st {

const std::vector<Metric>& metrics() {
  static const std::vector<Metric> m = {
      {"loss", "Loss", "loss", "loss", 1, false, false, ""},
      {"lr", "Learning rate", "lr", "learning rate", 1, true, false, ""},
      {"grad_norm", "Gradient norm", "grad_norm", "gradient norm (before clipping)", 1, true, false, ""},
      {"tokens_per_s", "Throughput", "tokens_per_s", "tokens/s (all ranks)", 1, true, false, ""},
      {"mfu", "MFU", "mfu", "MFU (%)", 100, true, true,
       "MFU needs the device's peak TFLOP/s: a known GPU, or train.peak_tflops"},
      {"memory", "Memory", "peak_memory_bytes", "peak memory per rank", 1, true, true,
       "no step record of metrics.jsonl has peak_memory_bytes (runs of older versions), or the backend does not "
       "track its allocations", true},
  };
  return m;
}

}  // namespace st

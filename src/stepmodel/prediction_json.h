// A step prediction as one JSON object: the inputs it was made from and every output
// of predict_step, under names that stay stable (a bench script reads them;
// docs/scaleout.md lists each). `shardtrain predict --json` prints it and
// `deploy plan --json` embeds it.
#pragma once
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "stepmodel/step_model.h"

namespace st {

// Where the compute seconds came from: given, or a GPU's peak times an MFU.
struct ComputeBasis {
  std::string source = "given";  // "given" | "gpu"
  std::string gpu;               // the table's name (stepmodel/gpu_peaks.h)
  double peak_tflops = 0, mfu = 0;
  // train.matmul_dtype, and with "fp8" the share of the FLOPs its layers take, at
  // kFp8LayerSpeedup (gpu_peaks.h): with a GPU, compute is the bf16 time x
  // fp8_compute_factor(fp8_share).
  std::string matmul_dtype = "bf16";
  double fp8_share = 0;
};

nlohmann::json step_prediction_json(const StepModelInput& in, const StepPrediction& p, const ComputeBasis& basis);

// "bf16" for 2 bytes, "fp32" for 4.
const char* wire_dtype_name(int bytes);

}  // namespace st

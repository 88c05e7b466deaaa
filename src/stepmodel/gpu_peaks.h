// Dense bf16 tensor-core peaks of the GPUs the step model knows, each with where the
// number comes from, and the compute time of a step from one of them and an MFU
// assumption. The peaks are datasheet figures without structured sparsity (NVIDIA
// prints the sparse figure first, twice the dense one); docs/scaleout.md lists them.
// The FLOPs per token are the trainer's own definition (src/train/flops.h), written
// again here so that the model links neither the trainer nor the model room.
#pragma once
#include <string>
#include <vector>

#include "config/model_config.h"

namespace st {

struct GpuPeak {
  std::string name;         // the word that names it in a device or instance GPU name: "L4", "A100"
  double bf16_tflops = 0;   // dense, no sparsity
  std::string source;       // where the figure comes from
};

// The table, in a stable order: L4, A10G, L40S, A100, H100, H200.
const std::vector<GpuPeak>& gpu_peaks();

// The entry whose name is a whole word of `device_name`, case-insensitively ("NVIDIA
// L4", "l4", "NVIDIA A100-SXM4-80GB"; "L40S" is not "L4"); null when none is.
const GpuPeak* find_gpu_peak(const std::string& device_name);

// FLOPs per trained token, as src/train/flops.cpp defines them:
//   6 x (matmul parameters: q, k, v, o, gate, up, down of every layer, and lm_head
//        even when tied) + 6 x layers x hidden x seq_len (causal attention).
double step_flops_per_token(const ModelConfig& model, int seq_len);

// Seconds of compute for `tokens` tokens of one rank at `peak_tflops` x `mfu`.
double compute_seconds(const ModelConfig& model, int seq_len, double tokens, double peak_tflops, double mfu);

}  // namespace st

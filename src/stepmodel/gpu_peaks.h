// Dense bf16 tensor-core peaks of the GPUs the step model knows, each with where the
// number comes from, and the compute time of a step from one of them and an MFU
// assumption. The peaks are datasheet figures without structured sparsity (NVIDIA
// prints the sparse figure first, twice the dense one); docs/scaleout.md lists them.
// The FLOPs per token are the trainer's own definition (src/train/flops.h), written
// again here so that the model links neither the trainer nor the model room.
//
// FP8 (train.matmul_dtype = "fp8"): a GPU of compute capability 8.9 or more has FP8
// tensor cores (the trainer refuses FP8 below that, Backend::fp8_unsupported_reason).
// The step's compute time then counts the FLOPs of the FP8 layers (train.fp8_layers
// and train.fp8_bf16_end_blocks) at kFp8LayerSpeedup times their bf16 rate: one
// factor for the GEMMs and the casts together, calibrated on a measured step
// (docs/scaleout.md), not the datasheet's 2x.
#pragma once
#include <string>
#include <vector>

#include "config/model_config.h"
#include "config/options.h"

namespace st {

struct GpuPeak {
  std::string name;         // the word that names it in a device or instance GPU name: "L4", "A100"
  double bf16_tflops = 0;   // dense, no sparsity
  int compute_capability = 0;  // major x 10 + minor: 89 for 8.9
  std::string source;       // where the figure comes from

  bool has_fp8() const { return compute_capability >= 89; }
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

// The share of step_flops_per_token's FLOPs that run in FP8 under these [train] keys:
// 0 unless matmul_dtype = "fp8"; then 6 x the parameters of the FP8 kinds (qkv, o,
// gate_up, down) of every block but fp8_bf16_end_blocks at each end, and of the
// lm_head 2 x for its forward's GEMM (lm_head_fwd) and 4 x for the two of the
// backward (lm_head_grad); lm_head is both. Throws a config error on a kind it does
// not know.
double fp8_flop_share(const ModelConfig& model, int seq_len, const TrainOptions& train);

// How much faster than in bf16 the FP8 layers' share of a step runs: the one number
// that makes this model give the measured step of Qwen2.5-1.5B with the default
// layers (the MLP's) on an H100, 1.267x bf16 (docs/performance.md, 2026-12-06
// evening). With it the model gives 1.31x for all four kinds and for the MLP's and
// lm_head_grad (0.80 of the FLOPs each, against 0.71), measured 1.296x and 1.315x in
// the same call.
constexpr double kFp8LayerSpeedup = 1.423;

// The factor FP8 puts on a step's bf16 compute time: 1 - share + share / kFp8LayerSpeedup.
double fp8_compute_factor(double fp8_share);

// "" when `g` can train with matmul_dtype = "fp8", else why not (as the trainer says it).
std::string fp8_unsupported(const GpuPeak& g);

}  // namespace st

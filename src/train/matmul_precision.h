// train.matmul_dtype checked before a run allocates: FP8 needs a backend that
// computes it (an sm_89/sm_90 GPU, or the CPU's emulation) and GEMM dimensions that
// are multiples of 16.
#pragma once
#include <string>

#include "backend/backend.h"
#include "config/run_config.h"

namespace st {

// Refuses (exit 2, configuration) train.matmul_dtype=fp8 on a backend or at a shape
// that cannot run it, naming why and the way out; nothing for bf16.
void check_matmul_dtype(const RunConfig& cfg, const Backend& backend);

// Which of the blocks' linear layers train.fp8_layers and train.fp8_bf16_end_blocks put
// in FP8: "QKV, O, gate|up, down", "gate|up, down; QKV, O in bf16", and the blocks.
std::string describe_fp8_layers(const RunConfig& cfg);

// The run header's line on it: which matmuls run in which precision.
std::string describe_matmul_dtype(const RunConfig& cfg, const Backend& backend);

}  // namespace st

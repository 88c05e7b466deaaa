// Model FLOPs and the hardware peak they are measured against.
//   FLOPs per trained token = 6 x (matmul parameters, lm_head included even when tied)
//                           + 6 x layers x hidden x seq      (causal attention: half of 12·L·d·T)
// MFU = tokens/s x FLOPs per token / (peak dense bf16 FLOP/s of the device).
#pragma once
#include <string>

#include "config/model_config.h"

namespace st {

// Parameters that take part in a matrix multiply per token.
double matmul_params(const ModelConfig& c);
double flops_per_token(const ModelConfig& c, int seq_len);

// Datasheet dense bf16 TFLOP/s for a device name (H100/H200 989, A100 312, L4 121);
// 0 when the device is not in the table.
double peak_bf16_tflops(const std::string& device_name);

}  // namespace st

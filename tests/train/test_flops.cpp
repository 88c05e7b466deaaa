#include <gtest/gtest.h>

#include "config/model_config.h"
#include "train/flops.h"

namespace st {
namespace {

TEST(Flops, Qwen25_1p5bAtSeq2048MatchesTheHandCount) {
  // per layer: q,o 2*1536^2 + k,v 2*1536*256 + mlp 3*1536*8960 = 46,792,704
  // 28 layers + lm_head 1536*151936 = 1,543,569,408 matmul params
  const ModelConfig c = model_preset("qwen2.5-1.5b");
  EXPECT_DOUBLE_EQ(matmul_params(c), 1543569408.0);
  EXPECT_DOUBLE_EQ(flops_per_token(c, 2048), 6 * 1543569408.0 + 6.0 * 28 * 1536 * 2048);
}

TEST(Flops, PeakTableMatchesWholeNamesOnly) {
  EXPECT_EQ(peak_bf16_tflops("cuda:0 (NVIDIA H200)"), 989);
  EXPECT_EQ(peak_bf16_tflops("NVIDIA H100 80GB HBM3"), 989);
  EXPECT_EQ(peak_bf16_tflops("NVIDIA A100-SXM4-80GB"), 312);
  EXPECT_EQ(peak_bf16_tflops("NVIDIA L4"), 121);
  EXPECT_EQ(peak_bf16_tflops("NVIDIA L40S"), 0);  // not in the table: no MFU rather than a wrong one
  EXPECT_EQ(peak_bf16_tflops("cpu"), 0);
}

}  // namespace
}  // namespace st

#include "stepmodel/gpu_peaks.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace st {

const std::vector<GpuPeak>& gpu_peaks() {
  // NVIDIA's datasheets print "N | 2N*" or "2N*" with "* with sparsity": the dense
  // figure is the half. The trainer's MFU table (src/train/flops.cpp) uses the same
  // L4, A100, H100 and H200 figures. Compute capabilities: NVIDIA's CUDA GPUs list
  // (the A10G is an A10, GA102: 8.6).
  static const std::vector<GpuPeak> table = {
      {.name = "L4", .bf16_tflops = 121, .compute_capability = 89, .source = "NVIDIA L4 datasheet: BF16 Tensor Core 242 TFLOPS with sparsity"},
      // An AWS-only part (g5): no NVIDIA datasheet. Baseten's A10 vs A10G comparison
      // gives 70 (the A10's datasheet 125); a measured bf16 GEMM of 69.5 TFLOP/s
      // (zzc0721/torch-performance-test-data#126, 10240^3) agrees.
      {.name = "A10G", .bf16_tflops = 70, .compute_capability = 86,
       .source = "Baseten, NVIDIA A10 vs A10G (spec table); a measured 69.5 TFLOP/s bf16 GEMM agrees"},
      {.name = "L40S", .bf16_tflops = 362, .compute_capability = 89,
       .source = "NVIDIA L40S datasheet: BF16 Tensor Core 362.05 | 733 TFLOPS with sparsity"},
      {.name = "A100", .bf16_tflops = 312, .compute_capability = 80,
       .source = "NVIDIA A100 datasheet: BFLOAT16 Tensor Core 312 | 624 TFLOPS with sparsity (SXM and PCIe)"},
      {.name = "H100", .bf16_tflops = 989, .compute_capability = 90,
       .source = "NVIDIA H100 datasheet, SXM: BF16 Tensor Core 1,979 TFLOPS with sparsity (PCIe: 1,513)"},
      {.name = "H200", .bf16_tflops = 989, .compute_capability = 90,
       .source = "NVIDIA H200 datasheet, SXM: BF16 Tensor Core 1,979 TFLOPS with sparsity (NVL: 1,671)"},
  };
  return table;
}

const GpuPeak* find_gpu_peak(const std::string& device_name) {
  // Words of letters and digits, upper-cased: "NVIDIA A100-SXM4-80GB" -> NVIDIA, A100, SXM4, 80GB.
  std::vector<std::string> words(1);
  for (char c : device_name) {
    if (std::isalnum(static_cast<unsigned char>(c)))
      words.back() += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    else if (!words.back().empty())
      words.emplace_back();
  }
  for (const GpuPeak& g : gpu_peaks())
    for (const std::string& w : words)
      if (w == g.name) return &g;
  return nullptr;
}

double step_flops_per_token(const ModelConfig& m, int seq_len) {
  const double hidden = m.hidden_size, heads_width = static_cast<double>(m.num_heads) * m.head_dim();
  const double kv_width = static_cast<double>(m.num_kv_heads) * m.head_dim();
  // q and o are hidden x heads_width, k and v hidden x kv_width, the MLP three hidden x F.
  const double layer = 2 * hidden * heads_width + 2 * hidden * kv_width + 3 * hidden * m.intermediate_size;
  const double matmul = m.num_layers * layer + static_cast<double>(m.vocab_size) * hidden;
  return 6 * matmul + 6.0 * m.num_layers * hidden * seq_len;
}

double compute_seconds(const ModelConfig& model, int seq_len, double tokens, double peak_tflops, double mfu) {
  ST_CHECK_CONFIG(peak_tflops > 0 && mfu > 0 && mfu <= 1, "compute time: a peak above 0 TFLOP/s and an MFU in (0, 1] ",
                  "are needed, got ", peak_tflops, " TFLOP/s and ", mfu);
  return tokens * step_flops_per_token(model, seq_len) / (peak_tflops * 1e12 * mfu);
}

double fp8_flop_share(const ModelConfig& m, int seq_len, const TrainOptions& t) {
  const double total = step_flops_per_token(m, seq_len);
  if (t.matmul_dtype != "fp8" || total <= 0) return 0;
  const double hidden = m.hidden_size, heads_width = static_cast<double>(m.num_heads) * m.head_dim();
  const double kv_width = static_cast<double>(m.num_kv_heads) * m.head_dim();
  const double F = m.intermediate_size;
  double layer = 0;  // FP8 parameters of one block
  bool head_fwd = false, head_grad = false;  // the lm_head's forward GEMM, its two gradient GEMMs
  for (const std::string& k : t.fp8_layers) {
    if (k == "qkv") layer += hidden * (heads_width + 2 * kv_width);
    else if (k == "o") layer += heads_width * hidden;
    else if (k == "gate_up") layer += 2 * hidden * F;
    else if (k == "down") layer += F * hidden;
    else if (k == "lm_head") head_fwd = head_grad = true;
    else if (k == "lm_head_grad") head_grad = true;
    else if (k == "lm_head_fwd") head_fwd = true;
    else fail_config("train.fp8_layers: unknown layer '", k, "'");
  }
  const double head = 2.0 * head_fwd + 4.0 * head_grad;  // FLOPs per parameter of the lm_head's in FP8
  const double blocks = std::max(0, m.num_layers - 2 * std::max(t.fp8_bf16_end_blocks, 0));
  return (6 * blocks * layer + head * static_cast<double>(m.vocab_size) * hidden) / total;
}

double fp8_compute_factor(double share) { return 1 - share + share / kFp8LayerSpeedup; }

std::string fp8_unsupported(const GpuPeak& g) {
  if (g.has_fp8()) return "";
  return "the " + g.name + " has compute capability " + std::to_string(g.compute_capability / 10) + "." +
         std::to_string(g.compute_capability % 10) + ": FP8 tensor cores need 8.9 (Ada, e.g. L4, L40S) or 9.0 "
         "(Hopper: H100, H200)";
}

}  // namespace st

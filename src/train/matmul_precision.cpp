#include "train/matmul_precision.h"

#include "core/error.h"
#include "model/qwen2.h"

namespace st {

void check_matmul_dtype(const RunConfig& cfg, const Backend& backend) {
  if (cfg.train.matmul_dtype != "fp8") return;
  const std::string why = backend.fp8_unsupported_reason();
  ST_CHECK_CONFIG(why.empty(), "train.matmul_dtype=fp8: ", why, "; use train.matmul_dtype=bf16 on this device");
  const std::string shape = Qwen2Model::fp8_shape_problem(cfg.model, cfg.train.micro_batch, cfg.train.seq_len);
  ST_CHECK_CONFIG(shape.empty(), "train.matmul_dtype=fp8: ", shape);
}

std::string describe_matmul_dtype(const RunConfig& cfg, const Backend& backend) {
  const std::string native = backend.device() == Device::CPU ? "f32" : "bf16";
  if (cfg.train.matmul_dtype != "fp8") return "matmuls: all in " + native;
  return std::string("matmuls: fp8 for the blocks' QKV, O, gate|up and down (e4m3 weights and activations, e5m2 "
                     "gradients, per-tensor power-of-two scales" +
                     (cfg.train.fp8_scaling == "delayed"
                          ? std::string(" (delayed for activations and gradients: 16 steps of amax history)")
                          : std::string(" from the current amax")) +
                     ", fp32 accumulation") +
         (backend.device() == Device::CPU ? ", emulated" : "") + "); lm_head and attention in " + native;
}

}  // namespace st

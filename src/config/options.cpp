#include "config/options.h"

namespace st {

const std::vector<std::string>& train_devices() {
  static const std::vector<std::string> v = {"cpu", "cuda"};
  return v;
}

// The order is model/qwen2.h's Recompute enum: parse_recompute maps a name to its index.
const std::vector<std::string>& recompute_choices() {
  static const std::vector<std::string> v = {"none", "norm", "swiglu", "ffn", "attn", "block"};
  return v;
}

const std::vector<std::string>& matmul_dtypes() {
  static const std::vector<std::string> v = {"bf16", "fp8"};
  return v;
}

const std::vector<std::string>& fp8_scalings() {
  static const std::vector<std::string> v = {"current", "delayed"};
  return v;
}

const std::vector<std::string>& fp8_roundings() {
  static const std::vector<std::string> v = {"nearest", "stochastic"};
  return v;
}

// The order is Qwen2Model's linear slots (model/qwen2.h): bit i of its FP8 mask.
const std::vector<std::string>& fp8_layer_kinds() {
  static const std::vector<std::string> v = {"qkv", "o", "gate_up", "down", "lm_head", "lm_head_grad", "lm_head_fwd"};
  return v;
}

const std::vector<std::string>& offload_choices() {
  static const std::vector<std::string> v = {"none", "optimizer", "optimizer+master"};
  return v;
}

const std::vector<std::string>& state_dtypes() {
  static const std::vector<std::string> v = {"fp32", "bf16"};
  return v;
}

const std::vector<std::string>& data_sources() {
  static const std::vector<std::string> v = {"random", "text", "tokens"};
  return v;
}

const std::vector<std::string>& fabric_transports() {
  static const std::vector<std::string> v = {"auto", "efa", "ib", "socket"};
  return v;
}

const std::vector<std::string>& fabric_expect_transports() {
  static const std::vector<std::string> v = {"", "efa", "ib", "socket", "nvlink", "shm"};
  return v;
}

const std::vector<std::string>& progress_modes() {
  static const std::vector<std::string> v = {"auto", "on", "off"};
  return v;
}

const std::vector<std::string>& resume_configs() {
  static const std::vector<std::string> v = {"refuse", "override"};
  return v;
}

const std::vector<std::string>& export_dtypes() {
  static const std::vector<std::string> v = {"bf16", "f32"};
  return v;
}

const std::vector<std::string>& reduce_dtypes() {
  static const std::vector<std::string> v = {"fp32", "bf16"};
  return v;
}

}  // namespace st

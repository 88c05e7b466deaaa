#include "train/matmul_precision.h"

#include <algorithm>
#include <vector>

#include "config/options.h"
#include "core/error.h"
#include "core/strings.h"
#include "model/qwen2.h"

namespace st {

void check_matmul_dtype(const RunConfig& cfg, const Backend& backend) {
  if (cfg.train.matmul_dtype != "fp8") return;
  const std::string why = backend.fp8_unsupported_reason();
  ST_CHECK_CONFIG(why.empty(), "train.matmul_dtype=fp8: ", why, "; use train.matmul_dtype=bf16 on this device");
  const std::string shape = Qwen2Model::fp8_shape_problem(cfg.model, cfg.train.micro_batch, cfg.train.seq_len,
                                                           Fp8Options::from(cfg.train).lm_head_any());
  ST_CHECK_CONFIG(shape.empty(), "train.matmul_dtype=fp8: ", shape);
  ST_CHECK_CONFIG(!cfg.train.fp8_layers.empty(),
                  "train.matmul_dtype=fp8 with an empty train.fp8_layers leaves no layer in FP8; name some of qkv, o, "
                  "gate_up, down, lm_head, lm_head_grad, lm_head_fwd, or use train.matmul_dtype=bf16");
  const int64_t ends = cfg.train.fp8_bf16_end_blocks;
  ST_CHECK_CONFIG(2 * ends < cfg.model.num_layers, "train.fp8_bf16_end_blocks=", ends, " keeps the first ", ends,
                  " and the last ", ends, " of the model's ", cfg.model.num_layers,
                  " blocks in bf16: no block is left in FP8; use at most ", (cfg.model.num_layers - 1) / 2,
                  ", or train.matmul_dtype=bf16");
}

std::string describe_fp8_layers(const RunConfig& cfg) {
  const std::vector<std::string>& on = cfg.train.fp8_layers;
  // The blocks' kinds (the lm_head is described by describe_matmul_dtype), as the
  // header prints them.
  auto name = [](const std::string& key) -> std::string {
    return key == "qkv" ? "QKV" : key == "o" ? "O" : key == "gate_up" ? "gate|up" : key;
  };
  std::vector<std::string> fp8, bf16;
  for (const std::string& key : fp8_layer_kinds())
    if (key.rfind("lm_head", 0) != 0)
      (std::find(on.begin(), on.end(), key) != on.end() ? fp8 : bf16).push_back(name(key));
  if (fp8.empty()) return "none (" + join(bf16, ", ") + " in bf16)";
  std::string s = join(fp8, ", ");
  const int ends = cfg.train.fp8_bf16_end_blocks, L = cfg.model.num_layers;
  auto span = [](int a, int b) { return a == b ? std::to_string(a) : std::to_string(a) + "-" + std::to_string(b); };
  if (ends > 0)
    s += " in blocks " + span(ends, L - 1 - ends) + " (blocks " + span(0, ends - 1) + " and " + span(L - ends, L - 1) +
         " all in bf16)";
  if (!bf16.empty()) s += "; " + join(bf16, ", ") + " in bf16";
  return s;
}

std::string describe_matmul_dtype(const RunConfig& cfg, const Backend& backend) {
  const std::string native = backend.device() == Device::CPU ? "f32" : "bf16";
  if (cfg.train.matmul_dtype != "fp8") return "matmuls: all in " + native;
  // The lm_head: all three GEMMs (lm_head), its gradients' (lm_head_grad), its
  // forward's (lm_head_fwd), or none.
  const Fp8Options fp8 = Fp8Options::from(cfg.train);
  const bool head = fp8.lm_head_forward() && fp8.lm_head(), head_grad = fp8.lm_head() && !head,
             head_fwd = fp8.lm_head_forward() && !head;
  const bool cpu = backend.device() == Device::CPU;
  return "matmuls: fp8 for the blocks' " + describe_fp8_layers(cfg) +
         (head        ? " and the lm_head"
          : head_grad ? " and the lm_head's input and weight gradients"
          : head_fwd  ? " and the lm_head's forward (the logits)"
                      : "") +
         " (e4m3 weights and activations, e5m2 gradients" +
         (fp8.lm_head() && fp8.dlogits_stochastic ? std::string(" (the logits' rounded stochastically)")
                                                    : std::string()) +
         ", per-tensor power-of-two scales" +
         (cfg.train.fp8_scaling == "delayed"
              ? std::string(" (delayed for the blocks' activations and gradients: 16 steps of amax history)")
              : std::string(" from the current amax")) +
         ", fp32 accumulation" +
         (cfg.train.fp8_fast_accum && !cpu ? std::string(" (the forward's in the tensor cores' fast accumulator)")
                                          : std::string()) +
         (cpu ? ", emulated" : "") + "); " +
         (head        ? "attention"
          : head_grad ? "the lm_head's forward and attention"
          : head_fwd  ? "the lm_head's gradients and attention"
                      : "lm_head and attention") +
         " in " +
         native;
}

}  // namespace st

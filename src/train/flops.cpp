#include "train/flops.h"

#include <regex>

namespace st {

double matmul_params(const ModelConfig& c) {
  const double C = c.hidden_size, F = c.intermediate_size, V = c.vocab_size;
  const double q = static_cast<double>(c.num_heads) * c.head_dim(), kv = static_cast<double>(c.num_kv_heads) * c.head_dim();
  const double per_layer = C * q * 2 + C * kv * 2 + 3 * C * F;  // q, o; k, v; gate, up, down
  return c.num_layers * per_layer + V * C;                       // + lm_head
}

double flops_per_token(const ModelConfig& c, int seq_len) {
  return 6 * matmul_params(c) + 6.0 * c.num_layers * c.hidden_size * seq_len;
}

double peak_bf16_tflops(const std::string& name) {
  // Whole words only: "L4" must not match "L40S".
  static const struct {
    const char* pattern;
    double tflops;
  } table[] = {{"\\b(H100|H200|H800|GH200)\\b", 989}, {"\\b(A100|A800)\\b", 312}, {"\\bL4\\b", 121}};
  for (const auto& e : table)
    if (std::regex_search(name, std::regex(e.pattern))) return e.tflops;
  return 0;
}

}  // namespace st

// attention_forward / attention_backward (causal, grouped-query): the CPU against a
// naive masked softmax and finite differences; CUDA against the CPU per q, k and v
// part, deterministic, at shapes that take the legacy and the FlashAttention-2
// kernels (and cuDNN's, where it runs).
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "support/op_harness.h"

namespace st::testing {
namespace {

struct AttnShape {
  int B, T, H, KV, hd;
};
void PrintTo(const AttnShape& s, std::ostream* os) {
  *os << "B=" << s.B << " T=" << s.T << " H=" << s.H << " KV=" << s.KV << " hd=" << s.hd;
}
// The parameterised cases' names: "B2T5H4KV4hd4".
std::string shape_name(const ::testing::TestParamInfo<AttnShape>& info) {
  const AttnShape& s = info.param;
  return "B" + std::to_string(s.B) + "T" + std::to_string(s.T) + "H" + std::to_string(s.H) + "KV" +
         std::to_string(s.KV) + "hd" + std::to_string(s.hd);
}

// ---- CPU ------------------------------------------------------------------------------

class CpuAttention : public CpuOps, public ::testing::WithParamInterface<AttnShape> {};

TEST_P(CpuAttention, ForwardMatchesNaiveMaskedSoftmax) {
  const auto [B, T, H, KV, hd] = GetParam();
  const int row = (H + 2 * KV) * hd;
  Tensor qkv = rand(B * T * row, -2, 2), out = make(DType::F64, B * T * H * hd),
         lse = make(DType::F64, B * H * T);
  be->attention_forward(out, lse, qkv, B, T, H, KV, hd);
  Vec x = get(qkv), o = get(out), l = get(lse);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++) {
      const int g = h / (H / KV);
      // The full (T, T) score matrix with -inf above the diagonal, softmaxed row-wise.
      std::vector<Vec> S(T, Vec(T, -INFINITY));
      for (int t = 0; t < T; t++)
        for (int s = 0; s <= t; s++) {
          double d = 0;
          for (int i = 0; i < hd; i++)
            d += x[(b * T + t) * row + h * hd + i] * x[(b * T + s) * row + (H + g) * hd + i];
          S[t][s] = d / std::sqrt(double(hd));
        }
      for (int t = 0; t < T; t++) {
        double z = 0;
        for (int s = 0; s < T; s++) z += std::exp(S[t][s]);  // exp(-inf) = 0 masks
        EXPECT_NEAR(l[(b * H + h) * T + t], std::log(z), 1e-13);
        for (int i = 0; i < hd; i++) {
          double want = 0;
          for (int s = 0; s < T; s++)
            want += std::exp(S[t][s]) / z * x[(b * T + s) * row + (H + KV + g) * hd + i];
          EXPECT_NEAR(o[(b * T + t) * H * hd + h * hd + i], want, 1e-13);
        }
      }
    }
}

TEST_P(CpuAttention, BackwardMatchesFiniteDifferences) {
  const auto [B, T, H, KV, hd] = GetParam();
  const int n = B * T * (H + 2 * KV) * hd, n_out = B * T * H * hd;
  Tensor qkv = rand(n, -2, 2), out = make(DType::F64, n_out), lse = make(DType::F64, B * H * T);
  Vec w = randv(n_out);
  be->attention_forward(out, lse, qkv, B, T, H, KV, hd);
  Tensor dqkv = rand(n);  // garbage: dqkv is overwritten, all three parts
  be->attention_backward(dqkv, from(w), out, lse, qkv, B, T, H, KV, hd);
  expect_grad("dqkv", qkv, get(dqkv), [&] {
    be->attention_forward(out, lse, qkv, B, T, H, KV, hd);
    return wsum(w, out);
  });
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuAttention,
                         ::testing::Values(AttnShape{2, 5, 4, 4, 4},   // KV == H
                                           AttnShape{2, 7, 4, 2, 4},   // groups of 2
                                           AttnShape{1, 6, 4, 1, 6},   // one kv head
                                           AttnShape{3, 1, 2, 1, 2}),  // T = 1
                         shape_name);

// ---- CUDA -----------------------------------------------------------------------------

class CudaAttention : public CudaOps, public ::testing::WithParamInterface<AttnShape> {};

TEST_P(CudaAttention, ForwardAndBackwardMatchCpu) {
  const auto [B, T, H, KV, hd] = GetParam();
  const size_t rows = size_t(B) * T, nqkv = rows * (H + 2 * KV) * hd, nout = rows * H * hd;
  for (DType dt : kBoth) {
    SCOPED_TRACE(dtype_name(dt));
    Vec qkv = randv_as(dt, nqkv, -2, 2), dout = randv_as(dt, nout);
    Tensor cq = cpu_from(qkv), co = make(*cpu, DType::F32, nout), cl = make(*cpu, DType::F32, size_t(B) * H * T);
    Tensor cd = make(*cpu, DType::F32, nqkv);
    cpu->attention_forward(co, cl, cq, B, T, H, KV, hd);
    Vec out_cpu = cget(co);
    // The backward reads `out`: give the CPU the GPU's dtype rounding of it, as the
    // GPU backward sees its own (rounded) forward output.
    Tensor co_r = cpu_from(representable(out_cpu, dt));
    cpu->attention_backward(cd, cpu_from(dout), co_r, cl, cq, B, T, H, KV, hd);

    Tensor gq = gpu_from(qkv, dt), go = gpu_poisoned(dt, nout), gl = gpu_poisoned(DType::F32, size_t(B) * H * T);
    Tensor gd = gpu_poisoned(dt, nqkv), gdo = gpu_from(dout, dt);
    gpu().attention_forward(go, gl, gq, B, T, H, KV, hd);
    expect_close(tag(dt, "attention out"), get(go), out_cpu, tolerance(dt));
    expect_close(tag(dt, "attention lse"), get(gl), cget(cl), 1e-5);
    // Backward from the CPU's output (rounded): isolates the backward's own error.
    Tensor go_ref = gpu_from(representable(out_cpu, dt), dt);
    gpu().attention_backward(gd, gdo, go_ref, gl, gq, B, T, H, KV, hd);
    Vec g = get(gd), c = cget(cd);
    // q, k and v parts separately: an error in one must not hide behind the others.
    const auto gparts = qkv_parts(g, rows, H, KV, hd), cparts = qkv_parts(c, rows, H, KV, hd);
    for (size_t p = 0; p < gparts.size(); p++) {
      const std::string& name = gparts[p].first;
      // With T = 1 every softmax has one entry: P = 1, dS = 0, so dq = dk = 0 exactly.
      const bool zero_ok = T == 1 && name != "dv";
      expect_close(tag(dt, "attention " + name), gparts[p].second, cparts[p].second, tolerance(dt), zero_ok);
    }
    // No atomics anywhere: a second backward is bitwise identical.
    Tensor gd2 = gpu_poisoned(dt, nqkv);
    gpu().attention_backward(gd2, gdo, go_ref, gl, gq, B, T, H, KV, hd);
    EXPECT_TRUE(get(gd2) == g) << "attention backward is not deterministic";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention,
                         ::testing::Values(AttnShape{2, 100, 4, 2, 64},    // groups of 2, T not a tile multiple
                                           AttnShape{1, 77, 4, 4, 128},    // KV == H, hd 128
                                           AttnShape{1, 200, 12, 2, 128},  // Qwen2.5-1.5B's heads
                                           AttnShape{2, 33, 2, 1, 16},     // hd 16 (padded to 32)
                                           AttnShape{3, 65, 6, 3, 48},     // hd 48 (padded to 64)
                                           AttnShape{2, 1, 2, 1, 32},      // T = 1
                                           AttnShape{1, 130, 2, 2, 32},    // several tiles, hd 32
                                           // The FlashAttention-2 kernels (BF16, hd 64 and 128):
                                           AttnShape{2, 1, 4, 2, 64},      // T = 1
                                           AttnShape{1, 1, 4, 2, 128},     // T = 1
                                           AttnShape{2, 300, 6, 2, 64},    // several tiles, T not a multiple
                                           AttnShape{2, 257, 4, 4, 64},    // KV == H, several tiles
                                           AttnShape{1, 256, 2, 1, 128},   // T a multiple of every tile
                                           AttnShape{1, 517, 12, 2, 128}), // 1.5B heads, several tiles
                         shape_name);

}  // namespace
}  // namespace st::testing

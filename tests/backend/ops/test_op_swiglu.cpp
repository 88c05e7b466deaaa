// swiglu_forward / swiglu_backward: the CPU against silu(gate)·up and finite
// differences; CUDA against the CPU, packed and scalar paths giving the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "support/op_harness.h"

namespace st::testing {
namespace {

// ---- CPU ------------------------------------------------------------------------------

TEST_F(CpuOps, SwiGlu) {
  const int N = 3, F = 5;
  Tensor gu = rand(N * 2 * F, -3, 3), out = make(DType::F64, N * F);
  be->swiglu_forward(out, gu, N, F);
  Vec x = get(gu), o = get(out);
  for (int r = 0; r < N; r++)
    for (int i = 0; i < F; i++) {
      double g = x[r * 2 * F + i], u = x[r * 2 * F + F + i];
      EXPECT_NEAR(o[r * F + i], g / (1 + std::exp(-g)) * u, 1e-14);
    }

  Vec w = randv(N * F);
  Tensor dgu = rand(N * 2 * F);  // garbage: overwritten
  be->swiglu_backward(dgu, from(w), gu, N, F);
  expect_grad("dgu", gu, get(dgu), [&] {
    be->swiglu_forward(out, gu, N, F);
    return wsum(w, out);
  });
}

// ---- CUDA -----------------------------------------------------------------------------

// F = 300: 16-byte packs for F32 only (300 % 8 != 0); F = 8960 (Qwen2.5-1.5B) aligned
// (packs) and at an odd offset (scalar) on the same inputs: the same bits either way.
TEST_F(CudaOps, SwiGlu) {
  struct Case {
    int N, F;
    size_t off;  // of out, gu, dout, dgu
  };
  for (DType dt : kBoth) {
    std::vector<uint8_t> first_out, first_dgu;
    Vec gu, dy;
    for (const Case k : {Case{53, 300, 0}, Case{40, 8960, 0}, Case{40, 8960, 1}}) {
      const int N = k.N, F = k.F;
      const std::string what = " F=" + std::to_string(F) + " offset " + std::to_string(k.off);
      if (gu.size() != size_t(N) * 2 * F) gu = randv_as(dt, size_t(N) * 2 * F, -4, 4), dy = randv_as(dt, size_t(N) * F);
      Tensor co = make(*cpu, DType::F32, size_t(N) * F), cdg = make(*cpu, DType::F32, size_t(N) * 2 * F);
      cpu->swiglu_forward(co, cpu_from(gu), N, F);
      cpu->swiglu_backward(cdg, cpu_from(dy), cpu_from(gu), N, F);
      Tensor go = gpu_poisoned(dt, size_t(N) * F, k.off), gdg = gpu_poisoned(dt, size_t(N) * 2 * F, k.off);
      Tensor ggu = gpu_from_at(gu, dt, k.off);
      gpu().swiglu_forward(go, ggu, N, F);
      gpu().swiglu_backward(gdg, gpu_from_at(dy, dt, k.off), ggu, N, F);
      expect_close(tag(dt, "swiglu out" + what), get(go), cget(co), tolerance(dt));
      expect_close(tag(dt, "swiglu dgu" + what), get(gdg), cget(cdg), tolerance(dt));
      if (F != 8960) continue;
      if (first_out.empty()) {
        first_out = raw(go), first_dgu = raw(gdg);
      } else {
        EXPECT_TRUE(raw(go) == first_out) << tag(dt, "swiglu out") << what << ": bits differ from the packed path";
        EXPECT_TRUE(raw(gdg) == first_dgu) << tag(dt, "swiglu dgu") << what << ": bits differ from the packed path";
      }
    }
  }
}

}  // namespace
}  // namespace st::testing

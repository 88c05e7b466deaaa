// adamw and adamw_copy: the CPU against two steps computed in double precision in
// torch.optim.AdamW's order; CUDA against the CPU to the last bits, and adamw_copy as
// adamw plus a copy, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "support/op_harness.h"

namespace st::testing {
namespace {

// ---- CPU ------------------------------------------------------------------------------

TEST_F(CpuOps, AdamWTwoSteps) {
  // Expected values from a separate double-precision script in torch.optim.AdamW order
  // (p *= 1 - lr·wd; m, v update; p -= lr·m̂/(√v̂ + eps)) with g' = 0.5·grad:
  // step 1 moves each p by -lr·sign(g) (m̂/√v̂ = ±1), e.g. 0.5·0.99 - 0.1 = 0.395;
  // the last element has zero gradient and only decays (0.25·0.99² = 0.245025).
  Tensor p = make(DType::F32, 4), g = make(DType::F32, 4), m = make(DType::F32, 4), v = make(DType::F32, 4);
  be->copy(p, from({0.5, -1.0, 2.0, 0.25}));
  AdamWParams hp;
  hp.lr = 0.1f, hp.beta1 = 0.9f, hp.beta2 = 0.95f, hp.eps = 1e-8f, hp.weight_decay = 0.1f,
  hp.grad_scale = 0.5f;
  auto expect_close = [](const Vec& got, const Vec& want, const char* what) {
    for (size_t i = 0; i < want.size(); i++)  // F32 storage: a few roundings of 6e-8 each
      EXPECT_NEAR(got[i], want[i], 1e-6 * std::abs(want[i]) + 1e-12) << what << "[" << i << "]";
  };

  be->copy(g, from({0.2, -0.4, 0.6, 0.0}));
  hp.step = 1;
  be->adamw(p, g, m, v, 4, hp);
  expect_close(get(p), {0.39500000999999896, -0.8900000049999998, 1.8800000033333333, 0.2475}, "p1");
  expect_close(get(m), {0.01, -0.02, 0.03, 0}, "m1");
  expect_close(get(v), {0.0005, 0.002, 0.0045, 0}, "v1");

  be->copy(g, from({-0.8, 0.1, 0.6, 0.0}));
  hp.step = 2;
  be->adamw(p, g, m, v, 4, hp);
  expect_close(get(p), {0.4463901854611393, -0.8336234152740662, 1.7612000066333333, 0.245025}, "p2");
  expect_close(get(m), {-0.031, -0.013, 0.057, 0}, "m2");
  expect_close(get(v), {0.008475, 0.002025, 0.008775, 0}, "v2");
}

// ---- CUDA -----------------------------------------------------------------------------

TEST_F(CudaOps, AdamWMatchesCpuToTheLastBits) {
  const size_t n = 10007;
  Vec p0 = randv(n), m0(n, 0.0f), v0(n, 0.0f);
  Tensor cp = cpu_from(p0), cm = cpu_from(m0), cv = cpu_from(v0);
  Tensor gp = gpu_from(p0, DType::F32), gm = gpu_from(m0, DType::F32), gv = gpu_from(v0, DType::F32);
  AdamWParams hp;
  hp.lr = 3e-3f, hp.beta1 = 0.9f, hp.beta2 = 0.95f, hp.eps = 1e-8f, hp.weight_decay = 0.1f, hp.grad_scale = 0.5f;
  for (int step = 1; step <= 3; step++) {
    Vec g = randv(n, -0.1f, 0.1f);
    g[0] = 0.0f;  // pure decay
    hp.step = step;
    cpu->adamw(cp, cpu_from(g), cm, cv, n, hp);
    gpu().adamw(gp, gpu_from(g, DType::F32), gm, gv, n, hp);
  }
  for (auto [name, c, gt] : {std::tuple{"param", cp, gp}, std::tuple{"m", cm, gm}, std::tuple{"v", cv, gv}}) {
    Vec want = cget(c), got = get(gt);
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
      ASSERT_TRUE(std::isfinite(got[i])) << name << "[" << i << "]";
      worst = std::max(worst, std::abs(double(got[i]) - want[i]) / std::max(std::abs(double(want[i])), 1e-30));
    }
    std::printf("[ error    ] adamw %-38s max rel %.3g  (tol 1e-06)\n", name, worst);
    EXPECT_LE(worst, 1e-6) << name;
  }
}

// adamw_copy is adamw plus the compute-dtype copy of the new parameter, bit for bit,
// on the packed path (aligned, n % 4 == 0) and the scalar one.
TEST_F(CudaOps, AdamWCopyIsAdamWThenACopy) {
  for (auto [n, off] : {std::pair<size_t, size_t>{10008, 0}, std::pair<size_t, size_t>{10007, 1}})
    for (DType cdt : {DType::BF16, DType::F32}) {
      const Vec p0 = randv(n), m0 = randv(n, 0, 0.01f), v0 = randv(n, 0, 1e-4f), g = randv(n, -0.1f, 0.1f);
      Tensor pa = gpu_from_at(p0, DType::F32, off), ma = gpu_from_at(m0, DType::F32, off),
             va = gpu_from_at(v0, DType::F32, off), ga = gpu_from_at(g, DType::F32, off);
      Tensor pb = gpu_from_at(p0, DType::F32, off), mb = gpu_from_at(m0, DType::F32, off),
             vb = gpu_from_at(v0, DType::F32, off), gb = gpu_from_at(g, DType::F32, off);
      Tensor want = gpu_poisoned(cdt, n, off), got = gpu_poisoned(cdt, n, off);
      AdamWParams hp;
      hp.lr = 3e-3f, hp.weight_decay = 0.1f, hp.grad_scale = 0.7f, hp.step = 5;
      gpu().adamw(pa, ga, ma, va, n, hp);
      gpu().copy(want, pa);
      gpu().adamw_copy(pb, gb, mb, vb, got, n, hp);
      const std::string what = std::string(dtype_name(cdt)) + " n " + std::to_string(n);
      EXPECT_EQ(raw(pa), raw(pb)) << what;
      EXPECT_EQ(raw(ma), raw(mb)) << what;
      EXPECT_EQ(raw(va), raw(vb)) << what;
      EXPECT_EQ(raw(want), raw(got)) << what;
    }
}

}  // namespace
}  // namespace st::testing

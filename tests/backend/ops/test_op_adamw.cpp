// adamw and adamw_copy: the CPU against two steps computed in double precision in
// torch.optim.AdamW's order; CUDA against the CPU to the last bits, and adamw_copy as
// adamw plus a copy, bit for bit. bf16 master weights and moments
// (optim.master_dtype / optim.state_dtype = bf16): stochastic rounding is unbiased
// exactly, keeps updates far below one bf16 step, and the GPU stores the CPU's bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/stochastic_round.h"
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

// Over all 2^16 draws a value rounds up exactly as often as its distance from the bf16
// below says, so the mean of the rounded values is the value itself, to the bit; a bf16
// value, NaN and the infinities pass unchanged.
TEST(StochasticRound, UnbiasedOverEveryDrawAndExactOnBf16Values) {
  std::mt19937_64 rng(test_seed());
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (int k = 0; k < 50; ++k) {
    const float x = u(rng);
    double sum = 0;
    for (uint32_t r = 0; r < 65536; ++r) sum += bf16_to_f32(bf16_bits_stochastic(x, r));
    EXPECT_EQ(sum / 65536.0, double(x)) << x;
    const float b = bf16_to_f32(f32_to_bf16(x));
    for (uint32_t r : {0u, 1u, 0x7fffu, 0xffffu}) EXPECT_EQ(bf16_to_f32(bf16_bits_stochastic(b, r)), b) << b;
  }
  EXPECT_TRUE(std::isnan(bf16_to_f32(bf16_bits_stochastic(NAN, 0xffff))));
  EXPECT_EQ(bf16_to_f32(bf16_bits_stochastic(INFINITY, 0xffff)), INFINITY);
  EXPECT_EQ(bf16_to_f32(bf16_bits_stochastic(-INFINITY, 0xffff)), -INFINITY);
  // The draws of different keys and indices differ (the three stores use their own bits).
  EXPECT_NE(adamw_round_bits(1, 0), adamw_round_bits(2, 0));
  EXPECT_NE(adamw_round_bits(1, 0), adamw_round_bits(1, 1));
}

// bf16 master weights and bf16 m and v follow the f32 update closely over many steps;
// the same key gives the same bits, another key other bits.
TEST_F(CpuOps, AdamWBf16StateAndMasterFollowTheF32Update) {
  const size_t n = 4096;
  const Vec p0 = randv(n);
  Tensor p32 = make(DType::F32, n), m32 = make(DType::F32, n), v32 = make(DType::F32, n);
  Tensor p16 = make(DType::BF16, n), m16 = make(DType::BF16, n), v16 = make(DType::BF16, n);
  Tensor q16 = make(DType::BF16, n), qm = make(DType::BF16, n), qv = make(DType::BF16, n);  // another key
  be->copy(p16, from(p0));
  be->copy(p32, p16);  // the same (bf16) start
  be->copy(q16, p16);
  Tensor g = make(DType::F32, n);
  AdamWParams hp;
  hp.lr = 1e-3f, hp.weight_decay = 0.1f;
  for (int step = 1; step <= 100; ++step) {
    be->copy(g, rand(n, -0.1, 0.1));
    hp.step = step;
    hp.round_key = 1000 + step;
    be->adamw(p32, g, m32, v32, n, hp);
    be->adamw(p16, g, m16, v16, n, hp);
    hp.round_key = 5000 + step;
    be->adamw(q16, g, qm, qv, n, hp);
  }
  const Vec a = get(p32), b = get(p16), c = get(q16);
  // Stochastic rounding adds noise, not drift: over 100 steps the bf16 path wanders from
  // the f32 one like a random walk of a fraction of a bf16 step (2^-8..2^-7 here) per
  // step, while the mean difference stays near zero and far below the update itself.
  double drift = 0, noise = 0, update = 0;
  for (size_t i = 0; i < n; ++i) {
    drift += (b[i] - a[i]) / n;
    noise += (b[i] - a[i]) * (b[i] - a[i]) / n;
    const double u = a[i] - double(bf16_to_f32(f32_to_bf16(float(p0[i]))));
    update += u * u / n;
  }
  noise = std::sqrt(noise), update = std::sqrt(update);
  std::printf("[ error    ] bf16 adamw: mean %.3g, rms %.3g; f32 update rms %.3g\n", drift, noise, update);
  EXPECT_LT(std::abs(drift), 1e-3);
  EXPECT_LT(noise, 0.02);
  EXPECT_GT(update, 0.008);
  EXPECT_NE(b, c) << "another round_key gave the same bits";
  // Mixed: an f32 master with bf16 moments, and the reverse, also stay near.
  for (auto [pd, sd] : {std::pair{DType::F32, DType::BF16}, std::pair{DType::BF16, DType::F32}}) {
    Tensor p = make(pd, n), m = make(sd, n), v = make(sd, n);
    be->copy(p, from(p0));
    for (int step = 1; step <= 3; ++step) {
      hp.step = step;
      be->copy(g, rand(n, -0.1, 0.1));
      be->adamw(p, g, m, v, n, hp);
    }
    for (double x : get(p)) ASSERT_TRUE(std::isfinite(x));
  }
}

// A bf16 master keeps updates far below one bf16 step: round-to-nearest would leave 1.0
// at 1.0 under 200 steps of -1e-4 (a bf16 step at 1 is 2^-8 below, 2^-7 above); with
// stochastic rounding the mean lands where the f32 update goes, 0.98.
TEST_F(CpuOps, AdamWBf16MasterKeepsUpdatesBelowOneBf16Step) {
  const size_t n = 8192;
  Tensor p = make(DType::BF16, n), m = make(DType::BF16, n), v = make(DType::BF16, n), g = make(DType::F32, n);
  be->fill(p, 1.0);
  be->fill(g, 0.5);  // a constant gradient: m̂/√v̂ = 1, every step moves by -lr
  AdamWParams hp;
  hp.lr = 1e-4f, hp.weight_decay = 0, hp.eps = 1e-12f;
  for (int step = 1; step <= 200; ++step) {
    hp.step = step;
    hp.round_key = step;
    be->adamw(p, g, m, v, n, hp);
  }
  double mean = 0;
  for (double x : get(p)) mean += x / n;
  EXPECT_NEAR(mean, 0.98, 0.002);
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

// bf16 master and/or bf16 moments (with and without the compute copy): the GPU stores the
// CPU's bits. Its double arithmetic matches the CPU's to the last f32 bit or so, and a
// last-bit difference before the stochastic rounding flips a store only when it crosses
// the drawn threshold (about 2^-16 of the time), so at most a few elements in 10^4 may
// differ, by one bf16 step.
TEST_F(CudaOps, AdamWBf16MatchesTheCpuBits) {
  const size_t n = 10007;
  for (auto [pd, sd] : {std::pair{DType::BF16, DType::BF16}, std::pair{DType::F32, DType::BF16},
                        std::pair{DType::BF16, DType::F32}})
    for (int copy_kind = 0; copy_kind < 3; ++copy_kind) {  // none, bf16, f32
      const std::string what = std::string("param ") + std::string(dtype_name(pd)) + ", state " +
                               std::string(dtype_name(sd)) + ", copy " + std::to_string(copy_kind);
      const Vec p0 = representable(randv(n), pd);
      Tensor cp = make(*cpu, pd, n), cm = make(*cpu, sd, n), cv = make(*cpu, sd, n);
      cpu->copy(cp, cpu_from(p0));
      Tensor gp = gpu_from(p0, pd), gm = gpu_from(Vec(n, 0.0f), sd), gv = gpu_from(Vec(n, 0.0f), sd);
      const DType cdt = copy_kind == 1 ? DType::BF16 : DType::F32;
      Tensor gc = copy_kind ? gpu_poisoned(cdt, n) : Tensor{};
      AdamWParams hp;
      hp.lr = 3e-3f, hp.weight_decay = 0.1f, hp.grad_scale = 0.5f, hp.round_index = 77;
      for (int step = 1; step <= 3; step++) {
        const Vec g = randv(n, -0.1f, 0.1f);
        hp.step = step;
        hp.round_key = 0x5eed + step;
        cpu->adamw(cp, cpu_from(g), cm, cv, n, hp);
        if (copy_kind) gpu().adamw_copy(gp, gpu_from(g, DType::F32), gm, gv, gc, n, hp);
        else gpu().adamw(gp, gpu_from(g, DType::F32), gm, gv, n, hp);
      }
      for (auto [name, c, gt] : {std::tuple{"param", cp, gp}, std::tuple{"m", cm, gm}, std::tuple{"v", cv, gv}}) {
        const Vec want = cget(c), got = get(gt);
        size_t differ = 0;
        for (size_t i = 0; i < n; i++) {
          ASSERT_TRUE(std::isfinite(got[i])) << what << " " << name << "[" << i << "]";
          if (got[i] == want[i]) continue;
          ++differ;
          EXPECT_LE(std::abs(double(got[i]) - want[i]), std::abs(double(want[i])) * (c.dtype == DType::BF16 ? 1.6e-2 : 1e-6))
              << what << " " << name << "[" << i << "]";
        }
        EXPECT_LE(differ, 5u) << what << " " << name;
      }
      if (copy_kind) {
        const Vec stored = get(gp), copied = get(gc);
        for (size_t i = 0; i < n; i++)
          ASSERT_EQ(copied[i], cdt == DType::BF16 ? double(bf16_to_f32(f32_to_bf16(float(stored[i])))) : stored[i])
              << what << " copy[" << i << "]";
      }
    }
}

}  // namespace
}  // namespace st::testing

// FP8 (backend/fp8.h): the host encoding against the formats' definitions (every
// code, every tie), the power-of-two scale, the CPU's fp8_quantize and matmul_fp8
// emulation against hand computations, and the CUDA ops against that emulation on
// fresh random inputs: the quantization bit for bit, the GEMM up to the order of its
// fp32 sums.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/fp8.h"
#include "backend/stochastic_round.h"
#include "support/op_harness.h"

namespace st::testing {
namespace {

constexpr Fp8Format kFormats[] = {Fp8Format::E4M3, Fp8Format::E5M2};
const char* fname(Fp8Format f) { return f == Fp8Format::E4M3 ? "e4m3" : "e5m2"; }
DType fdtype(Fp8Format f) { return f == Fp8Format::E4M3 ? DType::F8E4M3 : DType::F8E5M2; }

// ---- the formats ----------------------------------------------------------------------

TEST(Fp8Format, KnownValues) {
  const auto E4 = Fp8Format::E4M3, E5 = Fp8Format::E5M2;
  EXPECT_EQ(fp8_encode(1.0f, E4), 0x38);
  EXPECT_EQ(fp8_encode(-2.0f, E4), 0xC0);
  EXPECT_EQ(fp8_encode(448.0f, E4), 0x7E);           // the largest finite
  EXPECT_EQ(fp8_encode(1000.0f, E4), 0x7E);          // saturates
  EXPECT_EQ(fp8_encode(INFINITY, E4), 0x7E);
  EXPECT_EQ(fp8_encode(-INFINITY, E4), 0xFE);
  EXPECT_EQ(fp8_encode(std::ldexp(1.0f, -9), E4), 0x01);   // the smallest subnormal
  EXPECT_EQ(fp8_encode(std::ldexp(1.0f, -10), E4), 0x00);  // half of it: a tie, to even (zero)
  EXPECT_EQ(fp8_encode(std::ldexp(1.5f, -10), E4), 0x01);
  EXPECT_EQ(fp8_encode(1.0625f, E4), 0x38);  // between 1 and 1.125: to the even mantissa
  EXPECT_EQ(fp8_encode(1.1875f, E4), 0x3A);  // between 1.125 and 1.25: to 1.25
  EXPECT_EQ(fp8_encode(-0.0f, E4), 0x80);
  EXPECT_EQ(fp8_encode(NAN, E4), 0x7F);
  EXPECT_TRUE(std::isnan(fp8_decode(0x7F, E4)));
  EXPECT_TRUE(std::isnan(fp8_decode(0xFF, E4)));
  EXPECT_EQ(fp8_decode(0x7E, E4), 448.0f);

  EXPECT_EQ(fp8_encode(1.0f, E5), 0x3C);
  EXPECT_EQ(fp8_encode(57344.0f, E5), 0x7B);
  EXPECT_EQ(fp8_encode(1e6f, E5), 0x7B);
  EXPECT_EQ(fp8_encode(std::ldexp(1.0f, -16), E5), 0x01);
  EXPECT_EQ(fp8_decode(0x7C, E5), INFINITY);
  EXPECT_TRUE(std::isnan(fp8_decode(0x7F, E5)));
}

// Every finite code decodes to a value that encodes back to it; the midpoint of every
// two neighbouring values rounds to the one with the even code; just above it, up.
TEST(Fp8Format, EveryCodeAndEveryTie) {
  for (Fp8Format f : kFormats) {
    std::vector<std::pair<float, int>> values;  // non-negative finite values in order
    for (int c = 0; c < 128; c++) {
      const float v = fp8_decode(uint8_t(c), f);
      if (!std::isfinite(v)) continue;
      EXPECT_EQ(fp8_encode(v, f), c) << fname(f) << " code " << c;
      EXPECT_EQ(fp8_encode(-v, f), c | 0x80) << fname(f) << " code -" << c;
      values.emplace_back(v, c);
    }
    for (size_t i = 1; i < values.size(); i++) {
      const auto [lo, clo] = values[i - 1];
      const auto [hi, chi] = values[i];
      ASSERT_LT(lo, hi) << fname(f);
      const float mid = (lo + hi) / 2;
      EXPECT_EQ(fp8_encode(mid, f), (clo % 2 == 0) ? clo : chi) << fname(f) << " tie " << lo << " / " << hi;
      EXPECT_EQ(fp8_encode(std::nextafter(mid, INFINITY), f), chi) << fname(f);
      EXPECT_EQ(fp8_encode(std::nextafter(mid, 0.0f), f), clo) << fname(f);
    }
  }
}

TEST(Fp8Format, ScaleIsThePowerOfTwoThatFits) {
  for (Fp8Format f : kFormats) {
    const float mx = fp8_spec(f).max_finite;
    for (float amax : {1.0f, 0.3f, 447.0f, 449.0f, 1e-3f, 7e4f, 3.0e37f, 1e-30f}) {
      const float s = fp8_scale(amax, mx);
      int e = 0;
      EXPECT_EQ(std::frexp(s, &e), 0.5f) << "a power of two: " << s;
      EXPECT_LE(double(amax) * s, mx) << fname(f) << " amax " << amax;
      EXPECT_GT(double(amax) * s * 2, mx) << fname(f) << " amax " << amax;
    }
    EXPECT_EQ(fp8_scale(0.0f, mx), 1.0f);
    EXPECT_EQ(fp8_scale(NAN, mx), 1.0f);
    EXPECT_EQ(fp8_scale(INFINITY, mx), 1.0f);
    EXPECT_EQ(fp8_scale(1e-45f, mx), std::ldexp(1.0f, 127));  // capped, not infinite
  }
}

// ---- the CPU emulation ------------------------------------------------------------------

class CpuFp8 : public CpuOps {};

TEST_F(CpuFp8, QuantizeWritesTheScaledRoundedValuesAndTheirTranspose) {
  const int rows = 7, cols = 5;
  for (Fp8Format f : kFormats) {
    Vec x = randv(size_t(rows) * cols, -3, 3);
    x[11] = -12;  // the amax: 1.5 x a power of two, exact in both formats once scaled
    Tensor tx = make(DType::F32, x.size());
    be->copy(tx, from(x));
    Tensor q = make(fdtype(f), x.size()), qt = make(fdtype(f), x.size()), inv = make(DType::F32, 1);
    be->fp8_quantize(q, qt, inv, tx, rows, cols);
    const float s = fp8_scale(12.0f, fp8_spec(f).max_finite);
    EXPECT_EQ(get(inv)[0], 1.0 / s);
    const uint8_t* qb = q.as<uint8_t>();
    const uint8_t* qtb = qt.as<uint8_t>();
    for (int r = 0; r < rows; r++)
      for (int c = 0; c < cols; c++) {
        const size_t i = size_t(r) * cols + c;
        EXPECT_EQ(qb[i], fp8_encode(float(x[i]) * s, f)) << fname(f) << " " << r << "," << c;
        EXPECT_EQ(qtb[size_t(c) * rows + r], qb[i]) << fname(f) << " transpose " << r << "," << c;
      }
    // The amax scaled: within a factor of two below the format's largest value.
    EXPECT_EQ(fp8_decode(qb[11], f), -12.0f * s);
    // The scale reused: the same bytes, inv_scale only read; a different given scale
    // (twice as large) gives other codes.
    Tensor q2 = make(fdtype(f), x.size());
    be->fp8_quantize(q2, Tensor{}, inv, tx, rows, cols, true);
    EXPECT_EQ(std::memcmp(q2.as<uint8_t>(), qb, x.size()), 0) << fname(f);
    inv.as<float>()[0] = 0.5f / s;
    be->fp8_quantize(q2, Tensor{}, inv, tx, rows, cols, true);
    EXPECT_EQ(get(inv)[0], 0.5 / s);
    EXPECT_EQ(q2.as<uint8_t>()[0], fp8_encode(float(x[0]) * 2 * s, f));
    // The transpose alone, and an all-zero tensor: scale 1, zero codes.
    Tensor z = make(DType::F32, x.size()), qt2 = make(fdtype(f), x.size());
    be->fp8_quantize(Tensor{}, qt2, inv, z, rows, cols);
    EXPECT_EQ(get(inv)[0], 1.0);
    for (size_t i = 0; i < x.size(); i++) EXPECT_EQ(qt2.as<uint8_t>()[i], 0);
  }
}

// Delayed scaling's two parts: a cast with a given scale records max(amax, |x|) in the
// same pass (a NaN sticks), and the once-a-step roll moves the amax into the history
// at `pos`, zeroes it and sets each scale from the history's largest value.
TEST_F(CpuFp8, DelayedScalingRecordsTheAmaxAndRollsTheHistory) {
  const int rows = 6, cols = 8;
  Vec x = randv(size_t(rows) * cols, -2, 2);
  x[13] = -5.5;
  Tensor tx = make(DType::F32, x.size()), q = make(DType::F8E4M3, x.size()), inv = make(DType::F32, 1);
  Tensor amax = make(DType::F32, 1);
  be->copy(tx, from(x));
  inv.as<float>()[0] = 0.25f;  // a given scale of 4: read, never written
  be->fp8_quantize(q, Tensor{}, inv, tx, rows, cols, true, amax);
  EXPECT_EQ(get(inv)[0], 0.25);
  EXPECT_EQ(get(amax)[0], 5.5);
  EXPECT_EQ(q.as<uint8_t>()[3], fp8_encode(float(x[3]) * 4, Fp8Format::E4M3));
  // A smaller tensor leaves the larger amax; a current-scaled cast records too.
  Vec small(x.size(), 0.5);
  be->copy(tx, from(small));
  be->fp8_quantize(q, Tensor{}, inv, tx, rows, cols, true, amax);
  EXPECT_EQ(get(amax)[0], 5.5);
  small[7] = -9;
  be->copy(tx, from(small));
  be->fp8_quantize(q, Tensor{}, inv, tx, rows, cols, false, amax);
  EXPECT_EQ(get(amax)[0], 9.0);
  EXPECT_EQ(get(inv)[0], 1.0 / fp8_scale(9.0f, 448.0f));
  small[2] = NAN;
  be->copy(tx, from(small));
  be->fp8_quantize(q, Tensor{}, inv, tx, rows, cols, true, amax);
  EXPECT_TRUE(std::isnan(get(amax)[0]));
  small[2] = 100;
  be->copy(tx, from(small));
  be->fp8_quantize(q, Tensor{}, inv, tx, rows, cols, true, amax);
  EXPECT_TRUE(std::isnan(get(amax)[0])) << "a NaN sticks";

  // The roll: 3 tensors, history of 4, scales 2 floats apart.
  const int n = 3, len = 4, stride = 2;
  Tensor am = make(DType::F32, n), hist = make(DType::F32, size_t(n) * len), sc = make(DType::F32, n * stride);
  const float e5 = fp8_spec(Fp8Format::E5M2).max_finite;
  for (int step = 0; step < 6; step++) {
    for (int i = 0; i < n; i++) am.as<float>()[i] = float((i + 1) * (step == 2 ? 100 : step + 1));
    be->fp8_roll_scales(sc, stride, am, hist, n, len, step % len, Fp8Format::E5M2);
    for (int i = 0; i < n; i++) {
      EXPECT_EQ(am.as<float>()[i], 0.0f) << "step " << step;
      // The largest of the last four steps: step 2's 100 x (i + 1) until it leaves.
      const float want = step - 2 < len && step >= 2 ? float((i + 1) * 100) : float((i + 1) * (step + 1));
      EXPECT_EQ(sc.as<float>()[i * stride], 1.0f / fp8_scale(want, e5)) << "step " << step << " tensor " << i;
    }
  }
  expect_error([&] { be->fp8_roll_scales(sc, stride, am, hist, n, len, len, Fp8Format::E5M2); }, {"pos 4"});
}

// On the CPU the fused op is the composition: swiglu_backward, then fp8_quantize with
// the given scale, recording the amax; bad calls are refused.
TEST_F(CpuFp8, SwigluBackwardCastIsTheComposition) {
  const int N = 6, F = 8;
  const size_t n = size_t(N) * 2 * F;
  Tensor gu = make(DType::F32, n), dy = make(DType::F32, size_t(N) * F), dgu = make(DType::F32, n);
  be->copy(gu, rand(n, -3, 3));
  be->copy(dy, rand(size_t(N) * F, -2, 2));
  be->swiglu_backward(dgu, dy, gu, N, F);
  Tensor q = make(DType::F8E5M2, n), qt = make(DType::F8E5M2, n), q2 = make(DType::F8E5M2, n),
         qt2 = make(DType::F8E5M2, n), inv = make(DType::F32, 1), a = make(DType::F32, 1), a2 = make(DType::F32, 1);
  inv.as<float>()[0] = 0.125f;
  be->fp8_quantize(q, qt, inv, dgu, N, 2 * F, true, a);
  be->swiglu_backward_fp8(q2, qt2, inv, a2, dy, gu, N, F);
  EXPECT_EQ(std::memcmp(q.as<uint8_t>(), q2.as<uint8_t>(), n), 0);
  EXPECT_EQ(std::memcmp(qt.as<uint8_t>(), qt2.as<uint8_t>(), n), 0);
  EXPECT_EQ(get(a)[0], get(a2)[0]);
  EXPECT_GT(get(a2)[0], 0.0);
  expect_error([&] { be->swiglu_backward_fp8(Tensor{}, Tensor{}, inv, a, dy, gu, N, F); }, {"both empty"});
  expect_error([&] { be->swiglu_backward_fp8(dgu, Tensor{}, inv, a, dy, gu, N, F); }, {"expected f8e4m3 or f8e5m2"});
}

TEST_F(CpuFp8, SwigluForwardCastIsTheComposition) {
  const int N = 6, F = 8;
  const size_t n = size_t(N) * F;
  Tensor gu = make(DType::F32, n * 2), out = make(DType::F32, n);
  be->copy(gu, rand(n * 2, -3, 3));
  be->swiglu_forward(out, gu, N, F);
  Tensor q = make(DType::F8E4M3, n), qt = make(DType::F8E4M3, n), q2 = make(DType::F8E4M3, n),
         qt2 = make(DType::F8E4M3, n), inv = make(DType::F32, 1), a = make(DType::F32, 1), a2 = make(DType::F32, 1);
  inv.as<float>()[0] = 0.25f;
  be->fp8_quantize(q, qt, inv, out, N, F, true, a);
  be->swiglu_forward_fp8(q2, qt2, inv, a2, gu, N, F);
  EXPECT_EQ(std::memcmp(q.as<uint8_t>(), q2.as<uint8_t>(), n), 0);
  EXPECT_EQ(std::memcmp(qt.as<uint8_t>(), qt2.as<uint8_t>(), n), 0);
  EXPECT_EQ(get(a)[0], get(a2)[0]);
  EXPECT_GT(get(a2)[0], 0.0);
  expect_error([&] { be->swiglu_forward_fp8(Tensor{}, Tensor{}, inv, a, gu, N, F); }, {"both empty"});
  expect_error([&] { be->swiglu_forward_fp8(q, qt, inv, a, gu, N, F + 1); }, {"gu holds"});
}

// The loss that also casts its gradient for an FP8 lm_head: cross_entropy with grad,
// then fp8_quantize of the gradient with the scale its bound gives (|dlogits| <=
// |dloss_scale|: nothing saturates, and the scale is the largest that fits it), that
// scale's inverse set; an ignored row is zeros.
// e5m2_round_stochastic: every result is an e5m2 value (it encodes and decodes back to
// itself) next to the input (the grid point below or above it), a grid value stays, and
// over the 256 draws the mean is the input to within 1/512 of the step: normal values,
// the subnormal step of 2^-16, values below it, signs.
TEST(Fp8Stochastic, RoundsToANeighbourUnbiased) {
  const auto E5 = Fp8Format::E5M2;
  std::mt19937_64 rng(3);
  std::vector<float> xs = {1.0f, 1.1f, 1.3f, -1.7f, 0.999f, 57000.0f, -300.3f, std::ldexp(1.2f, -14),
                           std::ldexp(1.3f, -15), std::ldexp(1.7f, -17), std::ldexp(0.3f, -16), -std::ldexp(1.0f, -20)};
  for (int i = 0; i < 200; ++i) xs.push_back(std::ldexp(std::uniform_real_distribution<float>(1, 2)(rng), int(rng() % 38) - 24));
  for (float x : xs) {
    const float lo = fp8_decode(fp8_encode(x, E5), E5);  // a grid neighbour (to nearest), then the other
    double sum = 0;
    float seen_lo = INFINITY, seen_hi = -INFINITY;
    for (uint32_t r = 0; r < 256; ++r) {
      const float y = e5m2_round_stochastic(x, r);
      ASSERT_EQ(fp8_decode(fp8_encode(y, E5), E5), y) << x << " r " << r << " gave " << y << ", not an e5m2 value";
      seen_lo = std::min(seen_lo, y), seen_hi = std::max(seen_hi, y);
      sum += y;
    }
    const float e = std::fabs(x) < std::ldexp(1.0f, -14) ? std::ldexp(1.0f, -16)
                                                          : std::ldexp(1.0f, std::ilogb(x) - 2);  // the step
    // (within 1/256 of a step of a grid point, the 8 bits may never take the other side)
    EXPECT_TRUE(seen_lo <= x + e / 256 && x - e / 256 <= seen_hi) << x << " in [" << seen_lo << ", " << seen_hi << "]";
    EXPECT_TRUE(seen_lo == lo || seen_hi == lo) << x << ": nearest " << lo << " is not a result";
    EXPECT_LE(seen_hi - seen_lo, e * 1.0001f) << x;
    EXPECT_NEAR(sum / 256, x, e / 512 + std::fabs(x) * 1e-6) << x;
  }
  for (float g : {1.25f, -0.375f, std::ldexp(3.0f, -16), 57344.0f, 0.0f})
    for (uint32_t r : {0u, 128u, 255u}) EXPECT_EQ(e5m2_round_stochastic(g, r), g) << g << " moved";
  EXPECT_TRUE(std::isnan(e5m2_round_stochastic(NAN, 7)));
  EXPECT_EQ(random8(9, 13), (counter_bits(9, 1) >> 40) & 0xff);
}

// The loss's e5m2 codes with a round key: on the host by definition (the composition
// is the only way the CPU has), reproducible, and they keep the softmax's mass where
// rounding to nearest loses some: over rows of 4,096 probabilities (logits of spread
// 1, so no few dominate), the codes' sum of the non-target entries against the exact
// one, nearest below by more than 0.1%, stochastic (8 keys' mean) within 0.05%.
TEST_F(CpuFp8, CrossEntropyCastStochasticKeepsTheMass) {
  const int N = 16, V = 4096;
  const size_t n = size_t(N) * V;
  std::vector<double> xs(n);
  std::mt19937_64 r(8);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (auto& x : xs) x = nd(r);
  std::vector<int32_t> tg(N);
  for (int i = 0; i < N; ++i) tg[i] = int32_t(r() % V);
  const float ds = 1.0f / N;
  auto codes = [&](uint64_t key, std::vector<float>* grad) {
    Tensor g = make(DType::F32, n), l = make(DType::F32, N), q = make(DType::F8E5M2, n), qt = make(DType::F8E5M2, n),
           inv = make(DType::F32, 1);
    be->copy(g, from(xs));
    be->cross_entropy_fp8(l, g, q, qt, inv, ids(tg), N, V, -100, ds, key);
    if (grad) {
      const Vec gv = get(g);
      grad->assign(gv.begin(), gv.end());
    }
    std::vector<uint8_t> c(q.as<uint8_t>(), q.as<uint8_t>() + n);
    for (int i = 0; i < N; ++i)
      for (int j = 0; j < V; ++j) EXPECT_EQ(qt.as<uint8_t>()[size_t(j) * N + i], c[size_t(i) * V + j]);
    return std::make_pair(c, double(get(inv)[0]));
  };
  std::vector<float> g;
  const auto [near, inv] = codes(0, &g);
  const auto st1 = codes(77, nullptr), st2 = codes(77, nullptr), other = codes(78, nullptr);
  EXPECT_EQ(st1.first, st2.first) << "the same key gave other codes";
  EXPECT_NE(st1.first, other.first) << "another key gave the same codes";
  EXPECT_NE(st1.first, near) << "stochastic rounding gave the nearest codes";
  auto mass_gap = [&](const std::vector<uint8_t>& c) {
    double exact = 0, coded = 0;
    for (int i = 0; i < N; ++i)
      for (int j = 0; j < V; ++j)
        if (j != tg[i]) exact += g[size_t(i) * V + j], coded += fp8_decode(c[size_t(i) * V + j], Fp8Format::E5M2) * inv;
    return coded / exact - 1;
  };
  double st_gap = 0;
  for (uint64_t k = 100; k < 108; ++k) st_gap += mass_gap(codes(k, nullptr).first) / 8;
  std::printf("mass against the exact gradient's: nearest %+.4f%%, stochastic %+.4f%%\n", 100 * mass_gap(near),
              100 * st_gap);
  EXPECT_LT(mass_gap(near), -0.001) << "rounding to nearest kept the mass (the reason for the option is gone?)";
  EXPECT_LT(std::fabs(st_gap), 0.0005) << "stochastic rounding lost mass";
}

TEST_F(CpuFp8, CrossEntropyCastIsTheComposition) {
  const int N = 5, V = 40, ignore = -100;
  const float dloss_scale = 1.0f / 37;
  const size_t n = size_t(N) * V;
  const Vec x = randv(n, -6, 6);
  const std::vector<int32_t> tg = {3, ignore, 39, 0, 17};
  Tensor l1 = make(DType::F32, N), l2 = make(DType::F32, N), g1 = make(DType::F32, n), g2 = make(DType::F32, n);
  be->copy(g1, from(x));
  be->copy(g2, from(x));
  be->cross_entropy(l1, g1, ids(tg), N, V, ignore, dloss_scale, true);
  Tensor q = make(DType::F8E5M2, n), q2 = make(DType::F8E5M2, n), inv = make(DType::F32, 1),
         inv2 = make(DType::F32, 1);
  const float s = Backend::dlogits_fp8_scale(dloss_scale);
  EXPECT_EQ(s, fp8_scale(dloss_scale, 57344.0f));
  EXPECT_EQ(s, 2097152.0f) << "57344 * 37 = 2121728: 2^21 is the power of two below it";
  inv.as<float>()[0] = 1.0f / s;
  be->fp8_quantize(q, Tensor{}, inv, g1, N, V, true);
  be->cross_entropy_fp8(l2, g2, q2, Tensor{}, inv2, ids(tg), N, V, ignore, dloss_scale);
  EXPECT_EQ(get(l1), get(l2));
  EXPECT_EQ(get(g1), get(g2)) << "the gradient in place, as cross_entropy writes it";
  EXPECT_EQ(std::memcmp(q.as<uint8_t>(), q2.as<uint8_t>(), n), 0);
  // With the transpose: the same codes, and qt[j][i] = q[i][j].
  Tensor g3 = make(DType::F32, n), q3 = make(DType::F8E5M2, n), qt3 = make(DType::F8E5M2, n),
         l3 = make(DType::F32, N), inv3 = make(DType::F32, 1);
  be->copy(g3, from(x));
  be->cross_entropy_fp8(l3, g3, q3, qt3, inv3, ids(tg), N, V, ignore, dloss_scale);
  EXPECT_EQ(get(l3), get(l1));
  EXPECT_EQ(std::memcmp(q3.as<uint8_t>(), q.as<uint8_t>(), n), 0);
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < V; ++j)
      ASSERT_EQ(qt3.as<uint8_t>()[size_t(j) * N + i], q.as<uint8_t>()[size_t(i) * V + j]) << i << "," << j;
  EXPECT_EQ(get(inv2)[0], 1.0 / s);
  const Vec g = get(g2);
  int nonzero = 0;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_LE(std::fabs(g[i]) * s, 57344.0) << "element " << i << " would saturate";
    nonzero += q2.as<uint8_t>()[i] != 0;
    if (i / V == 1) EXPECT_EQ(q2.as<uint8_t>()[i], 0) << "ignored row, element " << i % V;
  }
  EXPECT_GT(nonzero, 3 * V);
  expect_error([&] { be->cross_entropy_fp8(l2, g2, q, Tensor{}, inv2, ids(tg), N, V - 1, ignore, dloss_scale); },
               {"cross_entropy_fp8"});
  expect_error([&] { be->cross_entropy_fp8(l2, g2, g1, Tensor{}, inv2, ids(tg), N, V, ignore, dloss_scale); },
               {"dq", "f8e5m2"});
  expect_error([&] { be->cross_entropy_fp8(l2, g2, q, g1, inv2, ids(tg), N, V, ignore, dloss_scale); },
               {"dqt", "f8e5m2"});
}

TEST_F(CpuFp8, MatmulIsTheDequantizedProductScaled) {
  const int M = 16, K = 32, N = 48;
  Tensor xa = make(DType::F32, size_t(M) * K), xb = make(DType::F32, size_t(N) * K);
  be->copy(xa, rand(size_t(M) * K, -2, 2));
  be->copy(xb, rand(size_t(N) * K, -0.1, 0.1));
  Tensor a = make(DType::F8E5M2, size_t(M) * K), b = make(DType::F8E4M3, size_t(N) * K);
  Tensor ai = make(DType::F32, 1), bi = make(DType::F32, 1);
  be->fp8_quantize(a, Tensor{}, ai, xa, M, K);
  be->fp8_quantize(b, Tensor{}, bi, xb, N, K);
  Vec av = get(a), bv = get(b);  // the codes' values, unscaled
  const double sa = get(ai)[0], sb = get(bi)[0];
  Tensor bias = make(DType::F32, N);
  be->copy(bias, rand(N));
  Vec biasv = get(bias);
  Tensor out = make(DType::F32, size_t(M) * N), acc = make(DType::F32, size_t(M) * N);
  Vec acc0 = randv(size_t(M) * N);
  be->copy(acc, from(acc0));
  be->matmul_fp8(out, a, ai, b, bi, bias, M, K, N, false);
  be->matmul_fp8(acc, a, ai, b, bi, Tensor{}, M, K, N, true);
  Vec ov = get(out), accv = get(acc), xav = get(xa), xbv = get(xb);
  double err = 0, ref = 0;
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      double s = 0, exact = 0;
      for (int k = 0; k < K; k++) {
        s += av[size_t(m) * K + k] * bv[size_t(n) * K + k];
        exact += xav[size_t(m) * K + k] * xbv[size_t(n) * K + k];
      }
      const size_t i = size_t(m) * N + n;
      EXPECT_NEAR(ov[i], s * sa * sb + biasv[n], 1e-5 * (std::fabs(s * sa * sb) + 1)) << m << "," << n;
      EXPECT_NEAR(accv[i], acc0[i] + s * sa * sb, 1e-5 * (std::fabs(s * sa * sb) + 1)) << m << "," << n;
      err += (s * sa * sb - exact) * (s * sa * sb - exact), ref += exact * exact;
    }
  // And it is an approximation of the unquantized product, at fp8's precision.
  EXPECT_LT(std::sqrt(err / ref), 0.1);
  EXPECT_GT(std::sqrt(err / ref), 1e-4);
}

TEST_F(CpuFp8, TransposeMovesTheBytesAsTheyAre) {
  for (auto [rows, cols] : {std::pair{1, 1}, std::pair{3, 5}, std::pair{16, 48}}) {
    const size_t n = size_t(rows) * cols;
    Tensor q = make(DType::F8E4M3, n), qt = make(DType::F8E4M3, n);
    for (size_t i = 0; i < n; i++) q.as<uint8_t>()[i] = uint8_t(i * 37 + 11);
    be->fp8_transpose(qt, q, rows, cols);
    for (int r = 0; r < rows; r++)
      for (int c = 0; c < cols; c++)
        EXPECT_EQ(qt.as<uint8_t>()[size_t(c) * rows + r], q.as<uint8_t>()[size_t(r) * cols + c]) << r << "," << c;
  }
  Tensor a = make(DType::F8E4M3, 12), f = make(DType::F32, 12);
  expect_error([&] { be->fp8_transpose(a, a, 3, 4); }, {"not in place"});
  expect_error([&] { be->fp8_transpose(a, f, 3, 4); }, {"expected f8e4m3 or f8e5m2"});
}

// What dist.fp8_gather does with a weight split across ranks: each part cast as one
// row with the whole tensor's scale reused, its amax recorded, gives the whole
// tensor's codes, and the largest part amax is the whole's.
TEST_F(CpuFp8, PartsCastWithTheWholeScaleAreTheWholeCast) {
  const int rows = 12, cols = 20;
  const size_t n = size_t(rows) * cols;
  Vec x = randv(n, -2, 2);
  x[97] = 9.5;
  Tensor tx = make(DType::F32, n), whole = make(DType::F8E4M3, n), inv = make(DType::F32, 1);
  be->copy(tx, from(x));
  be->fp8_quantize(whole, Tensor{}, inv, tx, rows, cols);
  Tensor parts = make(DType::F8E4M3, n), amax = make(DType::F32, 3);
  be->zero(amax);
  const size_t cut[] = {0, 61, 143, n};  // anywhere, not at rows
  for (int k = 0; k < 3; k++)
    be->fp8_quantize(parts.slice(cut[k], cut[k + 1] - cut[k]), Tensor{}, inv, tx.slice(cut[k], cut[k + 1] - cut[k]),
                     1, int(cut[k + 1] - cut[k]), true, amax.slice(k, 1));
  EXPECT_EQ(std::memcmp(parts.as<uint8_t>(), whole.as<uint8_t>(), n), 0);
  EXPECT_EQ(std::max({get(amax)[0], get(amax)[1], get(amax)[2]}), 9.5);
}

TEST_F(CpuFp8, BadCallsAreRefused) {
  Tensor a = make(DType::F8E5M2, 16 * 16), b = make(DType::F8E5M2, 16 * 16), i = make(DType::F32, 1);
  Tensor out = make(DType::F32, 16 * 16), x = make(DType::F32, 16 * 16);
  expect_error([&] { be->matmul_fp8(out, a, i, b, i, Tensor{}, 16, 16, 16, false); }, {"both f8e5m2"});
  Tensor e4 = make(DType::F8E4M3, 24 * 16);
  expect_error([&] { be->matmul_fp8(out, e4, i, e4, i, Tensor{}, 12, 16, 16, false); }, {"multiples of 16", "M=12"});
  expect_error([&] { be->fp8_quantize(Tensor{}, Tensor{}, i, x, 16, 16); }, {"both empty"});
  expect_error([&] { be->fp8_quantize(x, Tensor{}, i, x, 16, 16); }, {"expected f8e4m3 or f8e5m2"});
}

// ---- CUDA against the emulation -------------------------------------------------------------

class CudaFp8 : public CudaOps {};

TEST_F(CudaFp8, QuantizeMatchesTheEmulationBitForBit) {
  struct Shape {
    int rows, cols;
    size_t off;  // elements into the input's buffer: the unaligned path
  };
  for (Shape sh : {Shape{37, 72, 0}, Shape{64, 64, 0}, Shape{130, 100, 0}, Shape{256, 512, 0}, Shape{48, 80, 3},
                   Shape{16, 8, 0}}) {
    for (DType dt : kBoth)
      for (Fp8Format f : kFormats) {
        const size_t n = size_t(sh.rows) * sh.cols;
        Vec x = randv_as(dt, n, -4, 4);
        x[n / 3] = dt == DType::BF16 ? bf16_to_f32(f32_to_bf16(37.25f)) : 37.25f;
        x[n / 2] = 1e-6f;  // underflows to a subnormal or zero
        const std::string what = std::string(dtype_name(dt)) + " " + fname(f) + " " + std::to_string(sh.rows) + "x" +
                                 std::to_string(sh.cols) + "+" + std::to_string(sh.off);
        Tensor cq = make(*cpu, fdtype(f), n), cqt = make(*cpu, fdtype(f), n), ci = make(*cpu, DType::F32, 1);
        cpu->fp8_quantize(cq, cqt, ci, cpu_from(x), sh.rows, sh.cols);
        Tensor gx = gpu_from_at(x, dt, sh.off);
        Tensor gq = make(gpu(), fdtype(f), n), gqt = make(gpu(), fdtype(f), n), gi = make(gpu(), DType::F32, 1);
        gpu().fp8_quantize(gq, gqt, gi, gx, sh.rows, sh.cols);
        std::vector<uint8_t> q = raw(gq), qt = raw(gqt);
        EXPECT_EQ(std::memcmp(q.data(), cq.as<uint8_t>(), n), 0) << what << " q";
        EXPECT_EQ(std::memcmp(qt.data(), cqt.as<uint8_t>(), n), 0) << what << " qt";
        EXPECT_EQ(get(gi)[0], cget(ci)[0]) << what << " inv_scale";
        // One layout alone writes the same bytes, with its scale reused too.
        Tensor gq2 = make(gpu(), fdtype(f), n), gq3 = make(gpu(), fdtype(f), n);
        gpu().fp8_quantize(Tensor{}, gq2, gi, gx, sh.rows, sh.cols);
        EXPECT_EQ(raw(gq2), qt) << what << " qt alone";
        gpu().fp8_quantize(gq3, Tensor{}, gi, gx, sh.rows, sh.cols, true);
        EXPECT_EQ(raw(gq3), q) << what << " q with the scale reused";
        EXPECT_EQ(get(gi)[0], cget(ci)[0]) << what << " inv_scale (reused, unchanged)";
      }
  }
}

// Delayed scaling on the GPU: the one-pass cast with a given scale writes the
// emulation's bytes and records its amax (many blocks, one word); the roll gives the
// emulation's scales, history and zeroed amax.
// The byte transpose dist.fp8_gather's backward uses, and casts of a weight's parts as
// single rows at any offset (unaligned), against the emulation.
TEST_F(CudaFp8, TransposeAndPartCastsMatchTheEmulation) {
  std::mt19937 rng(20261207);
  for (auto [rows, cols, off] : {std::tuple{256, 512, 0}, std::tuple{130, 100, 0}, std::tuple{48, 80, 5},
                                 std::tuple{1, 1000, 3}, std::tuple{17921, 64, 0}}) {
    const size_t n = size_t(rows) * cols;
    std::vector<uint8_t> bytes(n + off);
    for (auto& b : bytes) b = uint8_t(rng());
    Tensor cq = make(*cpu, DType::F8E4M3, n), cqt = make(*cpu, DType::F8E4M3, n);
    std::memcpy(cq.as<uint8_t>(), bytes.data() + off, n);
    cpu->fp8_transpose(cqt, cq, rows, cols);
    Tensor gbuf = make(gpu(), DType::F8E4M3, n + off), gqt = make(gpu(), DType::F8E4M3, n);
    gpu().upload(gbuf, bytes.data());
    gpu().fp8_transpose(gqt, gbuf.slice(off, n), rows, cols);
    EXPECT_EQ(std::memcmp(raw(gqt).data(), cqt.as<uint8_t>(), n), 0) << rows << "x" << cols << "+" << off;
  }
  for (DType dt : kBoth) {
    const int rows = 96, cols = 64;
    const size_t n = size_t(rows) * cols;
    Vec x = randv_as(dt, n, -3, 3);
    Tensor cq = make(*cpu, DType::F8E4M3, n), ci = make(*cpu, DType::F32, 1);
    cpu->fp8_quantize(cq, Tensor{}, ci, cpu_from(x), rows, cols);
    Tensor gx = gpu_from_at(x, dt, 0), gi = make(gpu(), DType::F32, 1), gq = make(gpu(), DType::F8E4M3, n);
    gpu().fp8_quantize(gq, Tensor{}, gi, gx, rows, cols);
    Tensor parts = make(gpu(), DType::F8E4M3, n), amax = make(gpu(), DType::F32, 3);
    gpu().zero(amax);
    const size_t cut[] = {0, 1001, 4097, n};
    for (int k = 0; k < 3; k++)
      gpu().fp8_quantize(parts.slice(cut[k], cut[k + 1] - cut[k]), Tensor{}, gi, gx.slice(cut[k], cut[k + 1] - cut[k]),
                         1, int(cut[k + 1] - cut[k]), true, amax.slice(k, 1));
    EXPECT_EQ(std::memcmp(raw(parts).data(), cq.as<uint8_t>(), n), 0) << dtype_name(dt);
    const Vec m = get(amax);
    double want = 0;
    for (double v : x) want = std::max(want, std::fabs(v));
    EXPECT_EQ(std::max({m[0], m[1], m[2]}), want) << dtype_name(dt);
  }
}

TEST_F(CudaFp8, DelayedCastAndRollMatchTheEmulation) {
  for (DType dt : kBoth)
    for (auto [rows, cols] : {std::pair{37, 72}, std::pair{512, 256}, std::pair{1024, 1536}}) {
      const size_t n = size_t(rows) * cols;
      Vec x = randv_as(dt, n, -3, 3);
      x[n - 5] = dt == DType::BF16 ? bf16_to_f32(f32_to_bf16(-51.5f)) : -51.5f;
      const std::string what = std::string(dtype_name(dt)) + " " + std::to_string(rows) + "x" + std::to_string(cols);
      Tensor cq = make(*cpu, DType::F8E5M2, n), cqt = make(*cpu, DType::F8E5M2, n), ci = make(*cpu, DType::F32, 1),
             ca = make(*cpu, DType::F32, 1);
      ci.as<float>()[0] = 1.0f / 512;
      ca.as<float>()[0] = 2.0f;
      cpu->fp8_quantize(cq, cqt, ci, cpu_from(x), rows, cols, true, ca);
      Tensor gx = gpu_from_at(x, dt, 0);
      Tensor gq = make(gpu(), DType::F8E5M2, n), gqt = make(gpu(), DType::F8E5M2, n);
      Tensor gi = gpu_from_at(Vec{1.0 / 512}, DType::F32, 0), ga = gpu_from_at(Vec{2.0}, DType::F32, 0);
      gpu().fp8_quantize(gq, gqt, gi, gx, rows, cols, true, ga);
      EXPECT_EQ(std::memcmp(raw(gq).data(), cq.as<uint8_t>(), n), 0) << what << " q";
      EXPECT_EQ(std::memcmp(raw(gqt).data(), cqt.as<uint8_t>(), n), 0) << what << " qt";
      EXPECT_EQ(get(ga)[0], cget(ca)[0]) << what << " amax";
      EXPECT_EQ(get(ga)[0], 51.5) << what << " amax";
    }
  const int n = 112, len = 16;
  Vec am0 = randv(n, 0, 1000), hist0 = randv(size_t(n) * len, 0, 1000);
  Tensor ca = cpu_from(am0), ch = cpu_from(hist0), cs = make(*cpu, DType::F32, n * 4);
  Tensor ga = gpu_from_at(am0, DType::F32, 0), gh = gpu_from_at(hist0, DType::F32, 0),
         gs = make(gpu(), DType::F32, n * 4);
  cpu->fp8_roll_scales(cs, 4, ca, ch, n, len, 5, Fp8Format::E4M3);
  gpu().fp8_roll_scales(gs, 4, ga, gh, n, len, 5, Fp8Format::E4M3);
  Vec s = get(gs), h = get(gh), a = get(ga);
  for (int i = 0; i < n; i++) {
    EXPECT_EQ(s[size_t(i) * 4], cs.as<float>()[i * 4]) << "scale " << i;
    EXPECT_EQ(a[i], 0.0) << "amax " << i;
  }
  for (size_t i = 0; i < h.size(); i++) EXPECT_EQ(h[i], ch.as<float>()[i]) << "history " << i;
}

// The SwiGLU backward cast straight to FP8 (delayed scaling's gate|up gradient): the
// same bytes, transpose and amax as the CPU's swiglu_backward followed by its
// fp8_quantize, in whole and partial tiles, q and qt alone, and a shape the fused
// kernel leaves to the composition (F % 8 != 0).
TEST_F(CudaFp8, SwigluBackwardCastMatchesTheEmulation) {
  for (DType dt : kBoth)
    for (auto [N, F] : {std::pair{256, 64}, std::pair{200, 40}, std::pair{45, 24}, std::pair{48, 96}, std::pair{32, 12}}) {
      const std::string what = std::string(dtype_name(dt)) + " N=" + std::to_string(N) + " F=" + std::to_string(F);
      Vec gu = randv_as(dt, size_t(N) * 2 * F, -3, 3), dy = randv_as(dt, size_t(N) * F, -2, 2);
      const size_t n = size_t(N) * 2 * F;
      // The CPU reference in the GPU's activation dtype: bf16 rounding of dgu included.
      Tensor cq = make(*cpu, DType::F8E5M2, n), cqt = make(*cpu, DType::F8E5M2, n), ci = make(*cpu, DType::F32, 1),
             ca = make(*cpu, DType::F32, 1);
      ci.as<float>()[0] = 1.0f / 64;
      Tensor gx = gpu_from_at(gu, dt, 0), gd = gpu_from_at(dy, dt, 0);
      Tensor gdgu = make(gpu(), dt, n);
      gpu().swiglu_backward(gdgu, gd, gx, N, F);
      cpu->fp8_quantize(cq, cqt, ci, cpu_from(get(gdgu)), N, 2 * F, true, ca);
      Tensor gq = make(gpu(), DType::F8E5M2, n), gqt = make(gpu(), DType::F8E5M2, n);
      Tensor gi = gpu_from_at(Vec{1.0 / 64}, DType::F32, 0), ga = gpu_from_at(Vec{0.0}, DType::F32, 0);
      gpu().swiglu_backward_fp8(gq, gqt, gi, ga, gd, gx, N, F);
      EXPECT_EQ(std::memcmp(raw(gq).data(), cq.as<uint8_t>(), n), 0) << what << " q";
      EXPECT_EQ(std::memcmp(raw(gqt).data(), cqt.as<uint8_t>(), n), 0) << what << " qt";
      EXPECT_EQ(get(ga)[0], cget(ca)[0]) << what << " amax";
      EXPECT_GT(get(ga)[0], 0.0) << what;
      Tensor gq2 = make(gpu(), DType::F8E5M2, n), gqt2 = make(gpu(), DType::F8E5M2, n);
      gpu().swiglu_backward_fp8(gq2, Tensor{}, gi, Tensor{}, gd, gx, N, F);
      gpu().swiglu_backward_fp8(Tensor{}, gqt2, gi, Tensor{}, gd, gx, N, F);
      EXPECT_EQ(raw(gq2), raw(gq)) << what << " q alone";
      EXPECT_EQ(raw(gqt2), raw(gqt)) << what << " qt alone";
    }
}

TEST_F(CudaFp8, SwigluForwardCastMatchesTheEmulation) {
  for (DType dt : kBoth)
    for (auto [N, F] : {std::pair{256, 128}, std::pair{200, 40}, std::pair{45, 24}, std::pair{48, 96}, std::pair{32, 12}}) {
      const std::string what = std::string(dtype_name(dt)) + " N=" + std::to_string(N) + " F=" + std::to_string(F);
      Vec gu = randv_as(dt, size_t(N) * 2 * F, -4, 4);
      const size_t n = size_t(N) * F;
      // The CPU reference in the GPU's activation dtype: bf16 rounding of out included.
      Tensor cq = make(*cpu, DType::F8E4M3, n), cqt = make(*cpu, DType::F8E4M3, n), ci = make(*cpu, DType::F32, 1),
             ca = make(*cpu, DType::F32, 1);
      ci.as<float>()[0] = 1.0f / 32;
      Tensor gx = gpu_from_at(gu, dt, 0), gout = make(gpu(), dt, n);
      gpu().swiglu_forward(gout, gx, N, F);
      cpu->fp8_quantize(cq, cqt, ci, cpu_from(get(gout)), N, F, true, ca);
      Tensor gq = make(gpu(), DType::F8E4M3, n), gqt = make(gpu(), DType::F8E4M3, n);
      Tensor gi = gpu_from_at(Vec{1.0 / 32}, DType::F32, 0), ga = gpu_from_at(Vec{0.0}, DType::F32, 0);
      gpu().swiglu_forward_fp8(gq, gqt, gi, ga, gx, N, F);
      EXPECT_EQ(std::memcmp(raw(gq).data(), cq.as<uint8_t>(), n), 0) << what << " q";
      EXPECT_EQ(std::memcmp(raw(gqt).data(), cqt.as<uint8_t>(), n), 0) << what << " qt";
      EXPECT_EQ(get(ga)[0], cget(ca)[0]) << what << " amax";
      EXPECT_GT(get(ga)[0], 0.0) << what;
      Tensor gq2 = make(gpu(), DType::F8E4M3, n), gqt2 = make(gpu(), DType::F8E4M3, n);
      gpu().swiglu_forward_fp8(gq2, Tensor{}, gi, Tensor{}, gx, N, F);
      gpu().swiglu_forward_fp8(Tensor{}, gqt2, gi, Tensor{}, gx, N, F);
      EXPECT_EQ(raw(gq2), raw(gq)) << what << " q alone";
      EXPECT_EQ(raw(gqt2), raw(gqt)) << what << " qt alone";
    }
}

TEST_F(CudaFp8, MatmulMatchesTheEmulation) {
  struct Shape {
    int M, K, N;
  };
  for (Shape sh : {Shape{16, 16, 16}, Shape{64, 96, 48}, Shape{256, 512, 384}, Shape{512, 1536, 2048}}) {
    const auto [M, K, N] = sh;
    for (auto [fa, fb] : {std::pair{Fp8Format::E4M3, Fp8Format::E4M3}, std::pair{Fp8Format::E5M2, Fp8Format::E4M3}}) {
      const std::string what = std::string(fname(fa)) + "x" + fname(fb) + " " + std::to_string(M) + "x" +
                               std::to_string(K) + "x" + std::to_string(N);
      Vec xa = randv_as(DType::BF16, size_t(M) * K, -3, 3), xb = randv_as(DType::BF16, size_t(N) * K, -0.2f, 0.2f);
      Vec bias = randv_as(DType::BF16, N), acc0 = randv(size_t(M) * N);
      Tensor ca = make(*cpu, fdtype(fa), xa.size()), cb = make(*cpu, fdtype(fb), xb.size());
      Tensor cai = make(*cpu, DType::F32, 1), cbi = make(*cpu, DType::F32, 1);
      cpu->fp8_quantize(ca, Tensor{}, cai, cpu_from(xa), M, K);
      cpu->fp8_quantize(cb, Tensor{}, cbi, cpu_from(xb), N, K);
      Tensor co = make(*cpu, DType::F32, size_t(M) * N), cacc = cpu_from(acc0);
      cpu->matmul_fp8(co, ca, cai, cb, cbi, cpu_from(bias), M, K, N, false);
      cpu->matmul_fp8(cacc, ca, cai, cb, cbi, Tensor{}, M, K, N, true);

      Tensor ga = make(gpu(), fdtype(fa), xa.size()), gb = make(gpu(), fdtype(fb), xb.size());
      Tensor gai = make(gpu(), DType::F32, 1), gbi = make(gpu(), DType::F32, 1);
      gpu().fp8_quantize(ga, Tensor{}, gai, gpu_from(xa, DType::BF16), M, K);
      gpu().fp8_quantize(gb, Tensor{}, gbi, gpu_from(xb, DType::BF16), N, K);
      Tensor go = gpu_poisoned(DType::BF16, size_t(M) * N), gacc = gpu_from(acc0, DType::F32);
      gpu().matmul_fp8(go, ga, gai, gb, gbi, gpu_from(bias, DType::BF16), M, K, N, false);
      gpu().matmul_fp8(gacc, ga, gai, gb, gbi, Tensor{}, M, K, N, true);
      // bf16 output: its one rounding. f32 accumulation: the FP8 tensor cores of Hopper
      // add their products with fewer bits than fp32 (cuBLASLt's split accumulation
      // moves the sums to fp32 registers every few k-blocks): measured on an H100, 1e-4
      // of the largest value at every K from 16 to 1536, against 1e-7 for bf16 GEMMs.
      expect_close(what + " out (bf16)", get(go), cget(co), 1e-2);
      expect_close(what + " accumulated (f32)", get(gacc), cget(cacc), 4e-4);
      // A weight gradient slice starts anywhere in its unit's buffer: 4 bytes past an
      // alignment the FP8 GEMM refuses; it must give the aligned result, bit for bit.
      Tensor gmis = gpu_from_at(acc0, DType::F32, 1);
      gpu().matmul_fp8(gmis, ga, gai, gb, gbi, Tensor{}, M, K, N, true);
      EXPECT_EQ(raw(gmis), raw(gacc)) << what << " accumulated into a 4-byte-aligned slice";
      // The model keeps its scales in slots of one buffer, 4 bytes apart: the same bits.
      Tensor slots = make(gpu(), DType::F32, 8), go2 = gpu_poisoned(DType::BF16, size_t(M) * N);
      gpu().copy(slots.slice(1, 1), gai);
      gpu().copy(slots.slice(2, 1), gbi);
      gpu().matmul_fp8(go2, ga, slots.slice(1, 1), gb, slots.slice(2, 1), gpu_from(bias, DType::BF16), M, K, N, false);
      EXPECT_EQ(raw(go2), raw(go)) << what << " with scales at 4-byte offsets";
      // The tensor cores' fast accumulation (the forward's, e4m3 x e4m3): the same
      // product, summed with fewer bits.
      if (fa == Fp8Format::E4M3) {
        Tensor gof = gpu_poisoned(DType::BF16, size_t(M) * N);
        gpu().matmul_fp8(gof, ga, gai, gb, gbi, gpu_from(bias, DType::BF16), M, K, N, false, true);
        expect_close(what + " out (bf16, fast accumulation)", get(gof), cget(co), 2e-2);
      }
    }
  }
}

// The loss kernel that writes the gradient's e5m2 copy too (an FP8 lm_head): the GPU's
// own cross_entropy followed by its cast with the bound's scale, bit for bit: the
// gradient, the losses, the codes and the inverse scale, at an aligned vocabulary and
// at odd ones (rows that start off a 16-byte boundary: the scalar head and tail), with
// an ignored row.
TEST_F(CudaFp8, CrossEntropyCastMatchesTheComposition) {
  const int ignore = -100;
  for (DType dt : kBoth)
    for (auto [N, V] : {std::pair{6, 4096}, std::pair{5, 1000}, std::pair{3, 77}, std::pair{144, 1040}}) {
      const std::string what = std::string(dtype_name(dt)) + " N=" + std::to_string(N) + " V=" + std::to_string(V);
      const size_t n = size_t(N) * V;
      const Vec x = randv_as(dt, n, -8, 8);
      std::vector<int32_t> tg(N);
      for (int i = 0; i < N; ++i) tg[i] = i == 1 ? ignore : int32_t(rng() % V);
      const float dloss_scale = 1.0f / (3 * N);
      Tensor g1 = gpu_from(x, dt), g2 = gpu_from(x, dt), l1 = make(gpu(), DType::F32, N),
             l2 = make(gpu(), DType::F32, N);
      gpu().cross_entropy(l1, g1, gpu_ids(tg), N, V, ignore, dloss_scale, true);
      Tensor inv = gpu_from(Vec{1.0 / Backend::dlogits_fp8_scale(dloss_scale)}, DType::F32);
      Tensor q = make(gpu(), DType::F8E5M2, n), q2 = make(gpu(), DType::F8E5M2, n);
      const std::vector<uint8_t> nan_codes(n, 0x7f);  // e5m2 NaN: a code the kernel leaves shows
      gpu().upload(q2, nan_codes.data());
      gpu().fp8_quantize(q, Tensor{}, inv, g1, N, V, true);
      Tensor inv2 = gpu_poisoned(DType::F32, 1);
      gpu().cross_entropy_fp8(l2, g2, q2, Tensor{}, inv2, gpu_ids(tg), N, V, ignore, dloss_scale);
      EXPECT_EQ(raw(l2), raw(l1)) << what << " losses";
      EXPECT_EQ(raw(g2), raw(g1)) << what << " gradient";
      EXPECT_EQ(raw(q2), raw(q)) << what << " e5m2 codes";
      EXPECT_EQ(get(inv2)[0], get(inv)[0]) << what << " inverse scale";
      // With the transpose (the kernel then writes no gradient back, and a byte
      // transpose follows): the same losses and codes, and qt the codes transposed.
      Tensor g3 = gpu_from(x, dt), l3 = make(gpu(), DType::F32, N), inv3 = gpu_poisoned(DType::F32, 1);
      Tensor q3 = make(gpu(), DType::F8E5M2, n), qt3 = make(gpu(), DType::F8E5M2, n);
      gpu().upload(q3, nan_codes.data());
      gpu().upload(qt3, nan_codes.data());
      gpu().cross_entropy_fp8(l3, g3, q3, qt3, inv3, gpu_ids(tg), N, V, ignore, dloss_scale);
      EXPECT_EQ(raw(l3), raw(l1)) << what << " losses (+T)";
      EXPECT_EQ(raw(q3), raw(q)) << what << " e5m2 codes (+T)";
      EXPECT_EQ(get(inv3)[0], get(inv)[0]) << what << " inverse scale (+T)";
      const std::vector<uint8_t> codes = raw(q), tcodes = raw(qt3);
      size_t bad = 0;
      for (int i = 0; i < N; ++i)
        for (int j = 0; j < V; ++j) bad += tcodes[size_t(j) * N + i] != codes[size_t(i) * V + j];
      EXPECT_EQ(bad, 0u) << what << " transposed codes";
      // Stochastic rounding (a round key): the codes of the host's rounding of the same
      // gradient, with the key's stream, bit for bit, both layouts.
      const uint64_t key = 0x1234567 + uint64_t(N) * V;
      Tensor g4 = gpu_from(x, dt), l4 = make(gpu(), DType::F32, N), inv4 = gpu_poisoned(DType::F32, 1);
      Tensor q4 = make(gpu(), DType::F8E5M2, n), qt4 = make(gpu(), DType::F8E5M2, n);
      gpu().cross_entropy_fp8(l4, g4, q4, qt4, inv4, gpu_ids(tg), N, V, ignore, dloss_scale, key);
      Tensor g5 = gpu_from(x, dt), q5 = make(gpu(), DType::F8E5M2, n);
      gpu().cross_entropy_fp8(l4, g5, q5, Tensor{}, inv4, gpu_ids(tg), N, V, ignore, dloss_scale, key);
      const Vec grad = get(g1);  // cross_entropy's gradient, as the activation dtype holds it
      const float sc = Backend::dlogits_fp8_scale(dloss_scale);
      const std::vector<uint8_t> sq = raw(q4), sqt = raw(qt4), sq5 = raw(q5);
      size_t bad_s = 0, bad_st = 0, moved = 0;
      for (size_t i = 0; i < n; ++i) {
        const uint8_t want =
            fp8_encode(e5m2_round_stochastic(float(grad[i]) * sc, random8(key, i)), Fp8Format::E5M2);
        bad_s += sq[i] != want || sq5[i] != want;
        bad_st += sqt[(i % V) * N + i / V] != want;
        moved += want != codes[i];
      }
      EXPECT_EQ(bad_s, 0u) << what << " stochastic codes";
      EXPECT_EQ(bad_st, 0u) << what << " stochastic transposed codes";
      EXPECT_GT(moved, 0u) << what << " stochastic rounding gave the nearest codes";
    }
}

TEST_F(CudaFp8, HopperAndAdaComputeIt) {
  const std::string why = gpu().fp8_unsupported_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  SUCCEED();
}

}  // namespace
}  // namespace st::testing

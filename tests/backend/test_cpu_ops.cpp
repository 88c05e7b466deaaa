// The CPU reference ops: every backward against central finite differences in F64,
// forwards against naive or hand computations, F32 against F64, and the error paths.
//
// Finite differences: L(x) = Σ w ⊙ op(x) with random w, so dL/dout = w and the
// analytic gradient is one backward call. Central differences with h = 1e-5 on
// O(1) inputs have truncation error h²/6·|L'''| ≈ 1e-10 and rounding error
// ≈ 1e-16·|L|/h ≈ 1e-10, so |analytic - fd| ≤ 1e-6·|g| + 1e-8 leaves two orders of
// magnitude of margin while still catching any wrong term (which is O(|g|)).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/rng.h"

namespace st {
namespace {

using Vec = std::vector<double>;
constexpr double kFdStep = 1e-5, kFdRel = 1e-6, kFdAbs = 1e-8;

// An F64 tensor and an F32 tensor holding the same (rounded) values.
struct Twin {
  Tensor d, f;
};

class CpuOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend();
  // A fixed seed per test: the hash of the test's own name.
  std::mt19937_64 rng{hash_name(::testing::UnitTest::GetInstance()->current_test_info()->name())};
  std::vector<Tensor> owned;

  ~CpuOps() override {
    for (auto& t : owned) be->free(t);
  }

  Tensor make(DType dt, size_t n) { return owned.emplace_back(be->alloc(dt, n)); }
  Tensor from(const Vec& v) {
    Tensor t = make(DType::F64, v.size());
    be->upload(t, v.data());
    return t;
  }
  Tensor ids(const std::vector<int32_t>& v) {
    Tensor t = make(DType::I32, v.size());
    be->upload(t, v.data());
    return t;
  }
  Vec randv(size_t n, double lo = -1, double hi = 1) {
    std::uniform_real_distribution<double> u(lo, hi);
    Vec v(n);
    for (auto& x : v) x = u(rng);
    return v;
  }
  Tensor rand(size_t n, double lo = -1, double hi = 1) { return from(randv(n, lo, hi)); }
  Vec get(Tensor t) {  // any dtype, as doubles
    Tensor d = make(DType::F64, t.numel);
    be->copy(d, t);
    Vec v(t.numel);
    be->download(v.data(), d);
    return v;
  }
  Twin twin(const Vec& v) {
    Twin t{from(v), make(DType::F32, v.size())};
    be->copy(t.f, t.d);
    return t;
  }
  Twin twin_zeros(size_t n) { return {make(DType::F64, n), make(DType::F32, n)}; }

  static double wsum(const Vec& w, const Vec& out) {
    double s = 0;
    for (size_t i = 0; i < w.size(); i++) s += w[i] * out[i];
    return s;
  }
  double wsum(const Vec& w, Tensor out) { return wsum(w, get(out)); }

  // Compares `analytic` with central differences of loss() over every element of the
  // F64 tensor x; loss() must recompute everything from x's current contents.
  void expect_grad(const std::string& what, Tensor x, const Vec& analytic,
                   const std::function<double()>& loss) {
    ASSERT_EQ(x.dtype, DType::F64);
    ASSERT_EQ(analytic.size(), x.numel);
    double* xs = x.as<double>();  // CPU backend memory is host memory
    for (size_t i = 0; i < x.numel; i++) {
      const double x0 = xs[i];
      xs[i] = x0 + kFdStep;
      const double lp = loss();
      xs[i] = x0 - kFdStep;
      const double lm = loss();
      xs[i] = x0;
      const double fd = (lp - lm) / (2 * kFdStep), a = analytic[i];
      EXPECT_LE(std::abs(a - fd), kFdRel * std::max(std::abs(a), std::abs(fd)) + kFdAbs)
          << what << "[" << i << "]: analytic " << a << ", finite difference " << fd;
    }
  }

  static Vec minus(const Vec& a, const Vec& b) {
    Vec r(a.size());
    for (size_t i = 0; i < a.size(); i++) r[i] = a[i] - b[i];
    return r;
  }
  // max |f32 - f64| ≤ 1e-5 · max |f64|: the F32 path agrees with the F64 one up to
  // the rounding of its inputs and outputs (≈ 6e-8 each), amplified by the op.
  void expect_agree(const std::string& what, Twin t) {
    Vec d = get(t.d), f = get(t.f);
    double err = 0, mag = 0;
    for (size_t i = 0; i < d.size(); i++)
      err = std::max(err, std::abs(f[i] - d[i])), mag = std::max(mag, std::abs(d[i]));
    EXPECT_LE(err, 1e-5 * mag) << what;
    EXPECT_GT(mag, 0) << what;
  }
  template <class Fn>
  void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
    try {
      fn();
      ADD_FAILURE() << "expected st::Error";
    } catch (const Error& e) {
      for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
};

// ---- memory and element-wise ------------------------------------------------------

TEST_F(CpuOps, AllocZeroFillCopyConvert) {
  Tensor a = make(DType::F32, 37);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data) % 64, 0u);
  for (double x : get(a)) EXPECT_EQ(x, 0.0);
  be->fill(a, 2.5);
  for (double x : get(a)) EXPECT_EQ(x, 2.5);
  be->zero(a);
  for (double x : get(a)) EXPECT_EQ(x, 0.0);

  // F64 -> F32 -> BF16 -> F32 with values exact in bf16; F64 -> I32 truncates.
  Tensor d = from({1.5, -2.25, 3.0, 0.0, -2.7, 2.7});
  Tensor f = make(DType::F32, 6), h = make(DType::BF16, 6), f2 = make(DType::F32, 6), i = make(DType::I32, 6);
  be->copy(f, d), be->copy(h, f), be->copy(f2, h), be->copy(i, d);
  EXPECT_EQ(get(f2)[0], 1.5);
  EXPECT_EQ(get(f2)[1], -2.25);
  EXPECT_EQ(get(h)[2], 3.0);
  EXPECT_EQ(get(i), (Vec{1, -2, 3, 0, -2, 2}));
  expect_error([&] { be->copy(make(DType::F32, 5), d); }, {"copy", "5", "6"});

  std::vector<float> host{1, 2, 3}, back(3);
  Tensor u = make(DType::F32, 3);
  be->upload(u, host.data());
  be->download(back.data(), u);
  EXPECT_EQ(back, host);

  Tensor x = from({1, 2, 3}), y = from({10, 20, 30}), z = make(DType::F64, 3);
  be->add(z, x, y, 3);
  EXPECT_EQ(get(z), (Vec{11, 22, 33}));
  be->accumulate(z, x, 2);  // only the first n elements
  EXPECT_EQ(get(z), (Vec{12, 24, 33}));

  Tensor own = be->alloc(DType::F64, 3);  // not in `owned`, so freed once
  be->free(own);
  EXPECT_TRUE(own.empty());
}

TEST_F(CpuOps, SumSquares) {
  Vec v = randv(1001);
  double want = 0, want_half = 0;
  for (size_t i = 0; i < v.size(); i++) want += v[i] * v[i], want_half += i < 500 ? v[i] * v[i] : 0;
  Tensor d = from(v);
  EXPECT_NEAR(be->sum_squares(d, v.size()), want, 1e-12 * want);
  EXPECT_NEAR(be->sum_squares(d, 500), want_half, 1e-12 * want);
  // F32: the squares of the rounded values, still summed in double.
  Tensor f = make(DType::F32, v.size());
  be->copy(f, d);
  double want_f = 0;
  for (double x : get(f)) want_f += x * x;
  EXPECT_NEAR(be->sum_squares(f, v.size()), want_f, 1e-12 * want_f);
}

TEST_F(CpuOps, DtypeAndSizeMismatchesThrow) {
  Tensor x = rand(12), w32 = make(DType::F32, 6), out = make(DType::F64, 8);
  expect_error([&] { be->matmul_forward(out, x, w32, Tensor{}, 4, 3, 2); },
               {"matmul_forward", "weight", "f32"});
  Tensor w = rand(6);
  expect_error([&] { be->matmul_forward(make(DType::F64, 7), x, w, Tensor{}, 4, 3, 2); },
               {"matmul_forward", "out", "7", "8"});
  expect_error([&] { be->attention_forward(rand(12), rand(6), rand(60), 1, 3, 3, 2, 2); }, {"KV=2"});
  expect_error([&] { be->rope_forward(rand(36), 1, 3, 2, 1, 3, 1e4f); }, {"head_dim 3", "even"});
}

// ---- embedding ----------------------------------------------------------------------

TEST_F(CpuOps, EmbeddingForwardAndBackward) {
  const int N = 6, C = 3, V = 5;
  Tensor tok = ids({1, 3, 1, 0, 4, 1});  // repeats must add up in the backward
  Tensor wte = rand(V * C), out = make(DType::F64, N * C);
  be->embedding_forward(out, tok, wte, N, C, V);
  Vec o = get(out), e = get(wte);
  for (int c = 0; c < C; c++) EXPECT_EQ(o[1 * C + c], e[3 * C + c]);

  Vec w = randv(N * C), g0 = randv(V * C);
  Tensor dwte = from(g0);  // prefilled: the backward must add
  be->embedding_backward(dwte, from(w), tok, N, C, V);
  expect_grad("dwte", wte, minus(get(dwte), g0), [&] {
    be->embedding_forward(out, tok, wte, N, C, V);
    return wsum(w, out);
  });
}

TEST_F(CpuOps, OutOfRangeIdsThrow) {
  Tensor wte = rand(5 * 2), out = make(DType::F64, 3 * 2);
  expect_error(
      [&] {
        be->embedding_forward(out, ids({0, 4, 5}), wte, 3, 2, 5);
      },
      {"token id 5", "row 2", "V=5"});
  expect_error([&] { be->embedding_forward(out, ids({0, -1, 1}), wte, 3, 2, 5); }, {"token id -1", "row 1"});
  expect_error([&] { be->embedding_backward(wte, out, ids({7, 0, 1}), 3, 2, 5); }, {"token id 7", "row 0"});
  {
    Tensor t = be->alloc(DType::I32, 3);
    const std::vector<int32_t> bad = {1, 2, 9}, ignored = {1, -100, 2};
    expect_error([&] { be->upload_ids(t, bad.data(), 5, false, 0, "token id"); }, {"token id 9", "row 2", "V=5"});
    expect_error([&] { be->upload_ids(t, ignored.data(), 5, false, 0, "target"); }, {"target -100", "row 1"});
    be->upload_ids(t, ignored.data(), 5, true, -100, "target");  // the ignore index passes
    be->free(t);
  }
  Tensor logits = rand(3 * 4), losses = make(DType::F64, 3);
  expect_error(
      [&] {
        be->cross_entropy(losses, logits, ids({0, 4, -100}), 3, 4, -100, 1, true);
      },
      {"target 4", "row 1", "V=4"});
  be->cross_entropy(losses, logits, ids({0, 3, -100}), 3, 4, -100, 1, true);  // ignore_index is fine
}

// ---- RMSNorm ------------------------------------------------------------------------

TEST_F(CpuOps, RmsNorm) {
  const int N = 3, C = 7;
  const float eps = 1e-5f;
  Tensor x = rand(N * C, -2, 2), wt = rand(C, 0.5, 1.5);
  Tensor out = make(DType::F64, N * C), rstd = make(DType::F64, N);
  be->rmsnorm_forward(out, rstd, x, wt, N, C, eps);
  Vec xv = get(x), wv = get(wt), ov = get(out);
  for (int r = 0; r < N; r++) {
    double ms = 0;
    for (int c = 0; c < C; c++) ms += xv[r * C + c] * xv[r * C + c] / C;
    double rs = 1 / std::sqrt(ms + double(eps));
    EXPECT_NEAR(get(rstd)[r], rs, 1e-14 * rs);
    for (int c = 0; c < C; c++) EXPECT_NEAR(ov[r * C + c], xv[r * C + c] * rs * wv[c], 1e-14);
  }

  Vec w = randv(N * C), dx0 = randv(N * C), dw0 = randv(C);
  Tensor dx = from(dx0), dw = from(dw0);  // both prefilled: both must add
  be->rmsnorm_backward(dx, dw, from(w), x, wt, rstd, N, C);
  auto loss = [&] {
    be->rmsnorm_forward(out, rstd, x, wt, N, C, eps);
    return wsum(w, out);
  };
  expect_grad("dinp", x, minus(get(dx), dx0), loss);
  expect_grad("dweight", wt, minus(get(dw), dw0), loss);
}

// ---- linear -------------------------------------------------------------------------

class CpuMatmul : public CpuOps, public ::testing::WithParamInterface<bool> {};

TEST_P(CpuMatmul, ForwardAndBackward) {
  const bool with_bias = GetParam();
  const int N = 4, IC = 5, OC = 3;
  Tensor x = rand(N * IC), wt = rand(OC * IC), b = with_bias ? rand(OC) : Tensor{};
  Tensor out = make(DType::F64, N * OC);
  be->matmul_forward(out, x, wt, b, N, IC, OC);
  Vec xv = get(x), wv = get(wt), bv = with_bias ? get(b) : Vec(OC, 0.0), ov = get(out);
  for (int r = 0; r < N; r++)
    for (int o = 0; o < OC; o++) {
      double s = bv[o];
      for (int i = 0; i < IC; i++) s += xv[r * IC + i] * wv[o * IC + i];
      EXPECT_NEAR(ov[r * OC + o], s, 1e-14);
    }

  Vec w = randv(N * OC), dw0 = randv(OC * IC), db0 = randv(OC);
  Tensor dx = rand(N * IC);  // garbage: dinp is overwritten
  Tensor dw = from(dw0), db = with_bias ? from(db0) : Tensor{};
  be->matmul_backward(dx, dw, db, from(w), x, wt, N, IC, OC);
  auto loss = [&] {
    be->matmul_forward(out, x, wt, b, N, IC, OC);
    return wsum(w, out);
  };
  expect_grad("dinp", x, get(dx), loss);
  expect_grad("dweight", wt, minus(get(dw), dw0), loss);
  if (with_bias) expect_grad("dbias", b, minus(get(db), db0), loss);

  // An empty dinp is skipped; dweight keeps accumulating.
  Vec dw1 = get(dw);
  be->matmul_backward(Tensor{}, dw, db, from(w), x, wt, N, IC, OC);
  Vec dw2 = get(dw);
  for (int i = 0; i < OC * IC; i++) EXPECT_NEAR(dw2[i] - dw1[i], dw1[i] - dw0[i], 1e-14);
}
INSTANTIATE_TEST_SUITE_P(Bias, CpuMatmul, ::testing::Bool());

// ---- RoPE -----------------------------------------------------------------------------

TEST_F(CpuOps, RopeKnownValues) {
  // B=2, T=2, H=KV=1, hd=4, theta=100: inv_freq = {1, 0.1}; rows 0 and 2 are position 0.
  const int B = 2, T = 2, H = 1, KV = 1, hd = 4, row = 12;
  Vec x0;
  for (int r = 0; r < B * T; r++)
    for (double v : {1.0, 2.0, 3.0, 4.0, -1.0, 0.5, 2.0, -3.0, 9.0, 8.0, 7.0, 6.0}) x0.push_back(v + r);
  Tensor x = from(x0);
  be->rope_forward(x, B, T, H, KV, hd, 100.0f);
  Vec y = get(x);
  for (int r : {0, 2})
    for (int i = 0; i < row; i++) EXPECT_EQ(y[r * row + i], x0[r * row + i]) << "position 0 is the identity";
  for (int r : {1, 3}) {
    for (int head = 0; head < 2; head++) {  // q then k; pairs (0,2) at angle 1, (1,3) at angle 0.1
      const double* a = &x0[r * row + head * hd];
      const double* b = &y[r * row + head * hd];
      EXPECT_NEAR(b[0], a[0] * std::cos(1.0) - a[2] * std::sin(1.0), 1e-14);
      EXPECT_NEAR(b[2], a[2] * std::cos(1.0) + a[0] * std::sin(1.0), 1e-14);
      EXPECT_NEAR(b[1], a[1] * std::cos(0.1) - a[3] * std::sin(0.1), 1e-14);
      EXPECT_NEAR(b[3], a[3] * std::cos(0.1) + a[1] * std::sin(0.1), 1e-14);
    }
    for (int i = 8; i < row; i++) EXPECT_EQ(y[r * row + i], x0[r * row + i]) << "v is untouched";
  }
}

TEST_F(CpuOps, RopeBackwardIsTransposeAndInverse) {
  const int B = 2, T = 3, H = 4, KV = 2, hd = 6, n = B * T * (H + 2 * KV) * hd;
  const float theta = 1e4f;
  Vec x0 = randv(n);
  Tensor x = from(x0), y = make(DType::F64, n);
  be->copy(y, x);
  be->rope_forward(y, B, T, H, KV, hd, theta);
  be->rope_backward(y, B, T, H, KV, hd, theta);  // a rotation: its transpose is its inverse
  Vec back = get(y);
  for (int i = 0; i < n; i++) EXPECT_NEAR(back[i], x0[i], 1e-14);

  Vec w = randv(n);
  Tensor g = from(w);
  be->rope_backward(g, B, T, H, KV, hd, theta);
  expect_grad("dqkv", x, get(g), [&] {
    be->copy(y, x);  // rope is in place: work on a copy of the perturbed input
    be->rope_forward(y, B, T, H, KV, hd, theta);
    return wsum(w, y);
  });
}

// ---- attention ----------------------------------------------------------------------

struct AttnShape {
  int B, T, H, KV, hd;
};
void PrintTo(const AttnShape& s, std::ostream* os) {
  *os << "B=" << s.B << " T=" << s.T << " H=" << s.H << " KV=" << s.KV << " hd=" << s.hd;
}
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
                         [](const auto& info) {
                           const AttnShape& s = info.param;
                           return "B" + std::to_string(s.B) + "T" + std::to_string(s.T) + "H" +
                                  std::to_string(s.H) + "KV" + std::to_string(s.KV) + "hd" +
                                  std::to_string(s.hd);
                         });

// ---- SwiGLU ---------------------------------------------------------------------------

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

// ---- cross-entropy --------------------------------------------------------------------

TEST_F(CpuOps, CrossEntropyHandValues) {
  const int N = 3, V = 4;
  const float scale = 0.5f;
  Vec x0 = {1, 2, 3, 4, 1000, 0, 0, 1000, 5, 6, 7, 8};
  Tensor logits = from(x0), losses = make(DType::F64, N), tgt = ids({3, 1, -100});
  be->cross_entropy(losses, logits, tgt, N, V, -100, scale, false);
  EXPECT_EQ(get(logits), x0) << "grad=false leaves the logits alone";
  Vec l = get(losses);
  EXPECT_NEAR(l[0], std::log(1 + std::exp(-1.0) + std::exp(-2.0) + std::exp(-3.0)), 1e-14);
  EXPECT_NEAR(l[1], 1000 + std::log(2.0), 1e-12);  // needs the max subtraction
  EXPECT_EQ(l[2], 0.0);

  be->cross_entropy(losses, logits, tgt, N, V, -100, scale, true);
  Vec g = get(logits);
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + std::exp(4.0);
  const Vec g1 = {0.25, -0.5, 0, 0.25};  // softmax (1/2, 0, 0, 1/2) minus onehot(1), times 1/2
  for (int i = 0; i < V; i++) {
    EXPECT_NEAR(g[i], scale * (std::exp(i + 1.0) / z - (i == 3)), 1e-14);
    EXPECT_NEAR(g[V + i], g1[i], 1e-12);  // exp(-log 2) after lse = 1000 + log 2 rounds at 1e-13
  }
  EXPECT_EQ(Vec(g.begin() + 8, g.end()), Vec(4, 0.0)) << "ignored rows get a zero gradient";
  EXPECT_EQ(get(losses), l) << "grad=true reports the same losses";
}

TEST_F(CpuOps, CrossEntropyGradientMatchesFiniteDifferences) {
  const int N = 5, V = 7;
  const float scale = 0.75f;
  Tensor x = rand(N * V, -3, 3), work = make(DType::F64, N * V), losses = make(DType::F64, N);
  Tensor tgt = ids({2, 6, -1, 0, 2});
  be->copy(work, x);
  be->cross_entropy(losses, work, tgt, N, V, -1, scale, true);
  // L = scale · Σ losses, whose gradient the fused backward writes into the logits.
  expect_grad("dlogits", x, get(work), [&] {
    be->copy(work, x);
    be->cross_entropy(losses, work, tgt, N, V, -1, scale, false);
    double s = 0;
    for (double v : get(losses)) s += v;
    return double(scale) * s;
  });
}

// ---- AdamW ----------------------------------------------------------------------------

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

// ---- F32 against F64 ------------------------------------------------------------------

TEST_F(CpuOps, F32AgreesWithF64) {
  const int B = 2, T = 5, H = 4, KV = 2, hd = 4, N = B * T, C = H * hd, F = 6, V = 9;
  const int QKV = (H + 2 * KV) * hd;
  auto D = [](Twin t) { return t.d; };
  auto S = [](Twin t) { return t.f; };
  auto both = [&](auto&& fn) { fn(D), fn(S); };

  Tensor tok = ids({0, 3, 8, 1, 1, 4, 7, 2, 5, 6});
  Twin wte = twin(randv(V * C)), x = twin_zeros(N * C), dwte = twin_zeros(V * C), dx = twin(randv(N * C));
  both([&](auto pick) { be->embedding_forward(pick(x), tok, pick(wte), N, C, V); });
  both([&](auto pick) { be->embedding_backward(pick(dwte), pick(dx), tok, N, C, V); });
  expect_agree("embedding out", x), expect_agree("dwte", dwte);

  Twin nw = twin(randv(C, 0.5, 1.5)), xn = twin_zeros(N * C), rstd = twin_zeros(N), dnw = twin_zeros(C);
  Twin dxn = twin_zeros(N * C), dy = twin(randv(N * C));
  both([&](auto pick) { be->rmsnorm_forward(pick(xn), pick(rstd), pick(x), pick(nw), N, C, 1e-6f); });
  both([&](auto pick) {
    be->rmsnorm_backward(pick(dxn), pick(dnw), pick(dy), pick(x), pick(nw), pick(rstd), N, C);
  });
  expect_agree("rmsnorm out", xn), expect_agree("rstd", rstd), expect_agree("rmsnorm dinp", dxn);
  expect_agree("rmsnorm dweight", dnw);

  Twin wq = twin(randv(QKV * C)), bq = twin(randv(QKV)), qkv = twin_zeros(N * QKV);
  Twin dwq = twin_zeros(QKV * C), dbq = twin_zeros(QKV), dxq = twin_zeros(N * C), dq = twin(randv(N * QKV));
  both([&](auto pick) { be->matmul_forward(pick(qkv), pick(xn), pick(wq), pick(bq), N, C, QKV); });
  both([&](auto pick) {
    be->matmul_backward(pick(dxq), pick(dwq), pick(dbq), pick(dq), pick(xn), pick(wq), N, C, QKV);
  });
  expect_agree("matmul out", qkv), expect_agree("matmul dinp", dxq), expect_agree("matmul dweight", dwq);
  expect_agree("matmul dbias", dbq);

  both([&](auto pick) { be->rope_forward(pick(qkv), B, T, H, KV, hd, 1e6f); });
  expect_agree("rope", qkv);
  Twin att = twin_zeros(N * C), lse = twin_zeros(B * H * T), datt = twin(randv(N * C)),
       dqkv = twin_zeros(N * QKV);
  both([&](auto pick) { be->attention_forward(pick(att), pick(lse), pick(qkv), B, T, H, KV, hd); });
  both([&](auto pick) {
    be->attention_backward(pick(dqkv), pick(datt), pick(att), pick(lse), pick(qkv), B, T, H, KV, hd);
  });
  expect_agree("attention out", att), expect_agree("lse", lse), expect_agree("attention dqkv", dqkv);
  both([&](auto pick) { be->rope_backward(pick(dqkv), B, T, H, KV, hd, 1e6f); });
  expect_agree("rope backward", dqkv);

  Twin gu = twin(randv(N * 2 * F, -3, 3)), act = twin_zeros(N * F), dgu = twin_zeros(N * 2 * F);
  Twin dact = twin(randv(N * F));
  both([&](auto pick) { be->swiglu_forward(pick(act), pick(gu), N, F); });
  both([&](auto pick) { be->swiglu_backward(pick(dgu), pick(dact), pick(gu), N, F); });
  expect_agree("swiglu out", act), expect_agree("swiglu dgu", dgu);

  Twin logits = twin(randv(N * V, -4, 4)), losses = twin_zeros(N);
  Tensor tgt = ids({1, 2, -100, 8, 0, 0, 3, 4, 5, 6});
  both([&](auto pick) { be->cross_entropy(pick(losses), pick(logits), tgt, N, V, -100, 0.1f, true); });
  expect_agree("losses", losses), expect_agree("dlogits", logits);
}

}  // namespace
}  // namespace st

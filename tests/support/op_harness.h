// The harness of the op tests (tests/backend/ops/, one file per op family): fresh
// random inputs seeded by the test's own name, the CPU reference, and the comparisons.
//
// CpuOps: the CPU reference alone. Backwards against central finite differences in
// F64, forwards against naive or hand computations, F32 against F64.
// Finite differences: L(x) = Σ w ⊙ op(x) with random w, so dL/dout = w and the
// analytic gradient is one backward call. Central differences with h = 1e-5 on
// O(1) inputs have truncation error h²/6·|L'''| ≈ 1e-10 and rounding error
// ≈ 1e-16·|L|/h ≈ 1e-10, so |analytic - fd| ≤ 1e-6·|g| + 1e-8 leaves two orders of
// magnitude of margin while still catching any wrong term (which is O(|g|)).
//
// CudaOps: the CUDA ops against the CPU reference (F32) on fresh random inputs. Each
// op runs twice on the GPU: all-F32 (SIMT paths, fp32 accumulation) and BF16
// activations with F32 parameter gradients (the training path). Inputs of the BF16
// run are rounded to bf16 first and the CPU sees the same rounded values, so the
// comparison measures the kernels' own error, not the input rounding.
// Thresholds, as ||gpu - cpu|| / ||cpu|| (tolerance()):
//   F32:  1e-4 (fp32 arithmetic in a different order; observed ~1e-6)
//   BF16: 1e-2 (one bf16 rounding of each output is 2^-9 = 2e-3 relative at worst,
//         ~1e-3 in norm; attention also rounds P and dS to bf16 before its products)
// GPU outputs are filled with NaN before each op so an element it fails to write
// shows up, and a non-finite value never passes. Every CudaOps case skips where no
// CUDA device is present. Suites named Cuda* carry the ctest label gpu, the others
// cpu (tests/CMakeLists.txt), so one file holds an op's CPU and GPU cases.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "support/expect_close.h"

namespace st::testing {

// fn() must throw st::Error whose message holds every one of `parts`.
template <class Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected st::Error";
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

// A fixed seed per test: the hash of the test's own name.
inline uint64_t test_seed() { return hash_name(::testing::UnitTest::GetInstance()->current_test_info()->name()); }

// ---- the CPU reference alone ---------------------------------------------------------

class CpuOps : public ::testing::Test {
 protected:
  using Vec = std::vector<double>;
  static constexpr double kFdStep = 1e-5, kFdRel = 1e-6, kFdAbs = 1e-8;

  // An F64 tensor and an F32 tensor holding the same (rounded) values.
  struct Twin {
    Tensor d, f;
  };

  std::unique_ptr<Backend> be = make_cpu_backend();
  std::mt19937_64 rng{test_seed()};
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
  void expect_grad(const std::string& what, Tensor x, const Vec& analytic, const std::function<double()>& loss) {
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
};

// ---- the CUDA backend against the CPU reference ---------------------------------------

inline double tolerance(DType dt) { return dt == DType::F32 ? 1e-4 : 1e-2; }
inline constexpr DType kBoth[] = {DType::F32, DType::BF16};
inline std::string tag(DType dt, const std::string& what) { return std::string(dtype_name(dt)) + " " + what; }

class CudaOps : public ::testing::Test {
 protected:
  using Vec = std::vector<float>;

  std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::unique_ptr<Backend> gpu_;  // created on first use, after the skip check
  std::mt19937_64 rng{test_seed()};
  std::vector<std::pair<Backend*, Tensor>> owned;

  void SetUp() override {
    if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
  ~CudaOps() override {
    for (auto& [be, t] : owned) be->free(t);
  }

  Backend& gpu() {
    if (!gpu_) gpu_ = make_cuda_backend(0);
    return *gpu_;
  }

  Vec randv(size_t n, float lo = -1, float hi = 1) {
    std::uniform_real_distribution<float> u(lo, hi);
    Vec v(n);
    for (auto& x : v) x = u(rng);
    return v;
  }
  // The values a dt tensor can hold: bf16-rounded for BF16, unchanged for F32.
  static Vec representable(Vec v, DType dt) {
    if (dt == DType::BF16)
      for (auto& x : v) x = bf16_to_f32(f32_to_bf16(x));
    return v;
  }
  Vec randv_as(DType dt, size_t n, float lo = -1, float hi = 1) { return representable(randv(n, lo, hi), dt); }

  Tensor make(Backend& be, DType dt, size_t n) {
    Tensor t = be.alloc(dt, n);
    owned.emplace_back(&be, t);
    return t;
  }
  Tensor cpu_from(const Vec& v) {
    Tensor t = make(*cpu, DType::F32, v.size());
    cpu->upload(t, v.data());
    return t;
  }
  // v converted to dt on the host (F32 or BF16), uploaded.
  Tensor gpu_from(const Vec& v, DType dt) { return gpu_from_at(v, dt, 0); }
  // The same in a slice `off` elements into a fresh buffer: 16-byte aligned only when
  // off * (dtype size) is, so the kernels' scalar (unaligned) paths run.
  Tensor gpu_from_at(const Vec& v, DType dt, size_t off) {
    Tensor t = make(gpu(), dt, v.size() + off).slice(off, v.size());
    if (dt == DType::BF16) {
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); i++) h[i] = f32_to_bf16(v[i]);
      gpu().upload(t, h.data());
    } else {
      gpu().upload(t, v.data());
    }
    return t;
  }
  Tensor gpu_ids(const std::vector<int32_t>& v) {
    Tensor t = make(gpu(), DType::I32, v.size());
    gpu().upload(t, v.data());
    return t;
  }
  Tensor cpu_ids(const std::vector<int32_t>& v) {
    Tensor t = make(*cpu, DType::I32, v.size());
    cpu->upload(t, v.data());
    return t;
  }
  Tensor gpu_poisoned(DType dt, size_t n, size_t off = 0) {
    Tensor t = make(gpu(), dt, n + off).slice(off, n);
    gpu().fill(t, NAN);
    return t;
  }
  // The bytes of a GPU tensor, for bitwise comparisons.
  std::vector<uint8_t> raw(Tensor t) {
    std::vector<uint8_t> b(t.bytes());
    gpu().download(b.data(), t);
    return b;
  }
  Vec get(Backend& be, Tensor t) {
    Vec v(t.numel);
    if (t.dtype == DType::BF16) {
      std::vector<uint16_t> h(t.numel);
      be.download(h.data(), t);
      for (size_t i = 0; i < h.size(); i++) v[i] = bf16_to_f32(h[i]);
    } else if (t.dtype == DType::F32) {
      be.download(v.data(), t);
    } else {
      ADD_FAILURE() << "get: unexpected dtype " << dtype_name(t.dtype);
    }
    return v;
  }
  Vec get(Tensor t) { return get(gpu(), t); }
  Vec cget(Tensor t) { return get(*cpu, t); }

  // The q, k and v parts ("dq", "dk", "dv") of a fused (rows, (H+2KV)*hd) gradient,
  // each gathered into one vector, so that they are compared apart: an error in one
  // must not hide behind the others.
  static std::vector<std::pair<std::string, Vec>> qkv_parts(const Vec& x, size_t rows, int H, int KV, int hd) {
    const int row = (H + 2 * KV) * hd;
    std::vector<std::pair<std::string, Vec>> parts;
    for (auto [name, lo, hi] : {std::tuple{"dq", 0, H * hd}, std::tuple{"dk", H * hd, (H + KV) * hd},
                                std::tuple{"dv", (H + KV) * hd, row}}) {
      Vec p;
      for (size_t r = 0; r < rows; r++)
        for (int i = lo; i < hi; i++) p.push_back(x[r * row + i]);
      parts.emplace_back(name, std::move(p));
    }
    return parts;
  }

  // (support/expect_close.h; zero_ok: the reference is exactly zero by construction)
  static void expect_close(const std::string& what, const Vec& got, const Vec& want, double tol,
                           bool zero_ok = false) {
    st::testing::expect_close(what, got, want, tol, zero_ok);
  }
};

}  // namespace st::testing

// The CUDA ops against the CPU reference (F32) on fresh random inputs.
//
// Each op runs twice on the GPU: all-F32 (SIMT paths, fp32 accumulation) and BF16
// activations with F32 parameter gradients (the training path). Inputs of the BF16
// run are rounded to bf16 first and the CPU sees the same rounded values, so the
// comparison measures the kernels' own error, not the input rounding.
// Thresholds, as ||gpu - cpu|| / ||cpu||:
//   F32:  1e-4 (fp32 arithmetic in a different order; observed ~1e-6)
//   BF16: 1e-2 (one bf16 rounding of each output is 2^-9 = 2e-3 relative at worst,
//         ~1e-3 in norm; attention also rounds P and dS to bf16 before its products)
// GPU outputs are filled with NaN before each op so an element it fails to write
// shows up, and a non-finite value never passes.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "support/expect_close.h"

namespace st {
namespace {

using Vec = std::vector<float>;

double tolerance(DType dt) { return dt == DType::F32 ? 1e-4 : 1e-2; }

class CudaOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::unique_ptr<Backend> gpu_;  // created on first use, after the skip check
  std::mt19937_64 rng{hash_name(::testing::UnitTest::GetInstance()->current_test_info()->name())};
  std::vector<std::pair<Backend*, Tensor>> owned;

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

  // (support/expect_close.h; zero_ok: the reference is exactly zero by construction)
  static void expect_close(const std::string& what, const Vec& got, const Vec& want, double tol,
                           bool zero_ok = false) {
    st::testing::expect_close(what, got, want, tol, zero_ok);
  }

  template <class Fn>
  static void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
    try {
      fn();
      ADD_FAILURE() << "expected st::Error";
    } catch (const Error& e) {
      for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
};

const DType kBoth[] = {DType::F32, DType::BF16};
std::string tag(DType dt, const std::string& what) { return std::string(dtype_name(dt)) + " " + what; }

// ---- memory and element-wise --------------------------------------------------------------

TEST_F(CudaOps, AllocFillCopyConvert) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : {DType::F32, DType::BF16, DType::I32}) {
    Tensor t = make(gpu(), dt, 1000);
    std::vector<uint8_t> raw(t.bytes(), 0xff);
    gpu().download(raw.data(), t);
    for (uint8_t b : raw) ASSERT_EQ(b, 0) << "alloc zero-fills " << dtype_name(dt);
  }
  Tensor f = make(gpu(), DType::F32, 777);
  gpu().fill(f, 2.5);
  for (float x : get(f)) ASSERT_EQ(x, 2.5f);
  gpu().zero(f);
  for (float x : get(f)) ASSERT_EQ(x, 0.0f);

  // F32 -> BF16 rounds to nearest even exactly like the host's f32_to_bf16.
  Vec v = randv(4099, -100, 100);
  v[0] = 1.00390625f;  // a tie between two bf16 values: rounds to even (1.0)
  v[1] = 1.01171875f;  // a tie rounding up to 1.015625
  Tensor src = gpu_from(v, DType::F32), h = make(gpu(), DType::BF16, v.size());
  gpu().copy(h, src);
  std::vector<uint16_t> hb(v.size());
  gpu().download(hb.data(), h);
  for (size_t i = 0; i < v.size(); i++) ASSERT_EQ(hb[i], f32_to_bf16(v[i])) << "element " << i << " = " << v[i];
  Tensor back = make(gpu(), DType::F32, v.size());
  gpu().copy(back, h);
  Vec b = get(back);
  for (size_t i = 0; i < v.size(); i++) ASSERT_EQ(b[i], bf16_to_f32(hb[i]));

  // F32 -> I32 truncates; same-dtype copy is a plain copy.
  Tensor fi = gpu_from({1.5f, -2.7f, 3.0f, 0.0f}, DType::F32), ii = make(gpu(), DType::I32, 4);
  gpu().copy(ii, fi);
  std::vector<int32_t> iv(4);
  gpu().download(iv.data(), ii);
  EXPECT_EQ(iv, (std::vector<int32_t>{1, -2, 3, 0}));
  Tensor same = make(gpu(), DType::F32, v.size());
  gpu().copy(same, src);
  EXPECT_EQ(get(same), v);
  expect_error([&] { gpu().copy(make(gpu(), DType::F32, 5), fi); }, {"copy", "5", "4"});

  Tensor own = gpu().alloc(DType::F32, 3);  // not in `owned`, so freed once
  gpu().free(own);
  EXPECT_TRUE(own.empty());
}

TEST_F(CudaOps, AddAccumulateSumSquares) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const size_t n = 100003;
  for (DType dt : kBoth) {
    Vec a = randv_as(dt, n), b = randv_as(dt, n);
    Tensor ga = gpu_from(a, dt), gb = gpu_from(b, dt), out = gpu_poisoned(dt, n);
    gpu().add(out, ga, gb, n);
    Vec want(n);
    for (size_t i = 0; i < n; i++) want[i] = a[i] + b[i];
    expect_close(tag(dt, "add"), get(out), want, tolerance(dt));
    gpu().accumulate(ga, gb, n - 1);  // only the first n-1 elements
    Vec acc = get(ga);
    want.back() = a.back();
    expect_close(tag(dt, "accumulate"), acc, want, tolerance(dt));

    double ss = 0, ss_half = 0;
    for (size_t i = 0; i < n; i++) ss += double(b[i]) * b[i], ss_half += i < n / 2 ? double(b[i]) * b[i] : 0;
    EXPECT_NEAR(gpu().sum_squares(gb, n), ss, 1e-12 * ss) << dtype_name(dt);
    EXPECT_NEAR(gpu().sum_squares(gb, n / 2), ss_half, 1e-12 * ss) << dtype_name(dt);
  }
}

// add and accumulate at slices: every array at the same misalignment (a scalar head,
// then 16-byte packs), at different ones (all scalar) and aligned; each path gives the
// same bits, and the CPU's sums.
TEST_F(CudaOps, AddAccumulateSlices) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const size_t n = 16384 + 5;
  struct Offs {
    size_t out, a, b;
  };
  for (DType dt : kBoth) {
    Vec a = randv_as(dt, n), b = randv_as(dt, n);
    Vec want(n);
    for (size_t i = 0; i < n; i++) want[i] = a[i] + b[i];
    std::vector<uint8_t> first_add, first_acc;
    for (const Offs o : {Offs{0, 0, 0}, Offs{3, 3, 3}, Offs{1, 2, 0}, Offs{0, 0, 5}}) {
      const std::string what = " offsets " + std::to_string(o.out) + "," + std::to_string(o.a) + "," +
                               std::to_string(o.b);
      Tensor ga = gpu_from_at(a, dt, o.a), gb = gpu_from_at(b, dt, o.b), out = gpu_poisoned(dt, n, o.out);
      gpu().add(out, ga, gb, n);
      expect_close(tag(dt, "add" + what), get(out), want, tolerance(dt));
      Tensor acc = gpu_from_at(a, dt, o.out);
      gpu().accumulate(acc, gb, n);
      expect_close(tag(dt, "accumulate" + what), get(acc), want, tolerance(dt));
      if (first_add.empty()) {
        first_add = raw(out), first_acc = raw(acc);
      } else {
        EXPECT_TRUE(raw(out) == first_add) << tag(dt, "add") << what << ": bits differ from the aligned path";
        EXPECT_TRUE(raw(acc) == first_acc) << tag(dt, "accumulate") << what << ": bits differ from the aligned path";
      }
    }
  }
}

// ---- embedding ---------------------------------------------------------------------------------

TEST_F(CudaOps, Embedding) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int N = 300, C = 96, V = 50;
  std::vector<int32_t> tok(N);
  for (auto& t : tok) t = int32_t(rng() % V);  // many repeats: the backward must add them up
  for (DType dt : kBoth) {
    Vec wte = randv_as(dt, size_t(V) * C), dout = randv_as(dt, size_t(N) * C), dw0 = randv(size_t(V) * C);
    Tensor cout = make(*cpu, DType::F32, size_t(N) * C), cdw = cpu_from(dw0);
    cpu->embedding_forward(cout, cpu_ids(tok), cpu_from(wte), N, C, V);
    cpu->embedding_backward(cdw, cpu_from(dout), cpu_ids(tok), N, C, V);

    Tensor gt = gpu_ids(tok), gout = gpu_poisoned(dt, size_t(N) * C), gdw = gpu_from(dw0, DType::F32);
    gpu().embedding_forward(gout, gt, gpu_from(wte, dt), N, C, V);
    gpu().embedding_backward(gdw, gpu_from(dout, dt), gt, N, C, V);
    expect_close(tag(dt, "embedding out"), get(gout), cget(cout), tolerance(dt));
    expect_close(tag(dt, "embedding dwte (+=)"), get(gdw), cget(cdw), 1e-5);  // F32 sums either way
  }
}

// Long runs of one token (20000 rows over 3 ids): the scatter gives the same bits every
// time, and still the CPU's sums.
TEST_F(CudaOps, EmbeddingBackwardIsDeterministic) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int N = 20000, C = 80, V = 3;
  std::vector<int32_t> tok(N);
  for (auto& t : tok) t = int32_t(rng() % V);
  for (DType dt : kBoth) {
    Vec dout = randv_as(dt, size_t(N) * C), dw0 = randv(size_t(V) * C);
    Tensor cdw = cpu_from(dw0);
    cpu->embedding_backward(cdw, cpu_from(dout), cpu_ids(tok), N, C, V);
    Tensor gt = gpu_ids(tok), gd = gpu_from(dout, dt);
    std::vector<Vec> runs;
    for (int rep = 0; rep < 3; ++rep) {
      Tensor gdw = gpu_from(dw0, DType::F32);
      gpu().embedding_backward(gdw, gd, gt, N, C, V);
      runs.push_back(get(gdw));
    }
    EXPECT_EQ(runs[0], runs[1]) << dtype_name(dt);
    EXPECT_EQ(runs[0], runs[2]) << dtype_name(dt);
    expect_close(tag(dt, "embedding dwte, long runs"), runs[0], cget(cdw), 1e-4);
  }
}

TEST_F(CudaOps, OutOfRangeIdsThrow) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Tensor wte = gpu_from(randv(5 * 2), DType::BF16), out = gpu_poisoned(DType::BF16, 3 * 2);
  Tensor dwte = make(gpu(), DType::F32, 5 * 2);
  expect_error([&] { gpu().embedding_forward(out, gpu_ids({0, 4, 5}), wte, 3, 2, 5); },
               {"embedding_forward", "token id 5", "row 2", "V=5"});
  expect_error([&] { gpu().embedding_forward(out, gpu_ids({0, -1, 7}), wte, 3, 2, 5); }, {"token id -1", "row 1"});
  expect_error([&] { gpu().embedding_backward(dwte, out, gpu_ids({7, 0, 1}), 3, 2, 5); }, {"token id 7", "row 0"});
  Tensor logits = gpu_from(randv(3 * 4), DType::BF16), losses = make(gpu(), DType::F32, 3);
  expect_error([&] { gpu().cross_entropy(losses, logits, gpu_ids({0, 4, -100}), 3, 4, -100, 1, true); },
               {"cross_entropy", "target 4", "row 1", "V=4"});
  // ignore_index is fine, and the backend still works after the errors.
  gpu().cross_entropy(losses, logits, gpu_ids({0, 3, -100}), 3, 4, -100, 1, true);
  gpu().embedding_forward(out, gpu_ids({0, 4, 1}), wte, 3, 2, 5);
  for (float x : get(out)) EXPECT_TRUE(std::isfinite(x));
  // Dtype contract: statistics and parameter gradients are F32.
  expect_error([&] { gpu().embedding_backward(make(gpu(), DType::BF16, 10), out, gpu_ids({0, 1, 2}), 3, 2, 5); },
               {"dwte", "bf16", "f32"});
}

// ---- RMSNorm -------------------------------------------------------------------------------------

TEST_F(CudaOps, RmsNorm) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int N = 77, C = 200;  // C not a multiple of 32
  const float eps = 1e-6f;
  for (DType dt : kBoth) {
    Vec x = randv_as(dt, size_t(N) * C, -2, 2), w = randv_as(dt, C, 0.5, 1.5), dy = randv_as(dt, size_t(N) * C);
    Vec dx0 = randv_as(dt, size_t(N) * C), dw0 = randv(C);  // both prefilled: both must add
    Tensor co = make(*cpu, DType::F32, size_t(N) * C), cr = make(*cpu, DType::F32, N);
    Tensor cx = cpu_from(x), cw = cpu_from(w), cdx = cpu_from(dx0), cdw = cpu_from(dw0);
    cpu->rmsnorm_forward(co, cr, cx, cw, N, C, eps);
    cpu->rmsnorm_backward(cdx, cdw, cpu_from(dy), cx, cw, cr, N, C);

    Tensor go = gpu_poisoned(dt, size_t(N) * C), gr = gpu_poisoned(DType::F32, N);
    Tensor gx = gpu_from(x, dt), gw = gpu_from(w, dt), gdx = gpu_from(dx0, dt), gdw = gpu_from(dw0, DType::F32);
    gpu().rmsnorm_forward(go, gr, gx, gw, N, C, eps);
    gpu().rmsnorm_backward(gdx, gdw, gpu_from(dy, dt), gx, gw, gr, N, C);
    expect_close(tag(dt, "rmsnorm out"), get(go), cget(co), tolerance(dt));
    expect_close(tag(dt, "rmsnorm rstd"), get(gr), cget(cr), 1e-5);
    expect_close(tag(dt, "rmsnorm dinp (+=)"), get(gdx), cget(cdx), tolerance(dt));
    expect_close(tag(dt, "rmsnorm dweight (+=)"), get(gdw), cget(cdw), 1e-4);
  }
}

// The fused residual add + norm: against the CPU (add, then rmsnorm of the sum rounded
// to dt, as the GPU rounds it), and bit for bit against add() then rmsnorm_forward()
// on the GPU. Shapes: Qwen2.5-1.5B's C (vector path, row in registers), C % 8 != 0
// (scalar path, partial pack), C = 3000 (past the register cache); slices at offsets
// that break the 16-byte alignment of some or all arguments.
TEST_F(CudaOps, AddRmsNormForward) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const float eps = 1e-6f;
  struct Case {
    int N, C;
    size_t off_a, off_b, off_sum, off_out;
  };
  for (const Case k : {Case{37, 1536, 0, 0, 0, 0}, Case{37, 1536, 1, 1, 1, 1}, Case{37, 1536, 0, 3, 0, 0},
                       Case{21, 100, 0, 0, 0, 0}, Case{9, 3000, 0, 0, 0, 0}, Case{9, 3000, 2, 0, 2, 1}}) {
    const int N = k.N, C = k.C;
    const size_t n = size_t(N) * C;
    const std::string what = " N=" + std::to_string(N) + " C=" + std::to_string(C) + " offsets " +
                             std::to_string(k.off_a) + "," + std::to_string(k.off_b) + "," +
                             std::to_string(k.off_sum) + "," + std::to_string(k.off_out);
    for (DType dt : kBoth) {
      Vec a = randv_as(dt, n, -2, 2), b = randv_as(dt, n, -2, 2), w = randv_as(dt, C, 0.5, 1.5);
      Vec sum(n);
      for (size_t i = 0; i < n; i++) sum[i] = a[i] + b[i];
      sum = representable(sum, dt);
      Tensor co = make(*cpu, DType::F32, n), cr = make(*cpu, DType::F32, N);
      cpu->rmsnorm_forward(co, cr, cpu_from(sum), cpu_from(w), N, C, eps);

      Tensor ga = gpu_from_at(a, dt, k.off_a), gb = gpu_from_at(b, dt, k.off_b), gw = gpu_from(w, dt);
      Tensor gs = gpu_poisoned(dt, n, k.off_sum), go = gpu_poisoned(dt, n, k.off_out);
      Tensor gr = gpu_poisoned(DType::F32, N);
      gpu().add_rmsnorm_forward(gs, go, gr, ga, gb, gw, N, C, eps);
      expect_close(tag(dt, "add_rmsnorm sum" + what), get(gs), sum, 1e-6);
      expect_close(tag(dt, "add_rmsnorm out" + what), get(go), cget(co), tolerance(dt));
      expect_close(tag(dt, "add_rmsnorm rstd" + what), get(gr), cget(cr), 1e-5);

      // add + rmsnorm_forward, the unfused sum at another alignment (so the other path of
      // each kernel runs): the same bits.
      Tensor us = gpu_poisoned(dt, n, k.off_sum == 0 ? 1 : 0), uo = gpu_poisoned(dt, n);
      Tensor ur = gpu_poisoned(DType::F32, N);
      gpu().add(us, ga, gb, n);
      gpu().rmsnorm_forward(uo, ur, us, gw, N, C, eps);
      EXPECT_TRUE(raw(us) == raw(gs)) << tag(dt, "sum") << what << ": fused and unfused bits differ";
      EXPECT_TRUE(raw(uo) == raw(go)) << tag(dt, "out") << what << ": fused and unfused bits differ";
      EXPECT_TRUE(raw(ur) == raw(gr)) << tag(dt, "rstd") << what << ": fused and unfused bits differ";
      expect_close(tag(dt, "rmsnorm out" + what), get(uo), cget(co), tolerance(dt));
    }
  }
  // In place: sum written over a.
  for (DType dt : kBoth) {
    const int N = 5, C = 1536;
    const size_t n = size_t(N) * C;
    Vec a = randv_as(dt, n), b = randv_as(dt, n), w = randv_as(dt, C, 0.5, 1.5);
    Tensor ga = gpu_from(a, dt), gb = gpu_from(b, dt), gw = gpu_from(w, dt);
    Tensor ref_s = gpu_poisoned(dt, n), ref_o = gpu_poisoned(dt, n), ref_r = gpu_poisoned(DType::F32, N);
    gpu().add_rmsnorm_forward(ref_s, ref_o, ref_r, ga, gb, gw, N, C, eps);
    Tensor go = gpu_poisoned(dt, n), gr = gpu_poisoned(DType::F32, N);
    gpu().add_rmsnorm_forward(ga, go, gr, ga, gb, gw, N, C, eps);
    EXPECT_TRUE(raw(ga) == raw(ref_s) && raw(go) == raw(ref_o) && raw(gr) == raw(ref_r))
        << tag(dt, "add_rmsnorm in place (sum = a)");
  }
}

// The backward at sizes that take many blocks (3001 rows: not a multiple of any
// block's row count above 1), at C = 1536, C % 8 != 0 and slices off 16-byte
// alignment; dinp and dweight both prefilled (both add). Two runs give the same bits.
TEST_F(CudaOps, RmsNormBackwardLarge) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  struct Case {
    int N, C;
    size_t off;  // of dinp, dout, inp and weight
  };
  for (const Case k : {Case{3001, 1536, 0}, Case{3001, 1536, 1}, Case{1000, 1000, 0}, Case{517, 4100, 0}}) {
    const int N = k.N, C = k.C;
    const size_t n = size_t(N) * C;
    const std::string what =
        " N=" + std::to_string(N) + " C=" + std::to_string(C) + " offset " + std::to_string(k.off);
    for (DType dt : kBoth) {
      Vec x = randv_as(dt, n, -2, 2), w = randv_as(dt, C, 0.5, 1.5), dy = randv_as(dt, n);
      Vec dx0 = randv_as(dt, n), dw0 = randv(C);
      Vec rs(N);
      for (int r = 0; r < N; r++) {
        double ss = 0;
        for (int c = 0; c < C; c++) ss += double(x[size_t(r) * C + c]) * x[size_t(r) * C + c];
        rs[r] = float(1.0 / std::sqrt(ss / C + 1e-6));
      }
      Tensor cdx = cpu_from(dx0), cdw = cpu_from(dw0);
      cpu->rmsnorm_backward(cdx, cdw, cpu_from(dy), cpu_from(x), cpu_from(w), cpu_from(rs), N, C);
      Tensor gdy = gpu_from_at(dy, dt, k.off), gx = gpu_from_at(x, dt, k.off), gw = gpu_from_at(w, dt, k.off);
      Tensor grs = gpu_from(rs, DType::F32);
      std::vector<std::vector<uint8_t>> dx_bits, dw_bits;
      for (int rep = 0; rep < 2; rep++) {
        Tensor gdx = gpu_from_at(dx0, dt, k.off), gdw = gpu_from(dw0, DType::F32);
        gpu().rmsnorm_backward(gdx, gdw, gdy, gx, gw, grs, N, C);
        if (rep == 0) {
          expect_close(tag(dt, "rmsnorm dinp (+=)" + what), get(gdx), cget(cdx), tolerance(dt));
          expect_close(tag(dt, "rmsnorm dweight (+=)" + what), get(gdw), cget(cdw), 1e-4);
        }
        dx_bits.push_back(raw(gdx)), dw_bits.push_back(raw(gdw));
      }
      EXPECT_TRUE(dx_bits[0] == dx_bits[1]) << tag(dt, "rmsnorm dinp") << what << ": not deterministic";
      EXPECT_TRUE(dw_bits[0] == dw_bits[1]) << tag(dt, "rmsnorm dweight") << what << ": not deterministic";
    }
  }
}

// ---- linear ----------------------------------------------------------------------------------------

struct MatmulShape {
  int N, IC, OC;
  bool bias;
  size_t offset;  // weight and bias start this many elements into their buffer (alignment)
};
class CudaMatmul : public CudaOps, public ::testing::WithParamInterface<MatmulShape> {};

TEST_P(CudaMatmul, ForwardAndBackwardAccumulate) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const auto [N, IC, OC, with_bias, off] = GetParam();
  for (DType dt : kBoth) {
    Vec x = randv_as(dt, size_t(N) * IC), w = randv_as(dt, off + size_t(OC) * IC), b = randv_as(dt, off + OC);
    Vec dy = randv_as(dt, size_t(N) * OC), dw0 = randv(size_t(OC) * IC), db0 = randv(OC);
    // CPU: out, then the backward twice (dweight and dbias must accumulate).
    Tensor cx = cpu_from(x), cw = cpu_from(w).slice(off, size_t(OC) * IC);
    Tensor cb = with_bias ? cpu_from(b).slice(off, OC) : Tensor{};
    Tensor co = make(*cpu, DType::F32, size_t(N) * OC), cdx = make(*cpu, DType::F32, size_t(N) * IC);
    Tensor cdw = cpu_from(dw0), cdb = with_bias ? cpu_from(db0) : Tensor{}, cdy = cpu_from(dy);
    cpu->matmul_forward(co, cx, cw, cb, N, IC, OC);
    cpu->matmul_backward(cdx, cdw, cdb, cdy, cx, cw, N, IC, OC);
    cpu->matmul_backward(Tensor{}, cdw, cdb, cdy, cx, cw, N, IC, OC);

    Tensor gx = gpu_from(x, dt), gw = gpu_from(w, dt).slice(off, size_t(OC) * IC);
    Tensor gb = with_bias ? gpu_from(b, dt).slice(off, OC) : Tensor{};
    Tensor go = gpu_poisoned(dt, size_t(N) * OC), gdx = gpu_poisoned(dt, size_t(N) * IC);
    Tensor gdw = gpu_from(dw0, DType::F32), gdb = with_bias ? gpu_from(db0, DType::F32) : Tensor{};
    Tensor gdy = gpu_from(dy, dt);
    gpu().matmul_forward(go, gx, gw, gb, N, IC, OC);
    gpu().matmul_backward(gdx, gdw, gdb, gdy, gx, gw, N, IC, OC);
    gpu().matmul_backward(Tensor{}, gdw, gdb, gdy, gx, gw, N, IC, OC);  // empty dinp: skipped
    expect_close(tag(dt, "matmul out"), get(go), cget(co), tolerance(dt));
    expect_close(tag(dt, "matmul dinp"), get(gdx), cget(cdx), tolerance(dt));
    // F32 output from exact bf16 products summed in fp32: far tighter than bf16 outputs.
    expect_close(tag(dt, "matmul dweight (+= twice)"), get(gdw), cget(cdw), dt == DType::F32 ? 1e-4 : 1e-3);
    if (with_bias) expect_close(tag(dt, "matmul dbias (+= twice)"), get(gdb), cget(cdb), 1e-4);
  }
}
INSTANTIATE_TEST_SUITE_P(Shapes, CudaMatmul,
                         ::testing::Values(MatmulShape{37, 72, 100, false, 0}, MatmulShape{37, 72, 100, true, 0},
                                           MatmulShape{256, 512, 384, true, 0},
                                           MatmulShape{33, 64, 48, true, 1},    // 2-byte aligned slices
                                           MatmulShape{64, 96, 40, false, 3}),  // odd offset, no bias
                         [](const auto& info) {
                           const MatmulShape& s = info.param;
                           return "N" + std::to_string(s.N) + "IC" + std::to_string(s.IC) + "OC" +
                                  std::to_string(s.OC) + (s.bias ? "Bias" : "NoBias") + "Off" +
                                  std::to_string(s.offset);
                         });

// ---- RoPE -----------------------------------------------------------------------------------------

// The GEMM algorithm tuning (SHARDTRAIN_GEMM_TUNE=1) keeps only algorithms whose output is the
// heuristic first pick's bit for bit: a backend with it and one without give the same
// bytes for the forward, the input gradient and the accumulated weight gradient, on
// shapes large enough for the heuristic to offer several algorithms.
TEST_F(CudaOps, GemmTuningChangesNoBits) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const DType bf = DType::BF16;
  struct Out {
    std::vector<uint8_t> y, dx, dw;
  };
  auto run = [&](const char* tune, int N, int IC, int OC, uint64_t seed) {
    setenv("SHARDTRAIN_GEMM_TUNE", tune, 1);
    std::unique_ptr<Backend> be = make_cuda_backend(0);
    unsetenv("SHARDTRAIN_GEMM_TUNE");
    std::mt19937_64 r(seed);
    std::uniform_real_distribution<float> u(-1, 1);
    auto up = [&](DType dt, size_t n) {
      Vec v(n);
      for (auto& x : v) x = u(r);
      Tensor t = be->alloc(dt, n);
      if (dt == DType::BF16) {
        std::vector<uint16_t> h(n);
        for (size_t i = 0; i < n; i++) h[i] = f32_to_bf16(v[i]);
        be->upload(t, h.data());
      } else {
        be->upload(t, v.data());
      }
      return t;
    };
    Tensor x = up(bf, size_t(N) * IC), w = up(bf, size_t(OC) * IC), dy = up(bf, size_t(N) * OC);
    Tensor dw = up(DType::F32, size_t(OC) * IC);  // accumulated into
    Tensor y = be->alloc(bf, size_t(N) * OC), dx = be->alloc(bf, size_t(N) * IC);
    be->matmul_forward(y, x, w, Tensor{}, N, IC, OC);
    be->matmul_backward(dx, dw, Tensor{}, dy, x, w, N, IC, OC);
    auto bytes = [&](Tensor t) {
      std::vector<uint8_t> b(t.bytes());
      be->download(b.data(), t);
      return b;
    };
    Out o{bytes(y), bytes(dx), bytes(dw)};
    for (Tensor t : {x, w, dy, dw, y, dx}) be->free(t);
    return o;
  };
  for (auto [N, IC, OC] : {std::tuple{4096, 1536, 2048}, std::tuple{8192, 1536, 8960}, std::tuple{2048, 8960, 1536}}) {
    const uint64_t seed = rng();
    const Out tuned = run("1", N, IC, OC, seed), plain = run("0", N, IC, OC, seed);
    const std::string shape = std::to_string(N) + "x" + std::to_string(IC) + "->" + std::to_string(OC);
    EXPECT_TRUE(tuned.y == plain.y) << shape << ": forward differs";
    EXPECT_TRUE(tuned.dx == plain.dx) << shape << ": input gradient differs";
    EXPECT_TRUE(tuned.dw == plain.dw) << shape << ": weight gradient differs";
  }
}

TEST_F(CudaOps, Rope) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  struct Shape {
    int B, T, H, KV, hd;
    float theta;
    size_t off = 0;  // qkv starts this many elements into its buffer (alignment)
  };
  // The second reaches position 2047, where the angle needs double precision. The 16-byte
  // path takes hd/2 % (8 bf16, 4 f32) == 0 on an aligned buffer and rotates two heads a
  // step (an odd H + KV leaves one: the second and the last); the scalar path runs at an
  // odd offset and at hd 12. The third and fourth are Qwen2.5-1.5B's heads.
  for (const Shape s : {Shape{2, 50, 4, 2, 64, 1e6f}, Shape{1, 2048, 2, 1, 128, 1e4f},
                        Shape{1, 300, 12, 2, 128, 1e6f}, Shape{1, 300, 12, 2, 128, 1e6f, 1},
                        Shape{2, 40, 3, 1, 12, 1e4f}, Shape{2, 40, 4, 1, 16, 1e4f}}) {
    const size_t n = size_t(s.B) * s.T * (s.H + 2 * s.KV) * s.hd;
    const std::string what =
        " T=" + std::to_string(s.T) + " hd=" + std::to_string(s.hd) + " offset " + std::to_string(s.off);
    for (DType dt : kBoth) {
      Vec x = randv_as(dt, n, -2, 2);
      Tensor cx = cpu_from(x), gx = gpu_from_at(x, dt, s.off);
      cpu->rope_forward(cx, s.B, s.T, s.H, s.KV, s.hd, s.theta);
      gpu().rope_forward(gx, s.B, s.T, s.H, s.KV, s.hd, s.theta);
      expect_close(tag(dt, "rope forward" + what), get(gx), cget(cx), tolerance(dt));
      Tensor cg = cpu_from(x), gg = gpu_from_at(x, dt, s.off);
      cpu->rope_backward(cg, s.B, s.T, s.H, s.KV, s.hd, s.theta);
      gpu().rope_backward(gg, s.B, s.T, s.H, s.KV, s.hd, s.theta);
      expect_close(tag(dt, "rope backward" + what), get(gg), cget(cg), tolerance(dt));
    }
  }
}

// ---- attention ------------------------------------------------------------------------------------

struct AttnShape {
  int B, T, H, KV, hd;
};
void PrintTo(const AttnShape& s, std::ostream* os) {
  *os << "B=" << s.B << " T=" << s.T << " H=" << s.H << " KV=" << s.KV << " hd=" << s.hd;
}
class CudaAttention : public CudaOps, public ::testing::WithParamInterface<AttnShape> {};

TEST_P(CudaAttention, ForwardAndBackwardMatchCpu) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
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
    const int row = (H + 2 * KV) * hd;
    for (auto [name, lo, hi] : {std::tuple{"dq", 0, H * hd}, std::tuple{"dk", H * hd, (H + KV) * hd},
                                std::tuple{"dv", (H + KV) * hd, row}}) {
      Vec gp, cp;
      for (size_t r = 0; r < rows; r++)
        for (int i = lo; i < hi; i++) gp.push_back(g[r * row + i]), cp.push_back(c[r * row + i]);
      // With T = 1 every softmax has one entry: P = 1, dS = 0, so dq = dk = 0 exactly.
      const bool zero_ok = T == 1 && std::string(name) != "dv";
      expect_close(tag(dt, std::string("attention ") + name), gp, cp, tolerance(dt), zero_ok);
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
                         [](const auto& info) {
                           const AttnShape& s = info.param;
                           return "B" + std::to_string(s.B) + "T" + std::to_string(s.T) + "H" +
                                  std::to_string(s.H) + "KV" + std::to_string(s.KV) + "hd" +
                                  std::to_string(s.hd);
                         });

// Not a check: the speed of the attention kernels at Qwen2.5-1.5B's shape, for the
// performance log. Run with --gtest_also_run_disabled_tests. Times the legacy kernels
// (SHARDTRAIN_ATTENTION=legacy) and the FlashAttention-2 ones at hd 128 and 64, and
// checks the FA2 results against the legacy kernels' at this shape (both are checked
// against the CPU at small shapes above).
TEST_F(CudaOps, DISABLED_AttentionSpeed) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  struct Env {  // restores the default on the way out, whatever happens
    ~Env() { unsetenv("SHARDTRAIN_ATTENTION"); }
  } env_guard;
  const int B = 4, T = 2048, H = 12, KV = 2;
  for (const int hd : {128, 64}) {
    const size_t rows = size_t(B) * T, nqkv = rows * (H + 2 * KV) * hd, nout = rows * H * hd;
    Tensor qkv = gpu_from(randv(nqkv, -2, 2), DType::BF16), out = make(gpu(), DType::BF16, nout);
    Tensor lse = make(gpu(), DType::F32, size_t(B) * H * T), dqkv = make(gpu(), DType::BF16, nqkv);
    Tensor dout = gpu_from(randv(nout), DType::BF16);
    Tensor out_ref = make(gpu(), DType::BF16, nout), lse_ref = make(gpu(), DType::F32, size_t(B) * H * T);
    Tensor dqkv_ref = make(gpu(), DType::BF16, nqkv);
    auto time_ms = [&](auto&& fn) {
      for (int i = 0; i < 3; i++) fn();  // warm-up
      gpu().synchronize();
      const int reps = 20;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; i++) fn();
      gpu().synchronize();
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
    };
    // Causal: half of the 4·B·H·T²·hd forward FLOPs; the backward does 2.5x the forward's work.
    const double flop = 4.0 * B * H * double(T) * T * hd / 2;
    auto report = [&](const char* name, double fwd, double bwd) {
      std::printf("attention %-14s B=%d T=%d H=%d KV=%d hd=%d: forward %.3f ms (%.1f TFLOP/s), backward %.3f ms "
                  "(%.1f TFLOP/s)\n",
                  name, B, T, H, KV, hd, fwd, flop / fwd * 1e-9, bwd, 2.5 * flop / bwd * 1e-9);
    };
    // Legacy: the reference results and times. Both backward runs read the legacy forward's out and lse.
    setenv("SHARDTRAIN_ATTENTION", "legacy", 1);
    const double lf = time_ms([&] { gpu().attention_forward(out_ref, lse_ref, qkv, B, T, H, KV, hd); });
    const double lb =
        time_ms([&] { gpu().attention_backward(dqkv_ref, dout, out_ref, lse_ref, qkv, B, T, H, KV, hd); });
    report("legacy", lf, lb);
    const Vec o_ref = get(out_ref), l_ref = get(lse_ref), d_ref = get(dqkv_ref);
    unsetenv("SHARDTRAIN_ATTENTION");
    gpu().fill(out, NAN), gpu().fill(lse, NAN), gpu().fill(dqkv, NAN);
    for (const char* run : {"fa2", "fa2 (again)"}) {  // twice: the spread between runs is the noise
      const double f = time_ms([&] { gpu().attention_forward(out, lse, qkv, B, T, H, KV, hd); });
      const double b = time_ms([&] { gpu().attention_backward(dqkv, dout, out_ref, lse_ref, qkv, B, T, H, KV, hd); });
      report(run, f, b);
    }
    const std::string tagv = " hd=" + std::to_string(hd) + " vs legacy";
    expect_close("fa2 out" + tagv, get(out), o_ref, 1e-2);
    expect_close("fa2 lse" + tagv, get(lse), l_ref, 1e-5);
    const Vec g = get(dqkv);
    const int row = (H + 2 * KV) * hd;
    for (auto [name, lo, hi] : {std::tuple{"dq", 0, H * hd}, std::tuple{"dk", H * hd, (H + KV) * hd},
                                std::tuple{"dv", (H + KV) * hd, row}}) {
      Vec gp, cp;
      for (size_t r = 0; r < rows; r++)
        for (int i = lo; i < hi; i++) gp.push_back(g[r * row + i]), cp.push_back(d_ref[r * row + i]);
      expect_close(std::string("fa2 ") + name + tagv, gp, cp, 1e-2);
    }
  }

  // The MLP's gate_up GEMM at the same token count, for scale (cuBLASLt).
  const int N = B * T, IC = 1536, OC = 2 * 8960;
  auto time_ms = [&](auto&& fn) {
    fn();
    gpu().synchronize();
    const int reps = 5;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; i++) fn();
    gpu().synchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
  };
  Tensor x = gpu_from(randv(size_t(N) * IC), DType::BF16), w = gpu_from(randv(size_t(OC) * IC), DType::BF16);
  Tensor y = make(gpu(), DType::BF16, size_t(N) * OC), dw = make(gpu(), DType::F32, size_t(OC) * IC);
  const double mf = time_ms([&] { gpu().matmul_forward(y, x, w, Tensor{}, N, IC, OC); });
  const double mb = time_ms([&] { gpu().matmul_backward(x, dw, Tensor{}, y, x, w, N, IC, OC); });
  const double mflop = 2.0 * N * IC * OC;
  std::printf("matmul N=%d IC=%d OC=%d: forward %.3f ms (%.0f TFLOP/s), backward %.3f ms (%.0f TFLOP/s)\n", N, IC,
              OC, mf, mflop / mf * 1e-9, mb, 2 * mflop / mb * 1e-9);
}

// ---- SwiGLU -----------------------------------------------------------------------------------------

// F = 300: 16-byte packs for F32 only (300 % 8 != 0); F = 8960 (Qwen2.5-1.5B) aligned
// (packs) and at an odd offset (scalar) on the same inputs: the same bits either way.
TEST_F(CudaOps, SwiGlu) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
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

// ---- cross-entropy ------------------------------------------------------------------------------------

// Row 2 of every case is ignored. V = 151936 (Qwen2's vocabulary) with aligned rows, and
// at an offset that puts the targets in a row's scalar head (0), its 16-byte packs and
// its scalar tail (151935); V = 1001 gives each row another alignment.
TEST_F(CudaOps, CrossEntropy) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  struct Case {
    int N, V;
    std::vector<int32_t> targets;
    size_t off = 0;  // logits start this many elements into their buffer
  };
  const float scale = 0.25f;
  for (const Case& k : {Case{5, 7, {2, 6, -100, 0, 2}}, Case{4, 151936, {5, 151935, -100, 77}},
                        Case{4, 151936, {0, 151935, -100, 151930}, 3},
                        Case{7, 1001, {0, 1000, -100, 500, 3, 999, 8}, 1}}) {
    const int N = k.N, V = k.V;
    for (DType dt : kBoth) {
      Vec x = randv_as(dt, size_t(N) * V, -8, 8);
      Tensor cx = cpu_from(x), cl = make(*cpu, DType::F32, N);
      cpu->cross_entropy(cl, cx, cpu_ids(k.targets), N, V, -100, scale, true);

      Tensor gt = gpu_ids(k.targets), gx = gpu_from_at(x, dt, k.off), gl = gpu_poisoned(DType::F32, N);
      gpu().cross_entropy(gl, gx, gt, N, V, -100, scale, false);
      EXPECT_EQ(get(gx), x) << "grad=false leaves the logits alone";
      Vec loss_nograd = get(gl);
      gpu().fill(gl, NAN);
      gpu().cross_entropy(gl, gx, gt, N, V, -100, scale, true);
      const std::string v = " V=" + std::to_string(V) + " offset " + std::to_string(k.off);
      // The loss is computed from the same (rounded) logits in fp32: tight either way.
      expect_close(tag(dt, "cross-entropy losses" + v), get(gl), cget(cl), 1e-5);
      EXPECT_EQ(get(gl), loss_nograd) << "grad=true reports the same losses";
      EXPECT_EQ(get(gl)[2], 0.0f) << "ignored row";
      Vec g = get(gx);
      expect_close(tag(dt, "cross-entropy dlogits" + v), g, cget(cx), tolerance(dt));
      for (int i = 0; i < V; i++) ASSERT_EQ(g[size_t(2) * V + i], 0.0f) << "ignored rows get a zero gradient";
      // Deterministic: a second run on the same logits gives the same bits.
      Tensor gx2 = gpu_from_at(x, dt, k.off), gl2 = gpu_poisoned(DType::F32, N);
      gpu().cross_entropy(gl2, gx2, gt, N, V, -100, scale, true);
      EXPECT_TRUE(raw(gx2) == raw(gx) && raw(gl2) == raw(gl)) << tag(dt, "cross-entropy") << v << ": not deterministic";
    }
  }
}

// Not a check: the memory-bound kernels at the training shape of Qwen2.5-1.5B (micro-batch
// 8 x 2048 tokens), for the performance log, with the bytes each must move and the rate
// that makes. Run with --gtest_also_run_disabled_tests --gtest_filter='*MemoryBoundSpeed*'.
// (cross_entropy's time includes the id check's synchronisation.)
TEST_F(CudaOps, DISABLED_MemoryBoundSpeed) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int N = 16384, C = 1536, F = 8960, V = 151936, chunk = 4096, H = 12, KV = 2, hd = 128;
  const DType bf = DType::BF16;
  auto time_us = [&](auto&& fn) {
    for (int i = 0; i < 3; i++) fn();  // warm-up
    gpu().synchronize();
    const int reps = 20;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; i++) fn();
    gpu().synchronize();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
  };
  auto report = [](const char* name, double us, double bytes) {
    std::printf("%-28s %9.1f us  %7.1f MB  %6.2f TB/s\n", name, us, bytes * 1e-6, bytes / us * 1e-6);
  };
  const size_t nc = size_t(N) * C, nf = size_t(N) * F;
  Tensor a = gpu_from(randv(nc), bf), b = gpu_from(randv(nc), bf), w = gpu_from(randv(C, 0.5, 1.5), bf);
  Tensor sum = make(gpu(), bf, nc), out = make(gpu(), bf, nc), rstd = make(gpu(), DType::F32, N);
  Tensor dinp = make(gpu(), bf, nc), dw = make(gpu(), DType::F32, C);
  report("add", time_us([&] { gpu().add(sum, a, b, nc); }), 3.0 * nc * 2);
  report("accumulate", time_us([&] { gpu().accumulate(sum, a, nc); }), 3.0 * nc * 2);
  report("rmsnorm_forward", time_us([&] { gpu().rmsnorm_forward(out, rstd, a, w, N, C, 1e-6f); }), 2.0 * nc * 2);
  report("add_rmsnorm_forward",
         time_us([&] { gpu().add_rmsnorm_forward(sum, out, rstd, a, b, w, N, C, 1e-6f); }), 4.0 * nc * 2);
  report("rmsnorm_backward", time_us([&] { gpu().rmsnorm_backward(dinp, dw, a, b, w, rstd, N, C); }), 4.0 * nc * 2);
  {
    Tensor gu = gpu_from(randv(2 * nf, -4, 4), bf), y = make(gpu(), bf, nf), dy = gpu_from(randv(nf), bf);
    Tensor dgu = make(gpu(), bf, 2 * nf);
    report("swiglu_forward", time_us([&] { gpu().swiglu_forward(y, gu, N, F); }), 3.0 * nf * 2);
    report("swiglu_backward", time_us([&] { gpu().swiglu_backward(dgu, dy, gu, N, F); }), 5.0 * nf * 2);
  }
  {
    const size_t nq = size_t(N) * (H + 2 * KV) * hd;
    Tensor qkv = gpu_from(randv(nq), bf);
    report("rope_forward", time_us([&] { gpu().rope_forward(qkv, 8, 2048, H, KV, hd, 1e6f); }),
           2.0 * N * (H + KV) * hd * 2);
  }
  {
    const size_t nl = size_t(chunk) * V;
    Tensor logits = gpu_from(randv(nl, -8, 8), bf), losses = make(gpu(), DType::F32, chunk);
    std::vector<int32_t> tg(chunk);
    for (auto& t : tg) t = int32_t(rng() % V);
    Tensor targets = gpu_ids(tg);
    report("cross_entropy (4096 rows)",
           time_us([&] { gpu().cross_entropy(losses, logits, targets, chunk, V, -100, 1.0f, true); }), 3.0 * nl * 2);
  }
}

// ---- AdamW ----------------------------------------------------------------------------------------------

TEST_F(CudaOps, AdamWMatchesCpuToTheLastBits) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
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
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
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

// The GPU's seeded initialisation gives the CPU's values: the same bits, except where
// CUDA's double log or cos differ from glibc's in the last bit and the float rounds
// the other way (then by one ulp, and rarely).
TEST_F(CudaOps, FillNormalMatchesTheCpu) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const size_t n = size_t{1} << 24;
  const uint64_t key = rng(), first = rng() % 1000000;
  Tensor c = make(*cpu, DType::F32, n), g = gpu_poisoned(DType::F32, n);
  cpu->fill_normal(c, key, first, 0.02);
  gpu().fill_normal(g, key, first, 0.02);
  const Vec want = cget(c), got = get(g);
  size_t differ = 0;
  for (size_t i = 0; i < n; i++) {
    ASSERT_TRUE(std::isfinite(got[i])) << i;
    if (got[i] == want[i]) continue;
    ++differ;
    EXPECT_EQ(std::nextafter(want[i], got[i]), got[i]) << "more than one ulp apart at " << i;
  }
  std::printf("[ error    ] fill_normal: %zu of %zu floats differ from the CPU's (by one ulp)\n", differ, n);
  EXPECT_LE(differ, n / 100000) << "of " << n;
}

// Ids checked on the host by upload_ids: a bad one is refused before the upload,
// naming it and its row; checked ones are trusted by the ops until something else
// writes their memory, after which the ops check again.
TEST_F(CudaOps, UploadIdsChecksOnTheHostAndOnlyOnce) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int N = 3, C = 2, V = 5;
  Tensor wte = gpu_from(randv(V * C), DType::F32), out = gpu_poisoned(DType::F32, N * C);
  Tensor ids = make(gpu(), DType::I32, N);
  const std::vector<int32_t> good = {0, 4, 1}, bad = {0, 1, 5};
  expect_error([&] { gpu().upload_ids(ids, bad.data(), V, false, 0, "token id"); }, {"token id 5", "row 2", "V=5"});
  gpu().upload_ids(ids, good.data(), V, false, 0, "token id");
  gpu().embedding_forward(out, ids, wte, N, C, V);
  EXPECT_TRUE(std::isfinite(get(out)[0]));
  gpu().upload(ids, bad.data());  // a plain upload: no longer trusted
  expect_error([&] { gpu().embedding_forward(out, ids, wte, N, C, V); }, {"embedding_forward", "token id 5", "row 2"});
  // Checked with an ignore index: trusted only by an op with the same one.
  const std::vector<int32_t> ignored = {0, -100, 1};
  gpu().upload_ids(ids, ignored.data(), V, true, -100, "target");
  expect_error([&] { gpu().embedding_forward(out, ids, wte, N, C, V); }, {"token id -100", "row 1"});
}

// The gradient norm's one-wait form gives the same double as part by part.
TEST_F(CudaOps, SumSquaresTotalIsThePartsSummedInOrder) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::vector<std::pair<Tensor, size_t>> parts;
  double want = 0;
  for (size_t n : {size_t{1}, size_t{1000}, size_t{0}, size_t{123457}, size_t{4096}}) {
    Tensor t = gpu_from_at(randv(n + 1), DType::F32, n % 3);
    parts.push_back({t, n});
    want += gpu().sum_squares(t, n);
  }
  EXPECT_EQ(gpu().sum_squares_total(parts), want);
  EXPECT_EQ(cpu->sum_squares_total({}), 0.0);
}

}  // namespace
}  // namespace st

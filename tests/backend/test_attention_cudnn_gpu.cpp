// cuDNN's fused flash attention (st::cuda::CudnnAttention, backend graph API) against
// the CPU reference (F32) and the FlashAttention-2 kernels, on fresh random inputs.
//
// Inputs are bf16-rounded first and the CPU sees the same rounded values. Thresholds,
// as ||gpu - cpu|| / ||cpu||: 1e-2 for out, dq, dk, dv (bf16 outputs, P and dS rounded to
// bf16 before their products), 1e-3 for lse (fp32 statistics of bf16 products).
// GPU outputs are filled with NaN first, so an element not written shows up.
// Skips without a CUDA device, and when cuDNN has no engine for the shape (printing
// cuDNN's reason). For cuDNN's own log of a failure, run with
//   CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr   (cuDNN 9; 3 = everything)
// SHARDTRAIN_CUDNN_VERBOSE=1 (set here unless already set) prints each plan built.
// DISABLED_Speed (run with --gtest_also_run_disabled_tests) times cuDNN and FA2 at
// Qwen2.5-1.5B's shape.
#include <gtest/gtest.h>

#include <cuda_runtime.h>
#include <cudnn_version.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/attention_cudnn.h"
#include "backend/cuda/cuda_kernels.h"
#include "core/dtype.h"
#include "support/expect_close.h"

namespace st {
namespace {

using Vec = std::vector<float>;
using bf16 = __nv_bfloat16;

#define CU(call)                                                                                        \
  do {                                                                                                  \
    cudaError_t e_ = (call);                                                                            \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorName(e_) << " " << cudaGetErrorString(e_); \
  } while (0)
// The same for functions that return a value: records the failure and goes on.
#define CU_EXPECT(call)                                                                                 \
  do {                                                                                                  \
    cudaError_t e_ = (call);                                                                            \
    EXPECT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorName(e_) << " " << cudaGetErrorString(e_); \
  } while (0)

// A device buffer freed on scope exit.
struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t n) : bytes(n) {
    if (cudaMalloc(&p, n) != cudaSuccess) p = nullptr;
  }
  ~Dev() {
    if (p) cudaFree(p);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(p); }
};

struct Shape {
  int B, T, H, KV, hd;
};
void PrintTo(const Shape& s, std::ostream* os) {
  *os << "B=" << s.B << " T=" << s.T << " H=" << s.H << " KV=" << s.KV << " hd=" << s.hd;
}

class CudnnAttentionTest : public ::testing::Test {
 protected:
  cudaStream_t stream = nullptr;
  std::unique_ptr<cuda::CudnnAttention> attn;
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::mt19937_64 rng{12345};

  static void SetUpTestSuite() {
    setenv("SHARDTRAIN_CUDNN_VERBOSE", "1", 0);
    if (!st::cuda_available()) return;
    std::printf("[ cudnn    ] cuDNN loaded %zu, compiled against %d.%d.%d; for cuDNN's own log set "
                "CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr\n",
                cuda::CudnnAttention::version(), CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL);
  }

  void SetUp() override {
    if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    attn = std::make_unique<cuda::CudnnAttention>(stream);
  }
  void TearDown() override {
    attn.reset();
    if (stream) {
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
  }

  Vec randv(size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    Vec v(n);
    for (auto& x : v) x = bf16_to_f32(f32_to_bf16(u(rng)));  // bf16-representable
    return v;
  }
  static Vec rounded(Vec v) {
    for (auto& x : v) x = bf16_to_f32(f32_to_bf16(x));
    return v;
  }

  void upload_bf16(const Dev& d, const Vec& v) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); i++) h[i] = f32_to_bf16(v[i]);
    CU(cudaMemcpy(d.p, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  }
  void upload_f32(const Dev& d, const Vec& v) { CU(cudaMemcpy(d.p, v.data(), v.size() * 4, cudaMemcpyHostToDevice)); }
  Vec get_bf16(const Dev& d, size_t n) {
    CU_EXPECT(cudaStreamSynchronize(stream));
    std::vector<uint16_t> h(n);
    Vec v(n);
    EXPECT_EQ(cudaMemcpy(h.data(), d.p, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < n; i++) v[i] = bf16_to_f32(h[i]);
    return v;
  }
  Vec get_f32(const Dev& d, size_t n) {
    CU_EXPECT(cudaStreamSynchronize(stream));
    Vec v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), d.p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  std::vector<uint8_t> raw(const Dev& d) {
    CU_EXPECT(cudaStreamSynchronize(stream));
    std::vector<uint8_t> b(d.bytes);
    EXPECT_EQ(cudaMemcpy(b.data(), d.p, d.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return b;
  }
  void poison(const Dev& d) { CU(cudaMemsetAsync(d.p, 0xff, d.bytes, stream)); }  // NaN in bf16 and fp32

  // CPU reference: out, lse, and dqkv from (qkv, dout, out rounded to bf16).
  void cpu_reference(const Shape& s, const Vec& qkv, const Vec& dout, Vec& out, Vec& lse, Vec& dqkv) {
    const size_t rows = size_t(s.B) * s.T, nqkv = qkv.size(), nout = rows * s.H * s.hd;
    Tensor q = cpu->alloc(DType::F32, nqkv), o = cpu->alloc(DType::F32, nout);
    Tensor l = cpu->alloc(DType::F32, size_t(s.B) * s.H * s.T), d = cpu->alloc(DType::F32, nqkv);
    Tensor dy = cpu->alloc(DType::F32, nout), o_r = cpu->alloc(DType::F32, nout);
    cpu->upload(q, qkv.data());
    cpu->attention_forward(o, l, q, s.B, s.T, s.H, s.KV, s.hd);
    out.resize(nout), lse.resize(l.numel), dqkv.resize(nqkv);
    cpu->download(out.data(), o);
    cpu->download(lse.data(), l);
    const Vec out_r = rounded(out);
    cpu->upload(o_r, out_r.data());
    cpu->upload(dy, dout.data());
    cpu->attention_backward(d, dy, o_r, l, q, s.B, s.T, s.H, s.KV, s.hd);
    cpu->download(dqkv.data(), d);
    for (Tensor* t : {&q, &o, &l, &d, &dy, &o_r}) cpu->free(*t);
  }

  // (support/expect_close.h; zero_ok: the reference is exactly zero by construction)
  static void expect_close(const std::string& what, const Vec& got, const Vec& want, double tol,
                           bool zero_ok = false) {
    st::testing::expect_close(what, got, want, tol, zero_ok);
  }
  // The q, k and v parts of a (B*T, (H+2KV)*hd) gradient compared separately.
  static void expect_close_qkv(const std::string& what, const Shape& s, const Vec& got, const Vec& want,
                               double tol) {
    const int row = (s.H + 2 * s.KV) * s.hd;
    const size_t rows = size_t(s.B) * s.T;
    for (auto [name, lo, hi] : {std::tuple{"dq", 0, s.H * s.hd}, std::tuple{"dk", s.H * s.hd, (s.H + s.KV) * s.hd},
                                std::tuple{"dv", (s.H + s.KV) * s.hd, row}}) {
      Vec g, w;
      for (size_t r = 0; r < rows; r++)
        for (int i = lo; i < hi; i++) g.push_back(got[r * row + i]), w.push_back(want[r * row + i]);
      expect_close(what + " " + name, g, w, tol, s.T == 1 && std::string(name) != "dv");
    }
  }
};

class CudnnAttentionShapes : public CudnnAttentionTest, public ::testing::WithParamInterface<Shape> {};

TEST_P(CudnnAttentionShapes, MatchesCpuAndFa2) {
  const Shape s = GetParam();
  const auto [B, T, H, KV, hd] = s;
  const size_t rows = size_t(B) * T, nqkv = rows * (H + 2 * KV) * hd, nout = rows * H * hd,
               nlse = size_t(B) * H * T;
  const Vec qkv = randv(nqkv, -2, 2), dout = randv(nout, -1, 1);
  Vec out_c, lse_c, dqkv_c;
  cpu_reference(s, qkv, dout, out_c, lse_c, dqkv_c);
  const Vec out_c_r = rounded(out_c);

  Dev g_qkv(nqkv * 2), g_dout(nout * 2), g_out_ref(nout * 2);
  Dev g_out(nout * 2), g_lse(nlse * 4), g_dqkv(nqkv * 2), g_dqkv2(nqkv * 2);
  Dev f_out(nout * 2), f_lse(nlse * 4), f_dqkv(nqkv * 2);
  upload_bf16(g_qkv, qkv), upload_bf16(g_dout, dout), upload_bf16(g_out_ref, out_c_r);
  const auto* q = g_qkv.as<bf16>();

  // ---- forward vs CPU
  poison(g_out), poison(g_lse);
  if (!attn->forward(g_out.as<bf16>(), g_lse.as<float>(), q, B, T, H, KV, hd))
    GTEST_SKIP() << "cuDNN forward unavailable: " << attn->why_not();
  std::printf("[ plan     ] %s\n", attn->plan_info().c_str());
  const Vec out_g = get_bf16(g_out, nout), lse_g = get_f32(g_lse, nlse);
  expect_close("cudnn out vs cpu", out_g, out_c, 1e-2);
  expect_close("cudnn lse vs cpu", lse_g, lse_c, 1e-3);

  // ---- backward (deterministic, the default) vs CPU, from the CPU's rounded out and cuDNN's lse
  ASSERT_TRUE(attn->deterministic());
  poison(g_dqkv);
  if (!attn->backward(g_dqkv.as<bf16>(), g_dout.as<bf16>(), g_out_ref.as<bf16>(), g_lse.as<float>(), q, B, T, H,
                      KV, hd))
    GTEST_SKIP() << "cuDNN backward unavailable: " << attn->why_not();
  std::printf("[ plan     ] %s\n", attn->plan_info().c_str());
  const Vec dqkv_g = get_bf16(g_dqkv, nqkv);
  expect_close_qkv("cudnn (deterministic) vs cpu", s, dqkv_g, dqkv_c, 1e-2);
  // Twice: bitwise equal.
  const std::vector<uint8_t> first = raw(g_dqkv);
  poison(g_dqkv2);
  ASSERT_TRUE(attn->backward(g_dqkv2.as<bf16>(), g_dout.as<bf16>(), g_out_ref.as<bf16>(), g_lse.as<float>(), q, B,
                             T, H, KV, hd))
      << attn->why_not();
  const bool det_equal = raw(g_dqkv2) == first;
  std::printf("[ determin ] deterministic backward: two runs %s\n", det_equal ? "bitwise equal" : "DIFFER");
  EXPECT_TRUE(det_equal) << "cuDNN deterministic backward is not bitwise reproducible";

  // ---- the FA2 kernels on the same inputs; each backward must accept the other's lse
  poison(f_out), poison(f_lse), poison(f_dqkv);
  cuda::attention_forward_fa2(f_out.as<bf16>(), f_lse.as<float>(), q, B, T, H, KV, hd, stream);
  CU(cudaGetLastError());
  expect_close("cudnn out vs fa2", out_g, get_bf16(f_out, nout), 1e-2);
  expect_close("cudnn lse vs fa2", lse_g, get_f32(f_lse, nlse), 1e-3);
  cuda::attention_backward_fa2(f_dqkv.as<bf16>(), g_dout.as<bf16>(), g_out_ref.as<bf16>(), g_lse.as<float>(), q, B,
                               T, H, KV, hd, stream);
  CU(cudaGetLastError());
  expect_close_qkv("cudnn vs fa2 (fa2 bwd reads cudnn lse)", s, dqkv_g, get_bf16(f_dqkv, nqkv), 1e-2);
  poison(g_dqkv2);
  ASSERT_TRUE(attn->backward(g_dqkv2.as<bf16>(), g_dout.as<bf16>(), g_out_ref.as<bf16>(), f_lse.as<float>(), q, B,
                             T, H, KV, hd))
      << attn->why_not();
  expect_close_qkv("cudnn bwd reading fa2 lse vs cpu", s, get_bf16(g_dqkv2, nqkv), dqkv_c, 1e-2);

  // ---- the non-deterministic backward (dQ atomics): accuracy, and whether it repeats
  attn->set_deterministic(false);
  poison(g_dqkv);
  if (!attn->backward(g_dqkv.as<bf16>(), g_dout.as<bf16>(), g_out_ref.as<bf16>(), g_lse.as<float>(), q, B, T, H,
                      KV, hd)) {
    std::printf("[ note     ] non-deterministic backward unavailable: %s\n", attn->why_not().c_str());
    return;
  }
  std::printf("[ plan     ] %s\n", attn->plan_info().c_str());
  expect_close_qkv("cudnn (dQ atomics) vs cpu", s, get_bf16(g_dqkv, nqkv), dqkv_c, 1e-2);
  const std::vector<uint8_t> nd_first = raw(g_dqkv);
  int equal_runs = 0;
  for (int i = 0; i < 4; i++) {
    ASSERT_TRUE(attn->backward(g_dqkv2.as<bf16>(), g_dout.as<bf16>(), g_out_ref.as<bf16>(), g_lse.as<float>(), q,
                               B, T, H, KV, hd));
    equal_runs += raw(g_dqkv2) == nd_first;
  }
  std::printf("[ determin ] dQ-atomics backward: %d of 4 repeats bitwise equal to the first (informational)\n",
              equal_runs);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudnnAttentionShapes,
                         ::testing::Values(Shape{2, 256, 12, 2, 128},  // Qwen2.5-1.5B heads
                                           Shape{2, 256, 12, 2, 64},   // hd 64
                                           Shape{2, 200, 12, 2, 128},  // T not a multiple of 64
                                           Shape{1, 77, 4, 4, 128},    // KV == H, odd T
                                           Shape{2, 300, 6, 2, 64},    // groups of 3, T not a multiple
                                           Shape{1, 1, 4, 2, 64}),     // T = 1
                         [](const auto& info) {
                           const Shape& s = info.param;
                           return "B" + std::to_string(s.B) + "T" + std::to_string(s.T) + "H" +
                                  std::to_string(s.H) + "KV" + std::to_string(s.KV) + "hd" + std::to_string(s.hd);
                         });

// Plans built ahead on prepare()'s threads (own handles) give the same bits as plans
// built at first use, forward and deterministic backward.
TEST_F(CudnnAttentionTest, PlansBuiltAheadGiveTheSameBits) {
  const int B = 2, T = 256, H = 12, KV = 2, hd = 128;
  const size_t rows = size_t(B) * T, nqkv = rows * (H + 2 * KV) * hd, nout = rows * H * hd, nlse = size_t(B) * H * T;
  Dev qkv(nqkv * 2), dout(nout * 2), out(nout * 2), lse(nlse * 4), dqkv(nqkv * 2);
  upload_bf16(qkv, randv(nqkv, -2, 2)), upload_bf16(dout, randv(nout, -1, 1));
  auto run = [&](cuda::CudnnAttention& a) {
    poison(out), poison(lse), poison(dqkv);
    EXPECT_TRUE(a.forward(out.as<bf16>(), lse.as<float>(), qkv.as<bf16>(), B, T, H, KV, hd)) << a.why_not();
    EXPECT_TRUE(a.backward(dqkv.as<bf16>(), dout.as<bf16>(), out.as<bf16>(), lse.as<float>(), qkv.as<bf16>(), B, T,
                           H, KV, hd))
        << a.why_not();
    std::vector<uint8_t> all = raw(out);
    for (const auto* d : {&lse, &dqkv}) {
      const std::vector<uint8_t> r = raw(*d);
      all.insert(all.end(), r.begin(), r.end());
    }
    return all;
  };
  const std::vector<uint8_t> at_first_use = run(*attn);
  cuda::CudnnAttention ahead(stream);
  ahead.prepare(B, T, H, KV, hd);
  ahead.prepare(B, T, H, KV, hd);  // a second call adds nothing
  const std::vector<uint8_t> built_ahead = run(ahead);
  EXPECT_TRUE(built_ahead == at_first_use) << "plans built ahead gave different bits";
  ahead.prepare(1, 16, 3, 2, 64);  // H % KV != 0: ignored, left for forward to refuse
  EXPECT_FALSE(ahead.forward(out.as<bf16>(), lse.as<float>(), qkv.as<bf16>(), 1, 16, 3, 2, 64));
}

// Arguments the graph cannot take come back false with a reason, outputs untouched.
TEST_F(CudnnAttentionTest, RefusesMisalignedPointers) {
  Dev buf(1 << 20);
  auto* p = reinterpret_cast<bf16*>(buf.as<char>() + 2);  // 2-byte aligned only
  EXPECT_FALSE(attn->forward(p, buf.as<float>(), p, 1, 16, 2, 1, 64));
  EXPECT_NE(attn->why_not().find("aligned"), std::string::npos) << attn->why_not();
  EXPECT_FALSE(attn->forward(buf.as<bf16>(), buf.as<float>(), buf.as<bf16>(), 1, 16, 2, 1, 60));
  EXPECT_NE(attn->why_not().find("head dim"), std::string::npos) << attn->why_not();
}

// Not a check: µs and TFLOP/s at Qwen2.5-1.5B's shape for cuDNN (both backward
// formulations) and FA2, plus agreement between them at this shape.
TEST_F(CudnnAttentionTest, DISABLED_Speed) {
  const int B = 16, T = 2048, H = 12, KV = 2;
  for (const int hd : {128, 64}) {
    const Shape s{B, T, H, KV, hd};
    const size_t rows = size_t(B) * T, nqkv = rows * (H + 2 * KV) * hd, nout = rows * H * hd,
                 nlse = size_t(B) * H * T;
    Dev qkv(nqkv * 2), dout(nout * 2), out(nout * 2), lse(nlse * 4), dqkv(nqkv * 2);
    Dev f_out(nout * 2), f_lse(nlse * 4), f_dqkv(nqkv * 2);
    upload_bf16(qkv, randv(nqkv, -2, 2)), upload_bf16(dout, randv(nout, -1, 1));
    const auto* q = qkv.as<bf16>();
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    auto time_us = [&](auto&& fn) {
      for (int i = 0; i < 3; i++) fn();  // warm-up (and plan building)
      cudaStreamSynchronize(stream);
      const int reps = 20;
      cudaEventRecord(e0, stream);
      for (int i = 0; i < reps; i++) fn();
      cudaEventRecord(e1, stream);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      return 1e3 * ms / reps;
    };
    const double flop = 4.0 * B * H * double(T) * T * hd / 2;  // causal forward; backward 2.5x
    auto report = [&](const char* name, double f_us, double b_us) {
      std::printf("attention %-26s B=%d T=%d H=%d KV=%d hd=%d: forward %8.1f us (%5.1f TFLOP/s)  backward %8.1f us "
                  "(%5.1f TFLOP/s)\n",
                  name, B, T, H, KV, hd, f_us, flop / f_us * 1e-6, b_us, 2.5 * flop / b_us * 1e-6);
    };

    bool ok = true;
    const double cf = time_us([&] { ok &= attn->forward(out.as<bf16>(), lse.as<float>(), q, B, T, H, KV, hd); });
    if (!ok) GTEST_SKIP() << "cuDNN forward unavailable: " << attn->why_not();
    std::printf("[ plan     ] %s\n", attn->plan_info().c_str());
    for (const bool det : {true, false}) {
      attn->set_deterministic(det);
      ok = true;
      const double cb = time_us([&] {
        ok &= attn->backward(dqkv.as<bf16>(), dout.as<bf16>(), out.as<bf16>(), lse.as<float>(), q, B, T, H, KV, hd);
      });
      if (!ok) {
        std::printf("[ note     ] cuDNN backward (%s) unavailable: %s\n", det ? "deterministic" : "dQ atomics",
                    attn->why_not().c_str());
        continue;
      }
      std::printf("[ plan     ] %s; workspace held %.1f MiB\n", attn->plan_info().c_str(),
                  attn->workspace_bytes() / 1048576.0);
      report(det ? "cudnn (deterministic bwd)" : "cudnn (dQ atomics bwd)", cf, cb);
      // Repeatability at this shape: three more runs against the last timed one.
      const std::vector<uint8_t> first = raw(dqkv);
      int equal = 0;
      for (int i = 0; i < 3; i++) {
        ASSERT_TRUE(
            attn->backward(dqkv.as<bf16>(), dout.as<bf16>(), out.as<bf16>(), lse.as<float>(), q, B, T, H, KV, hd));
        equal += raw(dqkv) == first;
      }
      std::printf("[ determin ] %s backward hd=%d: %d of 3 repeats bitwise equal\n",
                  det ? "deterministic" : "dQ-atomics", hd, equal);
      if (det) EXPECT_EQ(equal, 3) << "cuDNN deterministic backward is not bitwise reproducible at hd=" << hd;
    }
    attn->set_deterministic(true);
    for (const char* run : {"fa2", "fa2 (again)"}) {
      const double ff = time_us([&] {
        cuda::attention_forward_fa2(f_out.as<bf16>(), f_lse.as<float>(), q, B, T, H, KV, hd, stream);
      });
      const double fb = time_us([&] {
        cuda::attention_backward_fa2(f_dqkv.as<bf16>(), dout.as<bf16>(), out.as<bf16>(), lse.as<float>(), q, B, T,
                                     H, KV, hd, stream);
      });
      report(run, ff, fb);
    }
    // Agreement at this shape (both backward passes read cuDNN's out and lse).
    ASSERT_TRUE(attn->backward(dqkv.as<bf16>(), dout.as<bf16>(), out.as<bf16>(), lse.as<float>(), q, B, T, H, KV,
                               hd));
    const std::string tag = " hd=" + std::to_string(hd);
    expect_close("cudnn out vs fa2" + tag, get_bf16(out, nout), get_bf16(f_out, nout), 1e-2);
    expect_close("cudnn lse vs fa2" + tag, get_f32(lse, nlse), get_f32(f_lse, nlse), 1e-3);
    expect_close_qkv("cudnn vs fa2" + tag, s, get_bf16(dqkv, nqkv), get_bf16(f_dqkv, nqkv), 1e-2);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
}

}  // namespace
}  // namespace st

// The CPU reference backend: dtype dispatch and memory ops, behind the checked
// fronts of backend.cpp (its OpRules: f32 or f64 throughout; ids read on the host).
// The arithmetic lives in cpu_layers.cpp and cpu_attention.cpp (cpu_kernels.h).
// Single-threaded apart from OpenBLAS and the seeded fill (split by index), so results
// are reproducible run to run.
#include <cmath>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/op_checks.h"
#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/fp8.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "core/rng.h"

namespace st {
namespace {

// ---- dtype dispatch ---------------------------------------------------------------

// Calls fn(T{}) with T = float or double for an F32 / F64 dtype.
template <class Fn>
void dispatch(DType dt, Fn&& fn) {
  if (dt == DType::F64)
    fn(double{});
  else
    fn(float{});
}

template <class T>
T* ptr(Tensor t) { return t.empty() ? nullptr : t.as<T>(); }

// ---- element conversion for copy / fill / sum_squares ---------------------------

double load(const void* p, DType dt, size_t i) {
  switch (dt) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::F64: return static_cast<const double*>(p)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::I32: return static_cast<const int32_t*>(p)[i];
    case DType::I64: return double(static_cast<const int64_t*>(p)[i]);
    case DType::F8E4M3: return fp8_decode(static_cast<const uint8_t*>(p)[i], Fp8Format::E4M3);
    case DType::F8E5M2: return fp8_decode(static_cast<const uint8_t*>(p)[i], Fp8Format::E5M2);
    case DType::F16: break;
  }
  fail("cpu backend: ", dtype_name(dt), " tensors are not supported");
}

template <class I>
I to_int(double x) {
  // Truncation toward zero like torch's .to(int); out-of-range values are an error, not UB.
  ST_CHECK(std::isfinite(x) && x >= double(std::numeric_limits<I>::min()) &&
               x < -double(std::numeric_limits<I>::min()),
           "cpu backend: value ", x, " does not fit an integer tensor");
  return static_cast<I>(x);
}

void store(void* p, DType dt, size_t i, double x) {
  switch (dt) {
    case DType::F32: static_cast<float*>(p)[i] = float(x); return;
    case DType::F64: static_cast<double*>(p)[i] = x; return;
    case DType::BF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(float(x)); return;
    case DType::I32: static_cast<int32_t*>(p)[i] = to_int<int32_t>(x); return;
    case DType::I64: static_cast<int64_t*>(p)[i] = to_int<int64_t>(x); return;
    case DType::F8E4M3: static_cast<uint8_t*>(p)[i] = fp8_encode(float(x), Fp8Format::E4M3); return;
    case DType::F8E5M2: static_cast<uint8_t*>(p)[i] = fp8_encode(float(x), Fp8Format::E5M2); return;
    case DType::F16: break;
  }
  fail("cpu backend: ", dtype_name(dt), " tensors are not supported");
}

// ---- the backend ------------------------------------------------------------------

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::CPU; }
  std::string name() const override { return "cpu"; }

  // ---- memory -------------------------------------------------------------------

  Tensor alloc(DType dtype, size_t numel) override {
    Tensor t{nullptr, dtype, numel};
    if (numel == 0) return t;
    // 64-byte aligned (a cache line / AVX-512 vector); aligned_alloc wants a multiple of it.
    size_t bytes = (t.bytes() + 63) / 64 * 64;
    t.data = std::aligned_alloc(64, bytes);
    ST_CHECK(t.data, "cpu backend: out of memory allocating ", bytes, " bytes");
    std::memset(t.data, 0, bytes);
    allocated_ += bytes;
    peak_ = std::max(peak_, allocated_);
    return t;
  }
  void free(Tensor& t) override {
    if (t.data) allocated_ -= (t.bytes() + 63) / 64 * 64;
    std::free(t.data);
    t.data = nullptr;
  }
  size_t peak_allocated_bytes() const override { return peak_; }
  void reset_peak_allocated() override { peak_ = allocated_; }
  size_t memory_available_bytes() const override { return host_memory_available_bytes(); }
  std::string memory_available_source() const override { return "host RAM (MemAvailable)"; }
  void zero(Tensor t) override {
    if (!t.empty()) std::memset(t.data, 0, t.bytes());
  }

 protected:
  OpRules op_rules() const override {
    return {{DType::F32, DType::F64}, "the CPU backend computes in f32 or f64", false, 0, ""};
  }
  void check_ids(const char* op, const char* what, Tensor ids, int N, int V, bool has_ignore, int ignore) override {
    check_ids_on_host(ids.as<int32_t>(), N, V, has_ignore, ignore, what, op);
  }

  void do_fill(Tensor t, double value) override {
    for (size_t i = 0; i < t.numel; i++) store(t.data, t.dtype, i, value);
  }
  void do_fill_normal(Tensor t, uint64_t key, uint64_t first, double stddev) override {
    // Each value is a pure function of its index: big tensors split across threads.
    auto run = [&](size_t lo, size_t hi) {
      for (size_t i = lo; i < hi; ++i) {
        const double x = stddev * counter_normal(key, first + i);
        if (t.dtype == DType::F32)
          static_cast<float*>(t.data)[i] = static_cast<float>(x);
        else
          static_cast<double*>(t.data)[i] = x;
      }
    };
    parallel_ranges(t.numel, size_t{1} << 22, run);
  }
  void do_copy(Tensor dst, Tensor src) override {
    if (dst.dtype == src.dtype) {
      std::memmove(dst.data, src.data, src.bytes());
      return;
    }
    for (size_t i = 0; i < src.numel; i++) store(dst.data, dst.dtype, i, load(src.data, src.dtype, i));
  }
  void do_upload(Tensor dst, const void* host) override { std::memcpy(dst.data, host, dst.bytes()); }
  void do_download(void* host, Tensor src) override { std::memcpy(host, src.data, src.bytes()); }

  // ---- element-wise -------------------------------------------------------------

  void do_add(Tensor out, Tensor a, Tensor b, size_t n) override {
    dispatch(out.dtype, [&](auto tag) {
      using T = decltype(tag);
      T* o = out.as<T>();
      const T *x = a.as<T>(), *y = b.as<T>();
      for (size_t i = 0; i < n; i++) o[i] = x[i] + y[i];
    });
  }
  void do_accumulate(Tensor acc, Tensor x, size_t n) override {
    dispatch(acc.dtype, [&](auto tag) {
      using T = decltype(tag);
      T* o = acc.as<T>();
      const T* y = x.as<T>();
      for (size_t i = 0; i < n; i++) o[i] += y[i];
    });
  }
  double do_sum_squares(Tensor x, size_t n) override {
    double s = 0;
    for (size_t i = 0; i < n; i++) {
      double v = load(x.data, x.dtype, i);
      s += v * v;
    }
    return s;
  }

  // ---- embedding ----------------------------------------------------------------

  void do_embedding_forward(Tensor out, Tensor tokens, Tensor wte, int N, int C, int V) override {
    dispatch(wte.dtype, [&](auto tag) {
      using T = decltype(tag);
      cpu::embedding_forward(out.as<T>(), tokens.as<int32_t>(), wte.as<T>(), N, C);
    });
  }
  void do_embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int N, int C, int V) override {
    dispatch(dwte.dtype, [&](auto tag) {
      using T = decltype(tag);
      cpu::embedding_backward(dwte.as<T>(), dout.as<T>(), tokens.as<int32_t>(), N, C);
    });
  }

  // ---- RMSNorm ------------------------------------------------------------------

  void do_rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, int N, int C, float eps) override {
    dispatch(inp.dtype, [&](auto tag) {
      using T = decltype(tag);
      cpu::rmsnorm_forward(out.as<T>(), rstd.as<T>(), inp.as<T>(), weight.as<T>(), N, C, eps);
    });
  }
  void do_rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd, int N,
                           int C) override {
    dispatch(inp.dtype, [&](auto tag) {
      using T = decltype(tag);
      cpu::rmsnorm_backward(dinp.as<T>(), dweight.as<T>(), dout.as<T>(), inp.as<T>(), weight.as<T>(),
                            rstd.as<T>(), N, C);
    });
  }

  // ---- linear -------------------------------------------------------------------

  void do_matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias, int N, int IC, int OC) override {
    dispatch(inp.dtype, [&](auto tag) {
      using T = decltype(tag);
      cpu::matmul_forward(out.as<T>(), inp.as<T>(), weight.as<T>(), ptr<T>(bias), N, IC, OC);
    });
  }
  void do_matmul_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight, int N,
                          int IC, int OC) override {
    dispatch(inp.dtype, [&](auto tag) {
      using T = decltype(tag);
      cpu::matmul_backward(ptr<T>(dinp), ptr<T>(dweight), ptr<T>(dbias), dout.as<T>(), inp.as<T>(),
                           weight.as<T>(), N, IC, OC);
    });
  }

  // ---- FP8, emulated (fp8.h): the GPU's quantization bit for bit, its GEMM up to the
  // order of the fp32 sums -------------------------------------------------------------

  void do_fp8_quantize(Tensor q, Tensor qt, Tensor inv_scale, Tensor x, int rows, int cols, bool reuse_scale,
                       Tensor amax_out) override {
    const Fp8Format f = (q.empty() ? qt.dtype : q.dtype) == DType::F8E4M3 ? Fp8Format::E4M3 : Fp8Format::E5M2;
    const size_t n = size_t(rows) * cols;
    float amax = 0;
    for (size_t i = 0; i < n && (!reuse_scale || !amax_out.empty()); i++)
      amax = fp8_amax_max(amax, std::fabs(float(load(x.data, x.dtype, i))));  // a NaN sticks, as on the GPU
    if (!amax_out.empty()) amax_out.as<float>()[0] = fp8_amax_max(amax_out.as<float>()[0], amax);
    const float s = reuse_scale ? 1.0f / inv_scale.as<float>()[0] : fp8_scale(amax, fp8_spec(f).max_finite);
    for (int r = 0; r < rows; r++)
      for (int c = 0; c < cols; c++) {
        const size_t i = size_t(r) * cols + c;
        const uint8_t b = fp8_encode(float(load(x.data, x.dtype, i)) * s, f);
        if (!q.empty()) q.as<uint8_t>()[i] = b;
        if (!qt.empty()) qt.as<uint8_t>()[size_t(c) * rows + r] = b;
      }
    if (!reuse_scale) inv_scale.as<float>()[0] = 1.0f / s;
  }
  void do_fp8_roll_scales(Tensor inv_scale, int stride, Tensor amax, Tensor history, int n, int len, int pos,
                          Fp8Format format) override {
    float* h = history.as<float>();
    for (int i = 0; i < n; i++) {
      h[size_t(i) * len + pos] = amax.as<float>()[i];
      amax.as<float>()[i] = 0;
      float m = 0;
      for (int j = 0; j < len; j++) m = fp8_amax_max(m, h[size_t(i) * len + j]);
      inv_scale.as<float>()[size_t(i) * stride] = 1.0f / fp8_scale(m, fp8_spec(format).max_finite);
    }
  }
  void do_fp8_transpose(Tensor qt, Tensor q, int rows, int cols) override {
    const uint8_t* in = q.as<uint8_t>();
    uint8_t* out = qt.as<uint8_t>();
    for (int r = 0; r < rows; r++)
      for (int c = 0; c < cols; c++) out[size_t(c) * rows + r] = in[size_t(r) * cols + c];
  }
  // fast_accum is the tensor cores' choice: the emulation accumulates exactly either way.
  void do_matmul_fp8(Tensor out, Tensor a, Tensor a_inv, Tensor b, Tensor b_inv, Tensor bias, int M, int K, int N,
                     bool accumulate, bool /*fast_accum*/) override {
    dispatch(out.dtype, [&](auto tag) {
      using T = decltype(tag);
      std::vector<T> ad(size_t(M) * K), bd(size_t(N) * K), prod(size_t(M) * N);
      for (size_t i = 0; i < ad.size(); i++) ad[i] = T(load(a.data, a.dtype, i));
      for (size_t i = 0; i < bd.size(); i++) bd[i] = T(load(b.data, b.dtype, i));
      cpu::matmul_forward<T>(prod.data(), ad.data(), bd.data(), nullptr, M, K, N);
      const T scale = T(a_inv.as<float>()[0]) * T(b_inv.as<float>()[0]);
      T* o = out.as<T>();
      for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) {
          const size_t i = size_t(r) * N + c;
          const T v = prod[i] * scale;
          o[i] = accumulate ? o[i] + v : (bias.empty() ? v : v + bias.as<T>()[c]);
        }
    });
  }

  // ---- RoPE and attention ---------------------------------------------------------

  void do_rope(Tensor qkv, int B, int T, int H, int KV, int hd, float theta, int sign) override {
    dispatch(qkv.dtype, [&](auto tag) {
      using S = decltype(tag);
      cpu::rope(qkv.as<S>(), B, T, H, KV, hd, theta, sign);
    });
  }
  void do_attention_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int H, int KV, int hd) override {
    dispatch(qkv.dtype, [&](auto tag) {
      using S = decltype(tag);
      cpu::attention_forward(out.as<S>(), lse.as<S>(), qkv.as<S>(), B, T, H, KV, hd);
    });
  }
  void do_attention_backward(Tensor dqkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv, int B, int T, int H,
                             int KV, int hd) override {
    dispatch(qkv.dtype, [&](auto tag) {
      using S = decltype(tag);
      cpu::attention_backward(dqkv.as<S>(), dout.as<S>(), out.as<S>(), lse.as<S>(), qkv.as<S>(), B, T, H,
                              KV, hd);
    });
  }

  // ---- SwiGLU -------------------------------------------------------------------

  void do_swiglu_forward(Tensor out, Tensor gu, int N, int F) override {
    dispatch(gu.dtype, [&](auto tag) {
      using T = decltype(tag);
      cpu::swiglu_forward(out.as<T>(), gu.as<T>(), N, F);
    });
  }
  void do_swiglu_backward(Tensor dgu, Tensor dout, Tensor gu, int N, int F) override {
    dispatch(gu.dtype, [&](auto tag) {
      using T = decltype(tag);
      cpu::swiglu_backward(dgu.as<T>(), dout.as<T>(), gu.as<T>(), N, F);
    });
  }

  // ---- cross-entropy --------------------------------------------------------------

  void do_cross_entropy(Tensor losses, Tensor logits, Tensor targets, int N, int V, int ignore_index,
                        float dloss_scale, bool grad) override {
    dispatch(logits.dtype, [&](auto tag) {
      using T = decltype(tag);
      cpu::cross_entropy(losses.as<T>(), logits.as<T>(), targets.as<int32_t>(), N, V, ignore_index,
                         dloss_scale, grad);
    });
  }

  // ---- AdamW ----------------------------------------------------------------------

  void do_adamw(Tensor param, Tensor grad, Tensor m, Tensor v, size_t n, const AdamWParams& p) override {
    const bool p16 = param.dtype == DType::BF16, s16 = m.dtype == DType::BF16;
    if (!p16 && !s16) cpu::adamw(param.as<float>(), grad.as<float>(), m.as<float>(), v.as<float>(), n, p);
    else if (!p16) cpu::adamw(param.as<float>(), grad.as<float>(), m.as<uint16_t>(), v.as<uint16_t>(), n, p);
    else if (!s16) cpu::adamw(param.as<uint16_t>(), grad.as<float>(), m.as<float>(), v.as<float>(), n, p);
    else cpu::adamw(param.as<uint16_t>(), grad.as<float>(), m.as<uint16_t>(), v.as<uint16_t>(), n, p);
  }

 private:
  size_t allocated_ = 0, peak_ = 0;  // bytes held by alloc(), and the most at once
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace st

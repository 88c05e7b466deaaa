// The CPU reference backend: argument checks, dtype dispatch and memory ops.
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
#include "core/memory.h"
#include "core/parallel.h"
#include "core/rng.h"

namespace st {
namespace {

// ---- argument checks ------------------------------------------------------------

// The activation dtype of an op, taken from its first float argument: F32 or F64.
DType act_dtype(const char* op, const char* name, Tensor t) {
  ST_CHECK(t.dtype == DType::F32 || t.dtype == DType::F64, op, ": ", name, " is ", dtype_name(t.dtype),
           "; the CPU backend computes in f32 or f64");
  return t.dtype;
}

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
  void fill(Tensor t, double value) override {
    ST_CHECK(!t.empty() || t.numel == 0, "fill: empty tensor of ", t.numel, " elements");
    for (size_t i = 0; i < t.numel; i++) store(t.data, t.dtype, i, value);
  }
  void fill_normal(Tensor t, uint64_t key, uint64_t first, double stddev) override {
    ST_CHECK(t.dtype == DType::F32 || t.dtype == DType::F64, "fill_normal: ", dtype_name(t.dtype),
             " tensors are not supported (F32, F64)");
    ST_CHECK(!t.empty() || t.numel == 0, "fill_normal: empty tensor of ", t.numel, " elements");
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
  void copy(Tensor dst, Tensor src) override {
    ST_CHECK(dst.numel == src.numel, "copy: dst has ", dst.numel, " elements, src ", src.numel);
    if (dst.numel == 0) return;
    ST_CHECK(!dst.empty() && !src.empty(), "copy: empty tensor");
    if (dst.dtype == src.dtype) {
      std::memmove(dst.data, src.data, src.bytes());
      return;
    }
    for (size_t i = 0; i < src.numel; i++) store(dst.data, dst.dtype, i, load(src.data, src.dtype, i));
  }
  void upload(Tensor dst, const void* host) override {
    ST_CHECK(!dst.empty() || dst.numel == 0, "upload: empty tensor of ", dst.numel, " elements");
    if (dst.numel) std::memcpy(dst.data, host, dst.bytes());
  }
  void download(void* host, Tensor src) override {
    ST_CHECK(!src.empty() || src.numel == 0, "download: empty tensor of ", src.numel, " elements");
    if (src.numel) std::memcpy(host, src.data, src.bytes());
  }

  // ---- element-wise -------------------------------------------------------------

  void add(Tensor out, Tensor a, Tensor b, size_t n) override {
    DType dt = act_dtype("add", "out", out);
    check_buf("add", "out", out, dt, n);
    check_buf("add", "a", a, dt, n);
    check_buf("add", "b", b, dt, n);
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      T* o = out.as<T>();
      const T *x = a.as<T>(), *y = b.as<T>();
      for (size_t i = 0; i < n; i++) o[i] = x[i] + y[i];
    });
  }
  void accumulate(Tensor acc, Tensor x, size_t n) override {
    DType dt = act_dtype("accumulate", "acc", acc);
    check_buf("accumulate", "acc", acc, dt, n);
    check_buf("accumulate", "x", x, dt, n);
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      T* o = acc.as<T>();
      const T* y = x.as<T>();
      for (size_t i = 0; i < n; i++) o[i] += y[i];
    });
  }
  double sum_squares(Tensor x, size_t n) override {
    ST_CHECK(x.numel >= n, "sum_squares: x holds ", x.numel, " elements, needs ", n);
    double s = 0;
    for (size_t i = 0; i < n; i++) {
      double v = load(x.data, x.dtype, i);
      s += v * v;
    }
    return s;
  }

  // ---- embedding ----------------------------------------------------------------

  void embedding_forward(Tensor out, Tensor tokens, Tensor wte, int N, int C, int V) override {
    const char* op = "embedding_forward";
    check_dim(op, "N", N), check_dim(op, "C", C), check_dim(op, "V", V);
    DType dt = act_dtype(op, "wte", wte);
    check_buf(op, "out", out, dt, size_t(N) * C);
    check_buf(op, "tokens", tokens, DType::I32, N);
    check_buf(op, "wte", wte, dt, size_t(V) * C);
    check_ids_on_host(tokens.as<int32_t>(), N, V, false, 0, "token id", op);
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      cpu::embedding_forward(out.as<T>(), tokens.as<int32_t>(), wte.as<T>(), N, C);
    });
  }
  void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int N, int C, int V) override {
    const char* op = "embedding_backward";
    check_dim(op, "N", N), check_dim(op, "C", C), check_dim(op, "V", V);
    DType dt = act_dtype(op, "dwte", dwte);
    check_buf(op, "dwte", dwte, dt, size_t(V) * C);
    check_buf(op, "dout", dout, dt, size_t(N) * C);
    check_buf(op, "tokens", tokens, DType::I32, N);
    check_ids_on_host(tokens.as<int32_t>(), N, V, false, 0, "token id", op);
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      cpu::embedding_backward(dwte.as<T>(), dout.as<T>(), tokens.as<int32_t>(), N, C);
    });
  }

  // ---- RMSNorm ------------------------------------------------------------------

  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, int N, int C, float eps) override {
    const char* op = "rmsnorm_forward";
    check_dim(op, "N", N), check_dim(op, "C", C);
    DType dt = act_dtype(op, "inp", inp);
    check_buf(op, "out", out, dt, size_t(N) * C);
    check_buf(op, "rstd", rstd, dt, N);
    check_buf(op, "inp", inp, dt, size_t(N) * C);
    check_buf(op, "weight", weight, dt, C);
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      cpu::rmsnorm_forward(out.as<T>(), rstd.as<T>(), inp.as<T>(), weight.as<T>(), N, C, eps);
    });
  }
  void rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd,
                        int N, int C) override {
    const char* op = "rmsnorm_backward";
    check_dim(op, "N", N), check_dim(op, "C", C);
    DType dt = act_dtype(op, "inp", inp);
    check_buf(op, "dinp", dinp, dt, size_t(N) * C);
    check_buf(op, "dweight", dweight, dt, C);
    check_buf(op, "dout", dout, dt, size_t(N) * C);
    check_buf(op, "inp", inp, dt, size_t(N) * C);
    check_buf(op, "weight", weight, dt, C);
    check_buf(op, "rstd", rstd, dt, N);
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      cpu::rmsnorm_backward(dinp.as<T>(), dweight.as<T>(), dout.as<T>(), inp.as<T>(), weight.as<T>(),
                            rstd.as<T>(), N, C);
    });
  }

  // ---- linear -------------------------------------------------------------------

  void matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias, int N, int IC, int OC) override {
    const char* op = "matmul_forward";
    check_dim(op, "N", N), check_dim(op, "IC", IC), check_dim(op, "OC", OC);
    DType dt = act_dtype(op, "inp", inp);
    check_buf(op, "out", out, dt, size_t(N) * OC);
    check_buf(op, "inp", inp, dt, size_t(N) * IC);
    check_buf(op, "weight", weight, dt, size_t(OC) * IC);
    if (!bias.empty()) check_buf(op, "bias", bias, dt, OC);
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      cpu::matmul_forward(out.as<T>(), inp.as<T>(), weight.as<T>(), ptr<T>(bias), N, IC, OC);
    });
  }
  void matmul_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                       int N, int IC, int OC) override {
    const char* op = "matmul_backward";
    check_dim(op, "N", N), check_dim(op, "IC", IC), check_dim(op, "OC", OC);
    DType dt = act_dtype(op, "inp", inp);
    if (!dinp.empty()) check_buf(op, "dinp", dinp, dt, size_t(N) * IC);
    // dweight may be empty too (a frozen weight): the contract only says so for
    // dinp and dbias, but skipping is the only sensible reading of an empty buffer.
    if (!dweight.empty()) check_buf(op, "dweight", dweight, dt, size_t(OC) * IC);
    if (!dbias.empty()) check_buf(op, "dbias", dbias, dt, OC);
    check_buf(op, "dout", dout, dt, size_t(N) * OC);
    check_buf(op, "inp", inp, dt, size_t(N) * IC);
    check_buf(op, "weight", weight, dt, size_t(OC) * IC);
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      cpu::matmul_backward(ptr<T>(dinp), ptr<T>(dweight), ptr<T>(dbias), dout.as<T>(), inp.as<T>(),
                           weight.as<T>(), N, IC, OC);
    });
  }

  // ---- RoPE and attention ---------------------------------------------------------

  void rope_forward(Tensor qkv, int B, int T, int H, int KV, int hd, float theta) override {
    rope("rope_forward", qkv, B, T, H, KV, hd, theta, +1);
  }
  void rope_backward(Tensor dqkv, int B, int T, int H, int KV, int hd, float theta) override {
    rope("rope_backward", dqkv, B, T, H, KV, hd, theta, -1);
  }

  void attention_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int H, int KV, int hd) override {
    const char* op = "attention_forward";
    check_heads(op, B, T, H, KV, hd);
    DType dt = act_dtype(op, "qkv", qkv);
    const size_t rows = size_t(B) * T;
    check_buf(op, "out", out, dt, rows * H * hd);
    check_buf(op, "lse", lse, dt, rows * H);
    check_buf(op, "qkv", qkv, dt, rows * (H + 2 * KV) * hd);
    dispatch(dt, [&](auto tag) {
      using S = decltype(tag);
      cpu::attention_forward(out.as<S>(), lse.as<S>(), qkv.as<S>(), B, T, H, KV, hd);
    });
  }
  void attention_backward(Tensor dqkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv, int B, int T, int H,
                          int KV, int hd) override {
    const char* op = "attention_backward";
    check_heads(op, B, T, H, KV, hd);
    DType dt = act_dtype(op, "qkv", qkv);
    const size_t rows = size_t(B) * T;
    check_buf(op, "dqkv", dqkv, dt, rows * (H + 2 * KV) * hd);
    check_buf(op, "dout", dout, dt, rows * H * hd);
    check_buf(op, "out", out, dt, rows * H * hd);
    check_buf(op, "lse", lse, dt, rows * H);
    check_buf(op, "qkv", qkv, dt, rows * (H + 2 * KV) * hd);
    dispatch(dt, [&](auto tag) {
      using S = decltype(tag);
      cpu::attention_backward(dqkv.as<S>(), dout.as<S>(), out.as<S>(), lse.as<S>(), qkv.as<S>(), B, T, H,
                              KV, hd);
    });
  }

  // ---- SwiGLU -------------------------------------------------------------------

  void swiglu_forward(Tensor out, Tensor gu, int N, int F) override {
    const char* op = "swiglu_forward";
    check_dim(op, "N", N), check_dim(op, "F", F);
    DType dt = act_dtype(op, "gu", gu);
    check_buf(op, "out", out, dt, size_t(N) * F);
    check_buf(op, "gu", gu, dt, size_t(N) * 2 * F);
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      cpu::swiglu_forward(out.as<T>(), gu.as<T>(), N, F);
    });
  }
  void swiglu_backward(Tensor dgu, Tensor dout, Tensor gu, int N, int F) override {
    const char* op = "swiglu_backward";
    check_dim(op, "N", N), check_dim(op, "F", F);
    DType dt = act_dtype(op, "gu", gu);
    check_buf(op, "dgu", dgu, dt, size_t(N) * 2 * F);
    check_buf(op, "dout", dout, dt, size_t(N) * F);
    check_buf(op, "gu", gu, dt, size_t(N) * 2 * F);
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      cpu::swiglu_backward(dgu.as<T>(), dout.as<T>(), gu.as<T>(), N, F);
    });
  }

  // ---- cross-entropy --------------------------------------------------------------

  void cross_entropy(Tensor losses, Tensor logits, Tensor targets, int N, int V, int ignore_index,
                     float dloss_scale, bool grad) override {
    const char* op = "cross_entropy";
    check_dim(op, "N", N), check_dim(op, "V", V);
    DType dt = act_dtype(op, "logits", logits);
    check_buf(op, "losses", losses, dt, N);
    check_buf(op, "logits", logits, dt, size_t(N) * V);
    check_buf(op, "targets", targets, DType::I32, N);
    check_ids_on_host(targets.as<int32_t>(), N, V, true, ignore_index, "target", op);
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      cpu::cross_entropy(losses.as<T>(), logits.as<T>(), targets.as<int32_t>(), N, V, ignore_index,
                         dloss_scale, grad);
    });
  }

  // ---- AdamW ----------------------------------------------------------------------

  void adamw(Tensor param, Tensor grad, Tensor m, Tensor v, size_t n, const AdamWParams& p) override {
    const char* op = "adamw";
    if (n == 0) return;
    check_buf(op, "param", param, DType::F32, n);
    check_buf(op, "grad", grad, DType::F32, n);
    check_buf(op, "m", m, DType::F32, n);
    check_buf(op, "v", v, DType::F32, n);
    ST_CHECK(p.step >= 1, op, ": step is 1-based, got ", p.step);
    cpu::adamw(param.as<float>(), grad.as<float>(), m.as<float>(), v.as<float>(), n, p);
  }

 private:
  size_t allocated_ = 0, peak_ = 0;  // bytes held by alloc(), and the most at once

  static void check_heads(const char* op, int B, int T, int H, int KV, int hd) {
    check_dim(op, "B", B), check_dim(op, "T", T), check_dim(op, "H", H), check_dim(op, "KV", KV),
        check_dim(op, "hd", hd);
    ST_CHECK(H % KV == 0, op, ": H=", H, " is not a multiple of KV=", KV);
  }

  void rope(const char* op, Tensor qkv, int B, int T, int H, int KV, int hd, float theta, int sign) {
    check_heads(op, B, T, H, KV, hd);
    ST_CHECK(hd % 2 == 0, op, ": head_dim ", hd, " must be even");
    ST_CHECK(theta > 0, op, ": theta must be positive, got ", theta);
    DType dt = act_dtype(op, "qkv", qkv);
    check_buf(op, "qkv", qkv, dt, size_t(B) * T * (H + 2 * KV) * hd);
    dispatch(dt, [&](auto tag) {
      using S = decltype(tag);
      cpu::rope(qkv.as<S>(), B, T, H, KV, hd, theta, sign);
    });
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace st

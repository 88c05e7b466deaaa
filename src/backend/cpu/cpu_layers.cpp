// Row-wise layers of the CPU reference: embedding, RMSNorm, linear (OpenBLAS),
// SwiGLU, fused cross-entropy and AdamW. Shapes in comments; N rows, row-major.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/stochastic_round.h"

namespace st::cpu {
namespace {

// C (M,N) = alpha * op(A) · op(B) + beta * C, row-major.
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const double* A, int lda,
          const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, 1.0, A, lda, B, ldb, beta, C, ldc);
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

// ---- embedding ----------------------------------------------------------------

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int N, int C) {
  for (int r = 0; r < N; r++) {  // out[r] (C) = wte[tokens[r]] (C)
    std::copy_n(wte + size_t(tokens[r]) * C, C, out + size_t(r) * C);
  }
}

template <class T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int N, int C) {
  // Sequential scatter-add: repeated tokens simply add up, deterministically.
  for (int r = 0; r < N; r++) {
    T* dst = dwte + size_t(tokens[r]) * C;
    const T* src = dout + size_t(r) * C;
    for (int c = 0; c < C; c++) dst[c] += src[c];
  }
}

// ---- RMSNorm ------------------------------------------------------------------

template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int N, int C, double eps) {
  for (int r = 0; r < N; r++) {
    const T* x = inp + size_t(r) * C;  // (C)
    T* y = out + size_t(r) * C;        // (C)
    double ss = 0;
    for (int c = 0; c < C; c++) ss += double(x[c]) * x[c];
    double rs = 1.0 / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; c++) y[c] = T(double(x[c]) * rs * weight[c]);
    rstd[r] = T(rs);
  }
}

template <class T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const T* rstd, int N,
                      int C) {
  // With xh = x*rs and y = xh*w:  dw += dy*xh,  dx = rs * (g - xh * mean(g*xh)), g = dy*w.
  std::vector<double> dw(C, 0.0);  // (C) accumulated over rows in double, added once
  for (int r = 0; r < N; r++) {
    const T* x = inp + size_t(r) * C;
    const T* dy = dout + size_t(r) * C;
    T* dx = dinp + size_t(r) * C;
    double rs = rstd[r];
    double dot = 0;  // Σ g * xh
    for (int c = 0; c < C; c++) dot += double(dy[c]) * weight[c] * (x[c] * rs);
    double mean = dot / C;
    for (int c = 0; c < C; c++) {
      double xh = x[c] * rs;
      dw[c] += double(dy[c]) * xh;
      dx[c] += T(rs * (double(dy[c]) * weight[c] - xh * mean));
    }
  }
  for (int c = 0; c < C; c++) dweight[c] += T(dw[c]);
}

// ---- linear (HF layout: weight (OC, IC)) --------------------------------------

template <class T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int IC, int OC) {
  // out (N,OC) = inp (N,IC) · weight (OC,IC)ᵀ
  gemm(CblasNoTrans, CblasTrans, N, OC, IC, inp, IC, weight, IC, T(0), out, OC);
  if (bias) {
    for (int r = 0; r < N; r++)
      for (int o = 0; o < OC; o++) out[size_t(r) * OC + o] += bias[o];
  }
}

template <class T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int N,
                     int IC, int OC) {
  // dinp (N,IC) = dout (N,OC) · weight (OC,IC)
  if (dinp) gemm(CblasNoTrans, CblasNoTrans, N, IC, OC, dout, OC, weight, IC, T(0), dinp, IC);
  // dweight (OC,IC) += dout (N,OC)ᵀ · inp (N,IC)
  if (dweight) gemm(CblasTrans, CblasNoTrans, OC, IC, N, dout, OC, inp, IC, T(1), dweight, IC);
  if (dbias) {  // dbias (OC) += Σ_rows dout
    std::vector<double> db(OC, 0.0);
    for (int r = 0; r < N; r++)
      for (int o = 0; o < OC; o++) db[o] += dout[size_t(r) * OC + o];
    for (int o = 0; o < OC; o++) dbias[o] += T(db[o]);
  }
}

// ---- SwiGLU -------------------------------------------------------------------

template <class T>
void swiglu_forward(T* out, const T* gu, int N, int F) {
  for (int r = 0; r < N; r++) {
    const T* g = gu + size_t(r) * 2 * F;  // (F)
    const T* u = g + F;                   // (F)
    T* y = out + size_t(r) * F;           // (F)
    for (int i = 0; i < F; i++) y[i] = T(g[i] * sigmoid(g[i]) * u[i]);
  }
}

template <class T>
void swiglu_backward(T* dgu, const T* dout, const T* gu, int N, int F) {
  // silu'(g) = s * (1 + g * (1 - s)), s = sigmoid(g)
  for (int r = 0; r < N; r++) {
    const T* g = gu + size_t(r) * 2 * F;
    const T* u = g + F;
    const T* dy = dout + size_t(r) * F;
    T* dg = dgu + size_t(r) * 2 * F;
    T* du = dg + F;
    for (int i = 0; i < F; i++) {
      double s = sigmoid(g[i]);
      dg[i] = T(double(dy[i]) * u[i] * s * (1.0 + g[i] * (1.0 - s)));
      du[i] = T(double(dy[i]) * g[i] * s);
    }
  }
}

// ---- cross-entropy --------------------------------------------------------------

template <class T>
void cross_entropy(T* losses, T* logits, const int32_t* targets, int N, int V, int ignore_index,
                   double dloss_scale, bool grad) {
  for (int r = 0; r < N; r++) {
    T* x = logits + size_t(r) * V;  // (V)
    int tgt = targets[r];
    if (tgt == ignore_index) {
      losses[r] = T(0);
      if (grad) std::fill_n(x, V, T(0));
      continue;
    }
    // Stable log-sum-exp: subtract the row max before exponentiating.
    double mx = x[0];
    for (int i = 1; i < V; i++) mx = std::max(mx, double(x[i]));
    double sum = 0;
    for (int i = 0; i < V; i++) sum += std::exp(x[i] - mx);
    double lse = mx + std::log(sum);
    losses[r] = T(lse - x[tgt]);
    if (grad) {
      for (int i = 0; i < V; i++) {
        double p = std::exp(x[i] - lse);
        x[i] = T(dloss_scale * (p - (i == tgt ? 1.0 : 0.0)));
      }
    }
  }
}

// ---- AdamW ----------------------------------------------------------------------

namespace {

// A stored value read as float, and a float stored: f32 as is, bf16 (its bits in a
// uint16_t) rounded stochastically with `r`'s low 16 bits.
inline float load_value(float x) { return x; }
inline float load_value(uint16_t x) { return bf16_to_f32(x); }
inline void store_value(float& dst, float x, uint32_t) { dst = x; }
inline void store_value(uint16_t& dst, float x, uint32_t r) { dst = bf16_bits_stochastic(x, r); }

}  // namespace

template <class P, class S>
void adamw(P* param, const float* grad, S* m, S* v, size_t n, const AdamWParams& p) {
  const double b1 = p.beta1, b2 = p.beta2, lr = p.lr;
  const double bc1 = 1.0 - std::pow(b1, p.step);
  const double bc2 = 1.0 - std::pow(b2, p.step);
  const double decay = 1.0 - lr * p.weight_decay;
  constexpr bool rounds = sizeof(P) == 2 || sizeof(S) == 2;
  for (size_t i = 0; i < n; i++) {
    const uint64_t r = rounds ? adamw_round_bits(p.round_key, p.round_index + i) : 0;
    double g = double(grad[i]) * p.grad_scale;
    // m and v are stored (f32, or bf16 rounded stochastically); the update reads the
    // stored values, as torch does.
    store_value(m[i], float(b1 * load_value(m[i]) + (1.0 - b1) * g), uint32_t(r >> 16));
    store_value(v[i], float(b2 * load_value(v[i]) + (1.0 - b2) * g * g), uint32_t(r >> 32));
    double mhat = load_value(m[i]) / bc1, vhat = load_value(v[i]) / bc2;
    // torch.optim.AdamW order: decoupled decay on the old parameter, then the Adam step.
    double x = double(load_value(param[i])) * decay;
    store_value(param[i], float(x - lr * mhat / (std::sqrt(vhat) + p.eps)), uint32_t(r));
  }
}
template void adamw<float, float>(float*, const float*, float*, float*, size_t, const AdamWParams&);
template void adamw<float, uint16_t>(float*, const float*, uint16_t*, uint16_t*, size_t, const AdamWParams&);
template void adamw<uint16_t, float>(uint16_t*, const float*, float*, float*, size_t, const AdamWParams&);
template void adamw<uint16_t, uint16_t>(uint16_t*, const float*, uint16_t*, uint16_t*, size_t, const AdamWParams&);

// ---- instantiations ------------------------------------------------------------

#define ST_CPU_LAYERS(T)                                                                       \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int, int);                  \
  template void embedding_backward<T>(T*, const T*, const int32_t*, int, int);                 \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int, int, double);              \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int, int); \
  template void matmul_forward<T>(T*, const T*, const T*, const T*, int, int, int);            \
  template void matmul_backward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, int);   \
  template void swiglu_forward<T>(T*, const T*, int, int);                                     \
  template void swiglu_backward<T>(T*, const T*, const T*, int, int);                          \
  template void cross_entropy<T>(T*, T*, const int32_t*, int, int, int, double, bool);
ST_CPU_LAYERS(float)
ST_CPU_LAYERS(double)
#undef ST_CPU_LAYERS

}  // namespace st::cpu

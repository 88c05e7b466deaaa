// RoPE and causal grouped-query attention of the CPU reference.
// qkv rows are [q (H*hd) | k (KV*hd) | v (KV*hd)]; row r = b*T + t.
// Attention keeps at most one score row (length T) per (b, h, t) and recomputes
// probabilities in the backward from the saved log-sum-exp, like flash attention,
// so memory stays O(T) per head rather than O(T²).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_kernels.h"

namespace st::cpu {
namespace {

template <class A, class B>
double dot(const A* a, const B* b, int n) {
  double s = 0;
  for (int i = 0; i < n; i++) s += double(a[i]) * double(b[i]);
  return s;
}

// Pointers into one fused qkv row set: q of (row, head h), k / v of (row, kv head g).
struct QkvLayout {
  int H, KV, hd;
  size_t row_len() const { return size_t(H + 2 * KV) * hd; }
  size_t q(size_t row, int h) const { return row * row_len() + size_t(h) * hd; }
  size_t k(size_t row, int g) const { return row * row_len() + size_t(H + g) * hd; }
  size_t v(size_t row, int g) const { return row * row_len() + size_t(H + KV + g) * hd; }
};

}  // namespace

// ---- RoPE ---------------------------------------------------------------------

template <class T>
void rope(T* qkv, int B, int T_, int H, int KV, int hd, double theta, int sign) {
  const int half = hd / 2;
  std::vector<double> inv_freq(half), cs(half), sn(half);  // (hd/2) each
  for (int i = 0; i < half; i++) inv_freq[i] = std::pow(theta, -2.0 * i / hd);
  const size_t row_len = size_t(H + 2 * KV) * hd;
  for (size_t r = 0; r < size_t(B) * T_; r++) {
    const double t = double(r % T_);
    for (int i = 0; i < half; i++) {
      double angle = t * inv_freq[i];
      cs[i] = std::cos(angle);
      sn[i] = sign * std::sin(angle);
    }
    // q heads and k heads are adjacent in the row, so H + KV heads from offset 0.
    T* row = qkv + r * row_len;
    for (int head = 0; head < H + KV; head++) {
      T* x = row + size_t(head) * hd;
      for (int i = 0; i < half; i++) {
        double x1 = x[i], x2 = x[i + half];
        x[i] = T(x1 * cs[i] - x2 * sn[i]);
        x[i + half] = T(x2 * cs[i] + x1 * sn[i]);
      }
    }
  }
}

// ---- attention forward ----------------------------------------------------------

template <class T>
void attention_forward(T* out, T* lse, const T* qkv, int B, int T_, int H, int KV, int hd) {
  const QkvLayout L{H, KV, hd};
  const double scale = 1.0 / std::sqrt(double(hd));
  const int group = H / KV;       // query heads per kv head
  std::vector<double> score(T_);  // (T) one score row
  std::vector<double> acc(hd);    // (hd) output row accumulator
  for (int b = 0; b < B; b++) {
    const size_t row0 = size_t(b) * T_;
    for (int h = 0; h < H; h++) {
      const int g = h / group;
      for (int t = 0; t < T_; t++) {
        const T* q = qkv + L.q(row0 + t, h);
        double mx = -INFINITY;
        for (int s = 0; s <= t; s++) {  // causal: keys 0..t
          score[s] = scale * dot(q, qkv + L.k(row0 + s, g), hd);
          mx = std::max(mx, score[s]);
        }
        double sum = 0;
        for (int s = 0; s <= t; s++) sum += std::exp(score[s] - mx);
        const double l = mx + std::log(sum);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int s = 0; s <= t; s++) {
          const double p = std::exp(score[s] - l);
          const T* v = qkv + L.v(row0 + s, g);
          for (int i = 0; i < hd; i++) acc[i] += p * v[i];
        }
        T* o = out + (row0 + t) * size_t(H) * hd + size_t(h) * hd;  // (hd)
        for (int i = 0; i < hd; i++) o[i] = T(acc[i]);
        lse[(size_t(b) * H + h) * T_ + t] = T(l);
      }
    }
  }
}

// ---- attention backward ---------------------------------------------------------

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* out, const T* lse, const T* qkv, int B, int T_,
                        int H, int KV, int hd) {
  // Per query row: p_s = exp(scale q·k_s - lse), dp_s = dout·v_s, D = dout·out = Σ p_s dp_s,
  // ds_s = p_s (dp_s - D);  dq = scale Σ ds_s k_s,  dk_s += scale ds_s q,  dv_s += p_s dout.
  const QkvLayout L{H, KV, hd};
  const double scale = 1.0 / std::sqrt(double(hd));
  const int group = H / KV;
  const size_t kv_len = size_t(KV) * hd;
  std::vector<double> dq(hd);                   // (hd)
  std::vector<double> dk(size_t(T_) * kv_len);  // (T, KV*hd) of one sequence
  std::vector<double> dv(size_t(T_) * kv_len);  // (T, KV*hd)
  for (int b = 0; b < B; b++) {
    const size_t row0 = size_t(b) * T_;
    std::fill(dk.begin(), dk.end(), 0.0);
    std::fill(dv.begin(), dv.end(), 0.0);
    for (int h = 0; h < H; h++) {
      const int g = h / group;
      for (int t = 0; t < T_; t++) {
        const size_t o_off = (row0 + t) * size_t(H) * hd + size_t(h) * hd;
        const T* q = qkv + L.q(row0 + t, h);
        const T* dy = dout + o_off;
        const double D = dot(dy, out + o_off, hd);
        const double l = lse[(size_t(b) * H + h) * T_ + t];
        std::fill(dq.begin(), dq.end(), 0.0);
        for (int s = 0; s <= t; s++) {
          const T* k = qkv + L.k(row0 + s, g);
          const T* v = qkv + L.v(row0 + s, g);
          const double p = std::exp(scale * dot(q, k, hd) - l);
          const double ds = p * (dot(dy, v, hd) - D);
          double* dks = dk.data() + size_t(s) * kv_len + size_t(g) * hd;
          double* dvs = dv.data() + size_t(s) * kv_len + size_t(g) * hd;
          for (int i = 0; i < hd; i++) {
            dq[i] += scale * ds * k[i];
            dks[i] += scale * ds * q[i];
            dvs[i] += p * dy[i];
          }
        }
        T* dqr = dqkv + L.q(row0 + t, h);
        for (int i = 0; i < hd; i++) dqr[i] = T(dq[i]);
      }
    }
    for (int s = 0; s < T_; s++) {
      T* dkr = dqkv + L.k(row0 + s, 0);  // k part of the row, all kv heads (KV*hd)
      T* dvr = dqkv + L.v(row0 + s, 0);
      for (size_t i = 0; i < kv_len; i++) {
        dkr[i] = T(dk[size_t(s) * kv_len + i]);
        dvr[i] = T(dv[size_t(s) * kv_len + i]);
      }
    }
  }
}

// ---- instantiations ------------------------------------------------------------

#define ST_CPU_ATTENTION(T)                                                      \
  template void rope<T>(T*, int, int, int, int, int, double, int);               \
  template void attention_forward<T>(T*, T*, const T*, int, int, int, int, int); \
  template void attention_backward<T>(T*, const T*, const T*, const T*, const T*, int, int, int, int, int);
ST_CPU_ATTENTION(float)
ST_CPU_ATTENTION(double)
#undef ST_CPU_ATTENTION

}  // namespace st::cpu

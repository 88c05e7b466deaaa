// Rotary position embedding (Hugging Face rotate_half), in place on the q and k
// heads of qkv. One thread per (row, frequency i): it computes the angle once, in
// double precision like the CPU reference (pos * theta^(-2i/hd) reaches ~1e5 rad at
// long positions, where a float angle would be off by ~1e-2), then rotates the
// pair (i, i + hd/2) of every q and k head of its row. With 16-byte aligned rows a
// thread takes P = 16 / sizeof(T) consecutive frequencies and moves whole packs.
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/cuda_check.h"

namespace st::cuda {
namespace {

constexpr unsigned kThreads = 256;

// qkv (B*T, (H + 2KV) * hd); heads [0, H + KV) are q then k, adjacent in the row.
// Scalar path: one thread per (row, i).
template <class T>
__global__ void rope_kernel(T* qkv, int T_, int heads, size_t row_len, int hd, double theta, int sign,
                            size_t total) {
  const int half = hd / 2;
  for (size_t idx = global_thread(); idx < total; idx += grid_threads()) {
    const size_t r = idx / half;
    const int i = int(idx % half);
    const double angle = double(r % T_) * pow(theta, -2.0 * i / hd);
    double sn, cs;
    sincos(angle, &sn, &cs);
    const float c = float(cs), s = float(sign * sn);
    T* row = qkv + r * row_len;
    for (int head = 0; head < heads; ++head) {
      T* x = row + size_t(head) * hd;
      const float x1 = to_float(x[i]), x2 = to_float(x[i + half]);
      x[i] = from_float<T>(x1 * c - x2 * s);
      x[i + half] = from_float<T>(x2 * c + x1 * s);
    }
  }
}

// Rotates the pack pair (x1, x2) by (c, s) element-wise, as rope_kernel does.
template <class T>
__device__ __forceinline__ void rotate(Pack<T>& x1, Pack<T>& x2, const float* c, const float* s) {
#pragma unroll
  for (int e = 0; e < kPack<T>; ++e) {
    const float a = to_float(x1.v[e]), b = to_float(x2.v[e]);
    x1.v[e] = from_float<T>(a * c[e] - b * s[e]);
    x2.v[e] = from_float<T>(b * c[e] + a * s[e]);
  }
}

// The same in 16-byte packs: one thread per (row, pack of P frequencies i0..i0+P-1),
// so (hd / 2) % P == 0 and qkv is 16-byte aligned (then every head's halves start on
// a 16-byte boundary). The angles are the scalar path's, bit for bit; two heads per
// step so that four loads are in flight before the stores.
template <class T>
__global__ void rope_vec_kernel(T* qkv, int T_, int heads, size_t row_len, int hd, double theta, int sign,
                                size_t total) {
  constexpr int P = kPack<T>;
  const int half = hd / 2, row_packs = half / P;
  for (size_t idx = global_thread(); idx < total; idx += grid_threads()) {
    const size_t r = idx / row_packs;
    const int i0 = int(idx % row_packs) * P;
    const double pos = double(r % T_);
    float c[P], s[P];
#pragma unroll
    for (int e = 0; e < P; ++e) {
      const double angle = pos * pow(theta, -2.0 * (i0 + e) / hd);
      double sn, cs;
      sincos(angle, &sn, &cs);
      c[e] = float(cs), s[e] = float(sign * sn);
    }
    T* row = qkv + r * row_len + i0;
    int head = 0;
    for (; head + 1 < heads; head += 2) {
      T* x = row + size_t(head) * hd;
      T* y = x + hd;
      Pack<T> x1 = load_pack(x), x2 = load_pack(x + half), y1 = load_pack(y), y2 = load_pack(y + half);
      rotate(x1, x2, c, s);
      rotate(y1, y2, c, s);
      store_pack(x, x1), store_pack(x + half, x2), store_pack(y, y1), store_pack(y + half, y2);
    }
    if (head < heads) {
      T* x = row + size_t(head) * hd;
      Pack<T> x1 = load_pack(x), x2 = load_pack(x + half);
      rotate(x1, x2, c, s);
      store_pack(x, x1), store_pack(x + half, x2);
    }
  }
}

}  // namespace

template <class T>
void rope(T* qkv, int B, int T_, int H, int KV, int hd, float theta, int sign, cudaStream_t stream) {
  const size_t row_len = size_t(H + 2 * KV) * hd;
  if ((hd / 2) % kPack<T> == 0 && aligned16(qkv)) {
    const size_t total = size_t(B) * T_ * (hd / 2 / kPack<T>);
    rope_vec_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(qkv, T_, H + KV, row_len, hd,
                                                                        double(theta), sign, total);
    ST_CUDA_LAUNCHED("rope_vec_kernel");
    return;
  }
  const size_t total = size_t(B) * T_ * (hd / 2);
  rope_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(qkv, T_, H + KV, row_len, hd, double(theta), sign,
                                                                  total);
  ST_CUDA_LAUNCHED("rope_kernel");
}

template void rope<float>(float*, int, int, int, int, int, float, int, cudaStream_t);
template void rope<bf16>(bf16*, int, int, int, int, int, float, int, cudaStream_t);

}  // namespace st::cuda

// Rotary position embedding (Hugging Face rotate_half), in place on the q and k
// heads of qkv. One thread per (row, frequency i): it computes the angle once, in
// double precision like the CPU reference (pos * theta^(-2i/hd) reaches ~1e5 rad at
// long positions, where a float angle would be off by ~1e-2), then rotates the
// pair (i, i + hd/2) of every q and k head of its row.
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/cuda_check.h"

namespace st::cuda {
namespace {

constexpr unsigned kThreads = 256;

// qkv (B*T, (H + 2KV) * hd); heads [0, H + KV) are q then k, adjacent in the row.
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

}  // namespace

template <class T>
void rope(T* qkv, int B, int T_, int H, int KV, int hd, float theta, int sign, cudaStream_t stream) {
  const size_t total = size_t(B) * T_ * (hd / 2);
  rope_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(qkv, T_, H + KV, size_t(H + 2 * KV) * hd, hd,
                                                                  double(theta), sign, total);
  ST_CUDA_LAUNCHED("rope_kernel");
}

template void rope<float>(float*, int, int, int, int, int, float, int, cudaStream_t);
template void rope<bf16>(bf16*, int, int, int, int, int, float, int, cudaStream_t);

}  // namespace st::cuda

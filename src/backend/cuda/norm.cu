// RMSNorm: out = x * rstd * w with rstd = 1 / sqrt(mean(x²) + eps), float math.
// Forward and the dinp part of the backward: one warp per row (C is a few thousand
// at most, so a warp's strided loop is enough). dweight: the deterministic column
// reduction of reduce.cuh over dy * x * rstd, no atomics.
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/reduce.cuh"

namespace st::cuda {
namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each

// out (N, C), rstd (N) = rmsnorm of inp (N, C) with weight (C)
template <class T>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* inp, const T* weight, int N, int C,
                                       float eps) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  const T* x = inp + size_t(row) * C;
  T* y = out + size_t(row) * C;
  float ss = 0;
  for (int c = lane; c < C; c += 32) {
    const float v = to_float(x[c]);
    ss += v * v;
  }
  ss = warp_sum(ss);
  const float rs = 1.0f / sqrtf(ss / C + eps);
  for (int c = lane; c < C; c += 32) y[c] = from_float<T>(to_float(x[c]) * rs * to_float(weight[c]));
  if (lane == 0) rstd[row] = rs;
}

// dinp (N, C) += rs * (g - xh * mean(g * xh)), g = dy * w, xh = x * rs
template <class T>
__global__ void rmsnorm_backward_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* weight,
                                             const float* rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  const size_t off = size_t(row) * C;
  const float rs = rstd[row];
  float dot = 0;
  for (int c = lane; c < C; c += 32)
    dot += to_float(dout[off + c]) * to_float(weight[c]) * (to_float(inp[off + c]) * rs);
  const float mean = warp_sum(dot) / C;
  for (int c = lane; c < C; c += 32) {
    const float xh = to_float(inp[off + c]) * rs;
    const float d = rs * (to_float(dout[off + c]) * to_float(weight[c]) - xh * mean);
    dinp[off + c] = from_float<T>(to_float(dinp[off + c]) + d);
  }
}

template <class T>
struct DweightTerm {  // f(r, c) = dy[r][c] * x[r][c] * rstd[r]
  const T *dout, *inp;
  const float* rstd;
  int C;
  __device__ float operator()(int r, int c) const {
    const size_t i = size_t(r) * C + c;
    return to_float(dout[i]) * (to_float(inp[i]) * rstd[r]);
  }
};

}  // namespace

template <class T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, int N, int C, float eps,
                     cudaStream_t stream) {
  const int blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  rmsnorm_forward_kernel<<<blocks, kRowsPerBlock * 32, 0, stream>>>(out, rstd, inp, weight, N, C, eps);
  ST_CUDA_LAUNCHED("rmsnorm_forward_kernel");
}

template <class T>
void rmsnorm_backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight, const float* rstd,
                      int N, int C, cudaStream_t stream) {
  const int blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  rmsnorm_backward_dinp_kernel<<<blocks, kRowsPerBlock * 32, 0, stream>>>(dinp, dout, inp, weight, rstd, N, C);
  ST_CUDA_LAUNCHED("rmsnorm_backward_dinp_kernel");
  column_reduce_add(dweight, DweightTerm<T>{dout, inp, rstd, C}, N, C, stream);
}

#define ST_CUDA_NORM(T)                                                                             \
  template void rmsnorm_forward<T>(T*, float*, const T*, const T*, int, int, float, cudaStream_t); \
  template void rmsnorm_backward<T>(T*, float*, const T*, const T*, const T*, const float*, int, int, cudaStream_t);
ST_CUDA_NORM(float)
ST_CUDA_NORM(bf16)
#undef ST_CUDA_NORM

}  // namespace st::cuda

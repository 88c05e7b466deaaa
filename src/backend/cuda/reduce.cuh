// Deterministic column reduction: out (C) += Σ_r f(r, c) over rows r < N, for the
// parameter gradients that sum over tokens (matmul dbias, RMSNorm dweight).
// Stage 1: block (x, k) sums rows [k*R, (k+1)*R) of 256 consecutive columns into
// part (chunks, C); stage 2 adds the chunks in a fixed order. No atomics, so the
// result is the same every run; threads of a warp read consecutive columns.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"

namespace st::cuda {

constexpr int kColumnThreads = 256;
constexpr int kColumnRows = 64;  // rows per chunk: enough work per thread, many chunks in flight

template <class F>
__global__ void column_partials_kernel(float* part, F f, int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int r0 = blockIdx.y * kColumnRows, r1 = min(N, r0 + kColumnRows);
  float s = 0;
  for (int r = r0; r < r1; ++r) s += f(r, c);
  part[size_t(blockIdx.y) * C + c] = s;
}

// out (C) += Σ_k part (chunks, C). A template only so that the header can define it.
template <int = 0>
__global__ void column_finish_kernel(float* out, const float* part, int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float s = 0;
  for (int k = 0; k < chunks; ++k) s += part[size_t(k) * C + c];
  out[c] += s;
}

// Enqueues both stages; f is a device functor float(int r, int c).
template <class F>
void column_reduce_add(float* out, F f, int N, int C, cudaStream_t stream) {
  const int chunks = (N + kColumnRows - 1) / kColumnRows;
  ST_CHECK(chunks <= 65535, "column reduction over ", N, " rows: too many row chunks");
  Scratch part(size_t(chunks) * C * sizeof(float), stream);
  const dim3 grid((C + kColumnThreads - 1) / kColumnThreads, chunks);
  column_partials_kernel<<<grid, kColumnThreads, 0, stream>>>(part.as<float>(), f, N, C);
  ST_CUDA_LAUNCHED("column_partials_kernel");
  column_finish_kernel<><<<(C + kColumnThreads - 1) / kColumnThreads, kColumnThreads, 0, stream>>>(
      out, part.as<float>(), chunks, C);
  ST_CUDA_LAUNCHED("column_finish_kernel");
}

}  // namespace st::cuda

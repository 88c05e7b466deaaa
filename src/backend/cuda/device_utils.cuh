// Device-side helpers shared by the kernels: float <-> storage conversion and
// warp / block reductions. Included by .cu files only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace st::cuda {

using bf16 = __nv_bfloat16;

// Every kernel computes in float; storage is float or bf16 (round to nearest even).
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets
// the result. `shared` holds 32 values; the call begins and ends with a barrier, so
// it can be used repeatedly with the same buffer.
template <class V>
__device__ V block_sum(V v, V* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  V r = lane < warps ? shared[lane] : V(0);
  r = warp_sum(r);
  __syncthreads();
  return r;
}

// Grid-stride loop index helpers.
__device__ __forceinline__ size_t global_thread() { return size_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ size_t grid_threads() { return size_t(gridDim.x) * blockDim.x; }

}  // namespace st::cuda

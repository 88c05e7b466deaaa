// Device-side helpers shared by the kernels: float <-> storage conversion and
// warp / block reductions. Included by .cu files only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

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

// ---- 16-byte packs -----------------------------------------------------------------
// The memory-bound kernels move data in 16-byte packs (8 bf16 or 4 float) with one
// vector load / store each, when the pointers allow it (aligned16, checked on the host
// at launch); otherwise a scalar path handles the same elements. kPack<T> elements a pack.
template <class T>
inline constexpr int kPack = 16 / int(sizeof(T));

template <class T>
struct alignas(16) Pack {
  T v[kPack<T>];
};

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// p must be 16-byte aligned. The _cs variants are the "streaming" (evict-first) cache
// hints: for data read or written for the last time, so it does not push out of L2
// what will be read again soon.
template <class T>
__device__ __forceinline__ Pack<T> load_pack(const T* p) {
  Pack<T> r;
  *reinterpret_cast<uint4*>(&r) = *reinterpret_cast<const uint4*>(p);
  return r;
}
template <class T>
__device__ __forceinline__ Pack<T> load_pack_cs(const T* p) {
  Pack<T> r;
  *reinterpret_cast<uint4*>(&r) = __ldcs(reinterpret_cast<const uint4*>(p));
  return r;
}
template <class T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T>& x) {
  *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(&x);
}
template <class T>
__device__ __forceinline__ void store_pack_cs(T* p, const Pack<T>& x) {
  __stcs(reinterpret_cast<uint4*>(p), *reinterpret_cast<const uint4*>(&x));
}

// Grid-stride loop index helpers.
__device__ __forceinline__ size_t global_thread() { return size_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ size_t grid_threads() { return size_t(gridDim.x) * blockDim.x; }

}  // namespace st::cuda

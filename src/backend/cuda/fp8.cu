// FP8 quantization (backend/fp8.h): the per-tensor amax, then one pass that casts
// to e4m3/e5m2 with the scale the amax gives and writes the row-major result, its
// transpose (for the GEMMs that need the other operand layout: FP8 tensor cores on
// sm_89/sm_90 read both operands K-major), or both. The scale never leaves the
// device: the cast reads the amax the first kernel left, so nothing waits.
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/fp8.h"

namespace st::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 64;  // a block casts a kTile x kTile tile

// Non-negative floats order as their bit patterns: atomicMax on the bits is a max on
// |x|; a NaN's bits exceed every finite value's, so a NaN wins (and the scale is 1).
template <class T>
__global__ void __launch_bounds__(kThreads) amax_kernel(unsigned* amax_bits, const T* x, size_t n) {
  float m = 0;
  for (size_t i = global_thread(); i < n; i += grid_threads()) {
    const float a = fabsf(to_float(x[i]));
    m = (a > m || a != a) ? a : m;
  }
  unsigned bits = __float_as_uint(m);
  for (int o = 16; o > 0; o /= 2) bits = max(bits, __shfl_xor_sync(0xffffffffu, bits, o));
  if ((threadIdx.x & 31) == 0) atomicMax(amax_bits, bits);
}

__device__ __forceinline__ uint8_t cast(float v, __nv_fp8_interpretation_t fmt) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, fmt);
}

// One kTile x kTile tile per block: x (rows, cols) -> q (rows, cols) and/or
// qt (cols, rows). VEC: 8 elements of x load as 16-byte packs and go to q as one
// 8-byte store (x 16-byte and q 8-byte aligned, cols % 8 == 0).
template <class T, bool VEC>
__global__ void __launch_bounds__(kThreads)
    cast_kernel(uint8_t* q, uint8_t* qt, float* inv_scale, const T* x, int rows, int cols, const unsigned* amax_bits,
                float max_finite, __nv_fp8_interpretation_t fmt) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  // A given scale (amax_bits null) is a power of two: 1 / (1 / s) is s exactly.
  const float s = amax_bits ? fp8_scale(__uint_as_float(*amax_bits), max_finite) : 1.0f / *inv_scale;
  if (amax_bits && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *inv_scale = 1.0f / s;
  const int r0 = blockIdx.y * kTile, c0 = blockIdx.x * kTile;
  for (int i = threadIdx.x; i < kTile * (kTile / 8); i += kThreads) {
    const int lr = i / (kTile / 8), lc = (i % (kTile / 8)) * 8, r = r0 + lr, c = c0 + lc;
    if (r >= rows) continue;
    uint8_t b[8];
    const size_t at = size_t(r) * cols + c;
    if (VEC && c + 8 <= cols) {
      uint4 pack[8 * sizeof(T) / 16];  // 8 elements: one pack of bf16, two of float
#pragma unroll
      for (int p = 0; p < int(8 * sizeof(T) / 16); p++) pack[p] = reinterpret_cast<const uint4*>(x + at)[p];
      const T* v = reinterpret_cast<const T*>(pack);
#pragma unroll
      for (int k = 0; k < 8; k++) b[k] = cast(to_float(v[k]) * s, fmt);
      if (q) *reinterpret_cast<uint2*>(q + at) = *reinterpret_cast<const uint2*>(b);
    } else {
      for (int k = 0; k < 8; k++) {
        b[k] = c + k < cols ? cast(to_float(x[at + k]) * s, fmt) : 0;
        if (q && c + k < cols) q[at + k] = b[k];
      }
    }
    if (qt)
#pragma unroll
      for (int k = 0; k < 8; k++) tile[lr][lc + k] = b[k];
  }
  if (!qt) return;
  __syncthreads();
  // qt row c holds column c of x: 64 bytes of this tile per row, in packs of 16.
  for (int i = threadIdx.x; i < kTile * (kTile / 16); i += kThreads) {
    const int lc = i / (kTile / 16), lr = (i % (kTile / 16)) * 16, c = c0 + lc, r = r0 + lr;
    if (c >= cols || r >= rows) continue;
    const size_t at = size_t(c) * rows + r;
    if (r + 16 <= rows && rows % 16 == 0) {
      uint8_t v[16];
#pragma unroll
      for (int k = 0; k < 16; k++) v[k] = tile[lr + k][lc];
      *reinterpret_cast<uint4*>(qt + at) = *reinterpret_cast<const uint4*>(v);
    } else {
      for (int k = 0; k < 16 && r + k < rows; k++) qt[at + k] = tile[lr + k][lc];
    }
  }
}

}  // namespace

template <class T>
void fp8_quantize(uint8_t* q, uint8_t* qt, float* inv_scale, const T* x, int rows, int cols, Fp8Format format,
                  unsigned* amax_scratch, cudaStream_t stream) {
  const size_t n = size_t(rows) * cols;
  if (amax_scratch) {
    ST_CUDA(cudaMemsetAsync(amax_scratch, 0, sizeof(unsigned), stream));
    const unsigned blocks = unsigned(std::min<size_t>((n + kThreads * 8 - 1) / (kThreads * 8), 1024));
    amax_kernel<<<blocks, kThreads, 0, stream>>>(amax_scratch, x, n);
    ST_CUDA_LAUNCHED("fp8 amax_kernel");
  }
  const dim3 grid((cols + kTile - 1) / kTile, (rows + kTile - 1) / kTile);
  ST_CHECK(grid.y <= 65535, "fp8_quantize: ", rows, " rows is too many for one launch");
  const auto fmt = format == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
  const float max_finite = fp8_spec(format).max_finite;
  const bool vec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(q) % 8 == 0 && cols % 8 == 0;
  if (vec)
    cast_kernel<T, true><<<grid, kThreads, 0, stream>>>(q, qt, inv_scale, x, rows, cols, amax_scratch, max_finite, fmt);
  else
    cast_kernel<T, false><<<grid, kThreads, 0, stream>>>(q, qt, inv_scale, x, rows, cols, amax_scratch, max_finite,
                                                         fmt);
  ST_CUDA_LAUNCHED("fp8 cast_kernel");
}

template void fp8_quantize<float>(uint8_t*, uint8_t*, float*, const float*, int, int, Fp8Format, unsigned*,
                                  cudaStream_t);
template void fp8_quantize<bf16>(uint8_t*, uint8_t*, float*, const bf16*, int, int, Fp8Format, unsigned*,
                                 cudaStream_t);

}  // namespace st::cuda

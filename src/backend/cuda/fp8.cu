// FP8 quantization (backend/fp8.h). Current scaling: the per-tensor amax, then one pass
// that casts to e4m3/e5m2 with the scale the amax gives. Given scale (an earlier
// quantization's, or delayed scaling's from the amax history): the cast alone, which
// may record the tensor's amax in the same pass. The cast writes the row-major result,
// its transpose (for the GEMMs that need the other operand layout: FP8 tensor cores on
// sm_89/sm_90 read both operands K-major), or both. The scale never leaves the device:
// the cast reads the amax the first kernel left, so nothing waits.
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/swiglu.cuh"
#include "backend/fp8.h"

namespace st::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRows = 128, kCols = 64;  // a block casts a kRows x kCols tile
constexpr int kPacksPerThread = kRows * (kCols / 8) / kThreads;  // 8-element packs: 4

// |v| as bits: non-negative floats order as their bits; a NaN's exceed every finite
// value's, so a NaN wins (and its scale is 1).
__device__ __forceinline__ unsigned abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// One atomicMax per block: the block's largest |x| bits (every thread passes its own).
__device__ __forceinline__ void block_amax(unsigned* amax_bits, unsigned m) {
  __shared__ unsigned warp_max_bits[kThreads / 32];
  m = __reduce_max_sync(0xffffffffu, m);
  if ((threadIdx.x & 31) == 0) warp_max_bits[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    m = threadIdx.x < kThreads / 32 ? warp_max_bits[threadIdx.x] : 0u;
    m = __reduce_max_sync(0xffffffffu, m);
    if (threadIdx.x == 0 && m) atomicMax(amax_bits, m);
  }
}

// amax over n elements: 16-byte packs (x 16-byte aligned; the launcher checks), four in
// flight per thread, then the tail.
template <class T>
__global__ void __launch_bounds__(kThreads) amax_kernel(unsigned* amax_bits, const T* __restrict__ x, size_t n,
                                                         bool vec) {
  constexpr int P = 16 / int(sizeof(T));
  unsigned m = 0;
  size_t done = 0;
  if (vec) {
    const size_t packs = n / P, stride = grid_threads();
    const uint4* xp = reinterpret_cast<const uint4*>(x);
    size_t i = global_thread();
    for (; i + 3 * stride < packs; i += 4 * stride) {
      uint4 v[4];
#pragma unroll
      for (int u = 0; u < 4; u++) v[u] = xp[i + u * stride];
#pragma unroll
      for (int u = 0; u < 4; u++) {
        const T* e = reinterpret_cast<const T*>(&v[u]);
#pragma unroll
        for (int k = 0; k < P; k++) m = max(m, abs_bits(to_float(e[k])));
      }
    }
    for (; i < packs; i += stride) {
      const uint4 v = xp[i];
      const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int k = 0; k < P; k++) m = max(m, abs_bits(to_float(e[k])));
    }
    done = packs * P;
  }
  for (size_t i = done + global_thread(); i < n; i += grid_threads()) m = max(m, abs_bits(to_float(x[i])));
  block_amax(amax_bits, m);
}

// Where column c of tile row r is kept: its 8-byte group XOR the row's band of 16 (the
// same for the 16 rows one thread reads, so a group stays 8 contiguous bytes).
__device__ __forceinline__ int tile_col(int r, int c) { return (((c >> 3) ^ (r >> 4)) & 7) << 3 | (c & 7); }

__device__ __forceinline__ uint8_t cast(float v, __nv_fp8_interpretation_t fmt) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, fmt);
}

// qt (cols, rows) gets a block's tile (its rows r0.., columns c0..) transposed: row c
// of qt holds column c of the tile, kRows bytes per row in packs of 16.
__device__ __forceinline__ void store_transposed(uint8_t* __restrict__ qt, const uint8_t (*tile)[kCols], int r0,
                                                 int c0, int rows, int cols) {
  for (int i = threadIdx.x; i < kCols * (kRows / 16); i += kThreads) {
    const int lc = i / (kRows / 16), lr = (i % (kRows / 16)) * 16, c = c0 + lc, r = r0 + lr;
    if (c >= cols || r >= rows) continue;
    const size_t at = size_t(c) * rows + r;
    if (r + 16 <= rows && rows % 16 == 0 && reinterpret_cast<uintptr_t>(qt) % 16 == 0) {
      __align__(16) uint8_t v[16];
#pragma unroll
      for (int k = 0; k < 16; k++) v[k] = tile[lr + k][tile_col(lr, lc)];
      *reinterpret_cast<uint4*>(qt + at) = *reinterpret_cast<const uint4*>(v);
    } else {
      for (int k = 0; k < 16 && r + k < rows; k++) qt[at + k] = tile[lr + k][tile_col(lr, lc)];
    }
  }
}

// One kRows x kCols tile per block: x (rows, cols) -> q (rows, cols) and/or qt (cols,
// rows); with `record`, the tile's amax is max-ed into *record. VEC: 8 elements of x
// load as 16-byte packs (all of a thread's loads in flight at once) and go to q as one
// 8-byte store (x 16-byte and q 8-byte aligned, cols % 8 == 0).
template <class T, bool VEC>
__global__ void __launch_bounds__(kThreads)
    cast_kernel(uint8_t* __restrict__ q, uint8_t* __restrict__ qt, float* inv_scale, const T* __restrict__ x,
                int rows, int cols, const unsigned* amax_bits, unsigned* record, float max_finite,
                __nv_fp8_interpretation_t fmt) {
  // The tile's 8-byte groups are swizzled by row band (tile_at): the transposed read
  // below has a warp's threads in 8 bands of 16 rows at the same columns, which would
  // otherwise all hit one shared-memory bank.
  __shared__ __align__(16) uint8_t tile[kRows][kCols];
  // A given scale (amax_bits null) is a power of two: 1 / (1 / s) is s exactly.
  const float s = amax_bits ? fp8_scale(__uint_as_float(*amax_bits), max_finite) : 1.0f / *inv_scale;
  if (amax_bits && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *inv_scale = 1.0f / s;
  const int r0 = blockIdx.y * kRows, c0 = blockIdx.x * kCols;
  unsigned m = 0;
  if (VEC) {
    uint4 pack[kPacksPerThread][8 * sizeof(T) / 16];
#pragma unroll
    for (int u = 0; u < kPacksPerThread; u++) {
      const int i = threadIdx.x + u * kThreads, r = r0 + i / (kCols / 8), c = c0 + (i % (kCols / 8)) * 8;
      if (r < rows && c < cols) {
        const size_t at = size_t(r) * cols + c;
#pragma unroll
        for (int p = 0; p < int(8 * sizeof(T) / 16); p++) pack[u][p] = reinterpret_cast<const uint4*>(x + at)[p];
      }
    }
#pragma unroll
    for (int u = 0; u < kPacksPerThread; u++) {
      const int i = threadIdx.x + u * kThreads, lr = i / (kCols / 8), lc = (i % (kCols / 8)) * 8, r = r0 + lr,
                c = c0 + lc;
      if (r >= rows || c >= cols) continue;
      const T* v = reinterpret_cast<const T*>(pack[u]);
      __align__(8) uint8_t b[8];
#pragma unroll
      for (int k = 0; k < 8; k++) {
        const float f = to_float(v[k]);
        m = max(m, abs_bits(f));
        b[k] = cast(f * s, fmt);
      }
      if (q) *reinterpret_cast<uint2*>(q + size_t(r) * cols + c) = *reinterpret_cast<const uint2*>(b);
      if (qt) *reinterpret_cast<uint2*>(&tile[lr][tile_col(lr, lc)]) = *reinterpret_cast<const uint2*>(b);
    }
  } else {
    for (int i = threadIdx.x; i < kRows * kCols; i += kThreads) {
      const int lr = i / kCols, lc = i % kCols, r = r0 + lr, c = c0 + lc;
      if (r >= rows || c >= cols) continue;
      const size_t at = size_t(r) * cols + c;
      const float f = to_float(x[at]);
      m = max(m, abs_bits(f));
      const uint8_t b = cast(f * s, fmt);
      if (q) q[at] = b;
      if (qt) tile[lr][tile_col(lr, lc)] = b;
    }
  }
  if (record) block_amax(record, m);  // its barrier also orders the tile's writes
  if (!qt) return;
  __syncthreads();
  store_transposed(qt, tile, r0, c0, rows, cols);
}

// 8 elements of T from 16-byte-aligned memory, as floats.
template <class T>
__device__ __forceinline__ void load8(const T* __restrict__ p, float* f) {
  uint4 pack[8 * sizeof(T) / 16];
#pragma unroll
  for (int i = 0; i < int(8 * sizeof(T) / 16); i++) pack[i] = reinterpret_cast<const uint4*>(p)[i];
  const T* v = reinterpret_cast<const T*>(pack);
#pragma unroll
  for (int k = 0; k < 8; k++) f[k] = to_float(v[k]);
}

// The SwiGLU backward cast straight to FP8 with a given scale: a block takes kRows rows
// x kCols / 2 columns of F and writes the kCols columns of dgu they give (d gate's and
// d up's), row-major and/or transposed (through the swizzled tile, as cast_kernel),
// recording their amax. Each value is rounded to T first: the bits of swiglu_backward
// followed by fp8_quantize. F % 8 == 0; dout, gu 16-byte and q 8-byte aligned.
template <class T>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_fp8_kernel(uint8_t* __restrict__ q, uint8_t* __restrict__ qt, const float* inv_scale,
                               unsigned* record, const T* __restrict__ dout, const T* __restrict__ gu, int N, int F,
                               __nv_fp8_interpretation_t fmt) {
  __shared__ __align__(16) uint8_t tile[kRows][kCols];
  constexpr int kHalf = kCols / 2, kPacks = kHalf / 8, kPer = kRows * kPacks / kThreads;
  const float s = 1.0f / *inv_scale;
  const int r0 = blockIdx.y * kRows, f0 = blockIdx.x * kHalf;
  const size_t C2 = size_t(2) * F;
  unsigned m = 0;
  float g[kPer][8], u[kPer][8], dy[kPer][8];
#pragma unroll
  for (int p = 0; p < kPer; p++) {
    const int i = threadIdx.x + p * kThreads, r = r0 + i / kPacks, f = f0 + (i % kPacks) * 8;
    if (r >= N || f >= F) continue;
    load8(gu + size_t(r) * C2 + f, g[p]);
    load8(gu + size_t(r) * C2 + F + f, u[p]);
    load8(dout + size_t(r) * F + f, dy[p]);
  }
#pragma unroll
  for (int p = 0; p < kPer; p++) {
    const int i = threadIdx.x + p * kThreads, lr = i / kPacks, lf = (i % kPacks) * 8, r = r0 + lr, f = f0 + lf;
    if (r >= N || f >= F) continue;
    __align__(8) uint8_t bg[8], bu[8];
#pragma unroll
    for (int k = 0; k < 8; k++) {
      float dg, du;
      swiglu_grads(g[p][k], u[p][k], dy[p][k], &dg, &du);
      dg = to_float(from_float<T>(dg)), du = to_float(from_float<T>(du));
      m = max(m, max(abs_bits(dg), abs_bits(du)));
      bg[k] = cast(dg * s, fmt), bu[k] = cast(du * s, fmt);
    }
    if (q) {
      *reinterpret_cast<uint2*>(q + size_t(r) * C2 + f) = *reinterpret_cast<const uint2*>(bg);
      *reinterpret_cast<uint2*>(q + size_t(r) * C2 + F + f) = *reinterpret_cast<const uint2*>(bu);
    }
    if (qt) {
      *reinterpret_cast<uint2*>(&tile[lr][tile_col(lr, lf)]) = *reinterpret_cast<const uint2*>(bg);
      *reinterpret_cast<uint2*>(&tile[lr][tile_col(lr, kHalf + lf)]) = *reinterpret_cast<const uint2*>(bu);
    }
  }
  if (record) block_amax(record, m);
  if (!qt) return;
  __syncthreads();
  // qt row c (c < F: d gate's column c; F + c: d up's) holds kRows bytes of this tile.
  for (int i = threadIdx.x; i < kCols * (kRows / 16); i += kThreads) {
    const int lc = i / (kRows / 16), lr = (i % (kRows / 16)) * 16, r = r0 + lr;
    const int f = f0 + lc % kHalf;
    if (f >= F || r >= N) continue;
    const size_t at = (size_t(lc < kHalf ? 0 : F) + f) * N + r;
    if (r + 16 <= N && N % 16 == 0 && reinterpret_cast<uintptr_t>(qt) % 16 == 0) {
      __align__(16) uint8_t v[16];
#pragma unroll
      for (int k = 0; k < 16; k++) v[k] = tile[lr + k][tile_col(lr, lc)];
      *reinterpret_cast<uint4*>(qt + at) = *reinterpret_cast<const uint4*>(v);
    } else {
      for (int k = 0; k < 16 && r + k < N; k++) qt[at + k] = tile[lr + k][tile_col(lr, lc)];
    }
  }
}

// The SwiGLU forward cast straight to FP8 with a given scale: a block takes a kRows x
// kCols tile of out (N, F), reading its gate and up columns of gu, and writes it
// row-major and/or transposed (through the swizzled tile, as cast_kernel), recording
// its amax. Each value is rounded to T first: the bits of swiglu_forward followed by
// fp8_quantize. F % 8 == 0; gu 16-byte and q 8-byte aligned.
template <class T>
__global__ void __launch_bounds__(kThreads)
    swiglu_forward_fp8_kernel(uint8_t* __restrict__ q, uint8_t* __restrict__ qt, const float* inv_scale,
                              unsigned* record, const T* __restrict__ gu, int N, int F,
                              __nv_fp8_interpretation_t fmt) {
  __shared__ __align__(16) uint8_t tile[kRows][kCols];
  const float s = 1.0f / *inv_scale;
  const int r0 = blockIdx.y * kRows, c0 = blockIdx.x * kCols;
  const size_t C2 = size_t(2) * F;
  unsigned m = 0;
  float g[kPacksPerThread][8], u[kPacksPerThread][8];
#pragma unroll
  for (int p = 0; p < kPacksPerThread; p++) {
    const int i = threadIdx.x + p * kThreads, r = r0 + i / (kCols / 8), c = c0 + (i % (kCols / 8)) * 8;
    if (r >= N || c >= F) continue;
    load8(gu + size_t(r) * C2 + c, g[p]);
    load8(gu + size_t(r) * C2 + F + c, u[p]);
  }
#pragma unroll
  for (int p = 0; p < kPacksPerThread; p++) {
    const int i = threadIdx.x + p * kThreads, lr = i / (kCols / 8), lc = (i % (kCols / 8)) * 8, r = r0 + lr,
              c = c0 + lc;
    if (r >= N || c >= F) continue;
    __align__(8) uint8_t b[8];
#pragma unroll
    for (int k = 0; k < 8; k++) {
      const float y = to_float(from_float<T>(swiglu_value(g[p][k], u[p][k])));
      m = max(m, abs_bits(y));
      b[k] = cast(y * s, fmt);
    }
    if (q) *reinterpret_cast<uint2*>(q + size_t(r) * F + c) = *reinterpret_cast<const uint2*>(b);
    if (qt) *reinterpret_cast<uint2*>(&tile[lr][tile_col(lr, lc)]) = *reinterpret_cast<const uint2*>(b);
  }
  if (record) block_amax(record, m);  // its barrier also orders the tile's writes
  if (!qt) return;
  __syncthreads();
  store_transposed(qt, tile, r0, c0, N, F);
}

// Delayed scaling's step: one thread per tensor.
__global__ void roll_kernel(float* inv_scale, int stride, unsigned* amax_bits, unsigned* history, int n, int len,
                            int pos, float max_finite) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned* h = history + size_t(i) * len;
  h[pos] = amax_bits[i];
  amax_bits[i] = 0;
  unsigned m = 0;
  for (int j = 0; j < len; j++) m = max(m, h[j]);
  inv_scale[size_t(i) * stride] = 1.0f / fp8_scale(__uint_as_float(m), max_finite);
}

}  // namespace

template <class T>
void fp8_quantize(uint8_t* q, uint8_t* qt, float* inv_scale, const T* x, int rows, int cols, Fp8Format format,
                  unsigned* amax_scratch, unsigned* record, cudaStream_t stream) {
  const size_t n = size_t(rows) * cols;
  if (amax_scratch) {
    ST_CUDA(cudaMemsetAsync(amax_scratch, 0, sizeof(unsigned), stream));
    const unsigned blocks = unsigned(std::min<size_t>((n + kThreads * 32 - 1) / (kThreads * 32), 2048));
    amax_kernel<<<std::max(blocks, 1u), kThreads, 0, stream>>>(amax_scratch, x, n,
                                                              reinterpret_cast<uintptr_t>(x) % 16 == 0);
    ST_CUDA_LAUNCHED("fp8 amax_kernel");
  }
  const dim3 grid((cols + kCols - 1) / kCols, (rows + kRows - 1) / kRows);
  ST_CHECK(grid.y <= 65535, "fp8_quantize: ", rows, " rows is too many for one launch");
  const auto fmt = format == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
  const float max_finite = fp8_spec(format).max_finite;
  const bool vec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(q) % 8 == 0 && cols % 8 == 0;
  if (vec)
    cast_kernel<T, true><<<grid, kThreads, 0, stream>>>(q, qt, inv_scale, x, rows, cols, amax_scratch, record,
                                                        max_finite, fmt);
  else
    cast_kernel<T, false><<<grid, kThreads, 0, stream>>>(q, qt, inv_scale, x, rows, cols, amax_scratch, record,
                                                         max_finite, fmt);
  ST_CUDA_LAUNCHED("fp8 cast_kernel");
}

template <class T>
bool swiglu_backward_fp8(uint8_t* q, uint8_t* qt, const float* inv_scale, unsigned* record, const T* dout, const T* gu,
                         int N, int F, Fp8Format format, cudaStream_t stream) {
  const auto al = [](const void* p, int b) { return reinterpret_cast<uintptr_t>(p) % b == 0; };
  if (F % 8 != 0 || !al(dout, 16) || !al(gu, 16) || !al(q, 8)) return false;
  const dim3 grid((F + kCols / 2 - 1) / (kCols / 2), (N + kRows - 1) / kRows);
  if (grid.y > 65535) return false;
  swiglu_backward_fp8_kernel<T><<<grid, kThreads, 0, stream>>>(q, qt, inv_scale, record, dout, gu, N, F,
                                                               format == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2);
  ST_CUDA_LAUNCHED("swiglu_backward_fp8_kernel");
  return true;
}

template <class T>
bool swiglu_forward_fp8(uint8_t* q, uint8_t* qt, const float* inv_scale, unsigned* record, const T* gu, int N, int F,
                        Fp8Format format, cudaStream_t stream) {
  const auto al = [](const void* p, int b) { return reinterpret_cast<uintptr_t>(p) % b == 0; };
  if (F % 8 != 0 || !al(gu, 16) || !al(q, 8)) return false;
  const dim3 grid((F + kCols - 1) / kCols, (N + kRows - 1) / kRows);
  if (grid.y > 65535) return false;
  swiglu_forward_fp8_kernel<T><<<grid, kThreads, 0, stream>>>(q, qt, inv_scale, record, gu, N, F,
                                                              format == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2);
  ST_CUDA_LAUNCHED("swiglu_forward_fp8_kernel");
  return true;
}

void fp8_roll_scales(float* inv_scale, int stride, float* amax, float* history, int n, int len, int pos,
                     Fp8Format format, cudaStream_t stream) {
  roll_kernel<<<(n + 127) / 128, 128, 0, stream>>>(inv_scale, stride, reinterpret_cast<unsigned*>(amax),
                                                   reinterpret_cast<unsigned*>(history), n, len, pos,
                                                   fp8_spec(format).max_finite);
  ST_CUDA_LAUNCHED("fp8 roll_kernel");
}

template void fp8_quantize<float>(uint8_t*, uint8_t*, float*, const float*, int, int, Fp8Format, unsigned*,
                                  unsigned*, cudaStream_t);
template bool swiglu_backward_fp8<float>(uint8_t*, uint8_t*, const float*, unsigned*, const float*, const float*,
                                         int, int, Fp8Format, cudaStream_t);
template bool swiglu_backward_fp8<bf16>(uint8_t*, uint8_t*, const float*, unsigned*, const bf16*, const bf16*, int,
                                        int, Fp8Format, cudaStream_t);
template void fp8_quantize<bf16>(uint8_t*, uint8_t*, float*, const bf16*, int, int, Fp8Format, unsigned*,
                                 unsigned*, cudaStream_t);

template bool swiglu_forward_fp8<float>(uint8_t*, uint8_t*, const float*, unsigned*, const float*, int, int,
                                         Fp8Format, cudaStream_t);
template bool swiglu_forward_fp8<bf16>(uint8_t*, uint8_t*, const float*, unsigned*, const bf16*, int, int, Fp8Format,
                                        cudaStream_t);

}  // namespace st::cuda

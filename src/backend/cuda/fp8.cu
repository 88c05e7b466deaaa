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

// The 4x4 bytes of rows w[0..3] (4 columns each) transposed: o[j] holds column j's
// 4 bytes, row 0 in the low byte.
__device__ __forceinline__ void transpose4x4(const unsigned* w, unsigned* o) {
  const unsigned t0 = __byte_perm(w[0], w[1], 0x5140), t1 = __byte_perm(w[0], w[1], 0x7362);
  const unsigned t2 = __byte_perm(w[2], w[3], 0x5140), t3 = __byte_perm(w[2], w[3], 0x7362);
  o[0] = __byte_perm(t0, t2, 0x5410), o[1] = __byte_perm(t0, t2, 0x7632);
  o[2] = __byte_perm(t1, t3, 0x5410), o[3] = __byte_perm(t1, t3, 0x7632);
}

// qt gets a block's tile (rows r0.. of the source, `rows` in all) transposed: tile
// column lc goes to qt row row_of(lc) (negative: none), kRows bytes. Each thread takes
// 8 rows x 4 columns: 8 shared-memory words in, two 4x4 byte transposes, four 8-byte
// stores; a warp's 16 threads of one column write its 128 contiguous bytes.
template <class RowOf>
__device__ __forceinline__ void store_transposed(uint8_t* __restrict__ qt, const uint8_t (*tile)[kCols], int r0,
                                                 int rows, RowOf row_of) {
  static_assert(kCols / 4 * (kRows / 8) == kThreads, "one 8 x 4 piece per thread");
  const int lr = (threadIdx.x % (kRows / 8)) * 8, lc = (threadIdx.x / (kRows / 8)) * 4, r = r0 + lr;
  if (r >= rows) return;
  unsigned w[8], o[8];
#pragma unroll
  for (int k = 0; k < 8; k++) w[k] = *reinterpret_cast<const unsigned*>(&tile[lr + k][tile_col(lr, lc)]);
  transpose4x4(w, o), transpose4x4(w + 4, o + 4);
  const bool whole = r + 8 <= rows && rows % 8 == 0 && reinterpret_cast<uintptr_t>(qt) % 8 == 0;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const int row = row_of(lc + j);
    if (row < 0) continue;
    uint8_t* at = qt + size_t(row) * rows + r;
    if (whole) {
      *reinterpret_cast<uint2*>(at) = make_uint2(o[j], o[4 + j]);
    } else {
      for (int k = 0; k < 8 && r + k < rows; k++) at[k] = uint8_t((k < 4 ? o[j] >> (8 * k) : o[4 + j] >> (8 * (k - 4))));
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
  store_transposed(qt, tile, r0, rows, [&](int lc) { return c0 + lc < cols ? c0 + lc : -1; });
}

// One kRows x kCols tile per block: qt (cols, rows) = q (rows, cols) transposed, the
// bytes as they are, through the swizzled tile and cast_kernel's transposed store. VEC:
// q 16-byte aligned and cols % 16 == 0, so a thread loads two 16-byte pieces, both in
// flight at once.
template <bool VEC>
__global__ void __launch_bounds__(kThreads) transpose_kernel(uint8_t* __restrict__ qt, const uint8_t* __restrict__ q,
                                                              int rows, int cols) {
  __shared__ __align__(16) uint8_t tile[kRows][kCols];
  const int r0 = blockIdx.y * kRows, c0 = blockIdx.x * kCols;
  if (VEC) {
    constexpr int kPieces = kRows * kCols / 16 / kThreads;  // 2
    uint4 v[kPieces];
#pragma unroll
    for (int u = 0; u < kPieces; u++) {
      const int i = threadIdx.x + u * kThreads, r = r0 + i / (kCols / 16), c = c0 + (i % (kCols / 16)) * 16;
      if (r < rows && c < cols) v[u] = *reinterpret_cast<const uint4*>(q + size_t(r) * cols + c);
    }
#pragma unroll
    for (int u = 0; u < kPieces; u++) {
      const int i = threadIdx.x + u * kThreads, lr = i / (kCols / 16), lc = (i % (kCols / 16)) * 16;
      if (r0 + lr >= rows || c0 + lc >= cols) continue;
      *reinterpret_cast<uint2*>(&tile[lr][tile_col(lr, lc)]) = make_uint2(v[u].x, v[u].y);
      *reinterpret_cast<uint2*>(&tile[lr][tile_col(lr, lc + 8)]) = make_uint2(v[u].z, v[u].w);
    }
  } else {
    for (int i = threadIdx.x; i < kRows * kCols; i += kThreads) {
      const int lr = i / kCols, lc = i % kCols, r = r0 + lr, c = c0 + lc;
      if (r < rows && c < cols) tile[lr][tile_col(lr, lc)] = q[size_t(r) * cols + c];
    }
  }
  __syncthreads();
  store_transposed(qt, tile, r0, rows, [&](int lc) { return c0 + lc < cols ? c0 + lc : -1; });
}

// 8 elements of T from 16-byte-aligned memory, as they are (one or two 16-byte packs):
// a kernel loads all of its packs first, so they are in flight together, and converts
// each when it uses it, so that the packs, not their floats, hold its registers.
template <class T>
struct Pack8 {
  uint4 raw[8 * sizeof(T) / 16];
  __device__ __forceinline__ void load(const T* __restrict__ p) {
#pragma unroll
    for (int i = 0; i < int(8 * sizeof(T) / 16); i++) raw[i] = reinterpret_cast<const uint4*>(p)[i];
  }
  __device__ __forceinline__ float operator[](int k) const { return to_float(reinterpret_cast<const T*>(raw)[k]); }
};

// Two values to FP8 in one conversion (the hardware converts pairs), as two bytes.
__device__ __forceinline__ uint16_t cast2(float a, float b, __nv_fp8_interpretation_t fmt) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, fmt);
}

// The SwiGLU kernels below are load-heavy: a block's packs all in flight, then math
// per element. kMinBlocks resident per SM holds them to 64 registers a thread, so
// that enough blocks' loads overlap one another's math and stores.
constexpr int kMinBlocks = 4;

// The SwiGLU backward cast straight to FP8 with a given scale: a block takes kRows rows
// x kCols / 2 columns of F and writes the kCols columns of dgu they give (d gate's and
// d up's), row-major and/or transposed (through the swizzled tile, as cast_kernel),
// recording their amax. Each value is rounded to T first: the bits of swiglu_backward
// followed by fp8_quantize. F % 8 == 0; dout, gu 16-byte and q 8-byte aligned.
template <class T>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    swiglu_backward_fp8_kernel(uint8_t* __restrict__ q, uint8_t* __restrict__ qt, const float* inv_scale,
                               unsigned* record, const T* __restrict__ dout, const T* __restrict__ gu, int N, int F,
                               __nv_fp8_interpretation_t fmt) {
  __shared__ __align__(16) uint8_t tile[kRows][kCols];
  constexpr int kHalf = kCols / 2, kPacks = kHalf / 8, kPer = kRows * kPacks / kThreads;
  const float s = 1.0f / *inv_scale;
  const int r0 = blockIdx.y * kRows, f0 = blockIdx.x * kHalf;
  const size_t C2 = size_t(2) * F;
  unsigned m = 0;
  Pack8<T> g[kPer], u[kPer], dy[kPer];
#pragma unroll
  for (int p = 0; p < kPer; p++) {
    const int i = threadIdx.x + p * kThreads, r = r0 + i / kPacks, f = f0 + (i % kPacks) * 8;
    if (r >= N || f >= F) continue;
    g[p].load(gu + size_t(r) * C2 + f);
    u[p].load(gu + size_t(r) * C2 + F + f);
    dy[p].load(dout + size_t(r) * F + f);
  }
#pragma unroll
  for (int p = 0; p < kPer; p++) {
    const int i = threadIdx.x + p * kThreads, lr = i / kPacks, lf = (i % kPacks) * 8, r = r0 + lr, f = f0 + lf;
    if (r >= N || f >= F) continue;
    __align__(8) uint16_t bg[4], bu[4];
#pragma unroll
    for (int k = 0; k < 8; k += 2) {
      float dg[2], du[2];
#pragma unroll
      for (int h = 0; h < 2; h++) {
        swiglu_grads(g[p][k + h], u[p][k + h], dy[p][k + h], &dg[h], &du[h]);
        dg[h] = to_float(from_float<T>(dg[h])), du[h] = to_float(from_float<T>(du[h]));
        m = max(m, max(abs_bits(dg[h]), abs_bits(du[h])));
      }
      bg[k / 2] = cast2(dg[0] * s, dg[1] * s, fmt), bu[k / 2] = cast2(du[0] * s, du[1] * s, fmt);
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
  if (record) block_amax(record, m);  // its barrier also orders the tile's writes
  if (!qt) return;
  __syncthreads();
  // qt row F0 + f (F0 = 0: d gate's column f; F: d up's) holds kRows bytes of this tile.
  store_transposed(qt, tile, r0, N, [&](int lc) {
    const int f = f0 + lc % kHalf;
    return f < F ? (lc < kHalf ? 0 : F) + f : -1;
  });
}

// The SwiGLU forward cast straight to FP8 with a given scale: a block takes a kRows x
// kCols tile of out (N, F), reading its gate and up columns of gu, and writes it
// row-major and/or transposed (through the swizzled tile, as cast_kernel), recording
// its amax. Each value is rounded to T first: the bits of swiglu_forward followed by
// fp8_quantize. F % 8 == 0; gu 16-byte and q 8-byte aligned.
template <class T>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    swiglu_forward_fp8_kernel(uint8_t* __restrict__ q, uint8_t* __restrict__ qt, const float* inv_scale,
                              unsigned* record, const T* __restrict__ gu, int N, int F,
                              __nv_fp8_interpretation_t fmt) {
  __shared__ __align__(16) uint8_t tile[kRows][kCols];
  const float s = 1.0f / *inv_scale;
  const int r0 = blockIdx.y * kRows, c0 = blockIdx.x * kCols;
  const size_t C2 = size_t(2) * F;
  unsigned m = 0;
  Pack8<T> g[kPacksPerThread], u[kPacksPerThread];
#pragma unroll
  for (int p = 0; p < kPacksPerThread; p++) {
    const int i = threadIdx.x + p * kThreads, r = r0 + i / (kCols / 8), c = c0 + (i % (kCols / 8)) * 8;
    if (r >= N || c >= F) continue;
    g[p].load(gu + size_t(r) * C2 + c);
    u[p].load(gu + size_t(r) * C2 + F + c);
  }
#pragma unroll
  for (int p = 0; p < kPacksPerThread; p++) {
    const int i = threadIdx.x + p * kThreads, lr = i / (kCols / 8), lc = (i % (kCols / 8)) * 8, r = r0 + lr,
              c = c0 + lc;
    if (r >= N || c >= F) continue;
    __align__(8) uint16_t b[4];
#pragma unroll
    for (int k = 0; k < 8; k += 2) {
      float y[2];
#pragma unroll
      for (int h = 0; h < 2; h++) {
        y[h] = to_float(from_float<T>(swiglu_value(g[p][k + h], u[p][k + h])));
        m = max(m, abs_bits(y[h]));
      }
      b[k / 2] = cast2(y[0] * s, y[1] * s, fmt);
    }
    if (q) *reinterpret_cast<uint2*>(q + size_t(r) * F + c) = *reinterpret_cast<const uint2*>(b);
    if (qt) *reinterpret_cast<uint2*>(&tile[lr][tile_col(lr, lc)]) = *reinterpret_cast<const uint2*>(b);
  }
  if (record) block_amax(record, m);  // its barrier also orders the tile's writes
  if (!qt) return;
  __syncthreads();
  store_transposed(qt, tile, r0, N, [&](int lc) { return c0 + lc < F ? c0 + lc : -1; });
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

void fp8_transpose(uint8_t* qt, const uint8_t* q, int rows, int cols, cudaStream_t stream) {
  const dim3 grid((cols + kCols - 1) / kCols, (rows + kRows - 1) / kRows);
  ST_CHECK(grid.y <= 65535, "fp8_transpose: ", rows, " rows is too many for one launch");
  if (reinterpret_cast<uintptr_t>(q) % 16 == 0 && cols % 16 == 0)
    transpose_kernel<true><<<grid, kThreads, 0, stream>>>(qt, q, rows, cols);
  else
    transpose_kernel<false><<<grid, kThreads, 0, stream>>>(qt, q, rows, cols);
  ST_CUDA_LAUNCHED("fp8 transpose_kernel");
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

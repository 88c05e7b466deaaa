// RMSNorm: out = x * rstd * w with rstd = 1 / sqrt(mean(x²) + eps), float math.
//
// Element ownership. A row of C elements is cut into packs of P = 16 / sizeof(T)
// elements (the last one partial when P does not divide C); lane l of the warp that
// handles a row owns packs l, l + 32, l + 64, ... Every kernel here, vector path
// (16-byte loads: C % P == 0 and the pointers 16-byte aligned, checked at launch) or
// scalar path (element loads, any alignment), uses that split and adds a lane's terms
// in pack order, element order within a pack, then the warp's butterfly. So the sum of
// squares, hence rstd and out, do not depend on the path, and the fused residual add
// (add_rmsnorm_forward) equals add + rmsnorm_forward bit for bit whatever the
// alignment of its arguments.
//
// Forward: one warp per row; the first kCachePacks packs of each lane stay in
// registers between the sum of squares and the output (C <= 2048 bf16 / 1024 f32
// read once; longer rows read their remainder again, from L1/L2). The fused variant
// reads a and b, writes sum = round(a + b) and normalises the rounded sum.
//
// Backward: one kernel does dinp per row and the dweight partial sums of its block.
// A block owns a contiguous run of rows and has one thread per pack of a row; each
// thread keeps dy * x * rstd of its columns in registers over the block's rows, then
// writes one partial row (blocks, C) to a scratch buffer the backend keeps; a second
// small kernel adds the partials in a fixed order into dweight. No atomics: the same
// bits every run (the grid, hence the grouping, depends only on N, C and the GPU
// model). Rows of more than 512 packs (C > 4096 bf16) take the older two-kernel path
// (warp-per-row dinp, column reduction of reduce.cuh).
#include <algorithm>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/reduce.cuh"

namespace st::cuda {
namespace {

constexpr int kFwdWarps = 8;     // forward: warps per block, one row each
constexpr int kCachePacks = 8;   // forward: packs per lane kept in registers
constexpr int kBwdRows = 2;            // backward: rows a block works on at once
constexpr int kBwdMaxThreads = 512;    // backward: threads (= packs of a row) at most

// Pack p of a row: a 16-byte load when kVec, else element loads of the elements that
// exist (c < C), zero-padded. Stores write only c < C.
template <bool kVec, class T>
__device__ __forceinline__ Pack<T> load_row_pack(const T* row, int p, int C) {
  constexpr int P = kPack<T>;
  if constexpr (kVec) {
    return load_pack(row + size_t(p) * P);
  } else {
    Pack<T> r;
#pragma unroll
    for (int e = 0; e < P; ++e) {
      const int c = p * P + e;
      r.v[e] = c < C ? row[c] : from_float<T>(0.0f);
    }
    return r;
  }
}
template <bool kVec, class T>
__device__ __forceinline__ void store_row_pack(T* row, int p, int C, const Pack<T>& x) {
  constexpr int P = kPack<T>;
  if constexpr (kVec) {
    store_pack(row + size_t(p) * P, x);
  } else {
#pragma unroll
    for (int e = 0; e < P; ++e) {
      const int c = p * P + e;
      if (c < C) row[c] = x.v[e];
    }
  }
}

// x = round(x + y), element-wise: add_kernel's arithmetic.
template <class T>
__device__ __forceinline__ void add_packs(Pack<T>& x, const Pack<T>& y) {
#pragma unroll
  for (int e = 0; e < kPack<T>; ++e) x.v[e] = from_float<T>(to_float(x.v[e]) + to_float(y.v[e]));
}
template <class T>
__device__ __forceinline__ void add_squares(float& ss, const Pack<T>& x) {
#pragma unroll
  for (int e = 0; e < kPack<T>; ++e) {
    const float v = to_float(x.v[e]);
    ss = fmaf(v, v, ss);
  }
}

// out (N, C), rstd (N) = rmsnorm of x (N, C) with weight (C); x = a, or when kFused
// x = sum (N, C) = round(a + b), written here. One warp per row. sum may be a or b and
// out may be any of them (in place): each element is read before it is written, by the
// lane that owns it.
template <class T, bool kFused, bool kVec>
__global__ void __launch_bounds__(kFwdWarps * 32)
    rmsnorm_forward_kernel(T* sum, T* out, float* rstd, const T* a, const T* b, const T* weight, int N, int C,
                           float eps) {
  const int row = blockIdx.x * kFwdWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  constexpr int P = kPack<T>;
  const int packs = (C + P - 1) / P;
  const size_t off = size_t(row) * C;
  // Pass 1: x and its sum of squares. All loads of the cached packs are issued before
  // the first store of sum, so they are in flight together.
  Pack<T> cache[kCachePacks];
#pragma unroll
  for (int k = 0; k < kCachePacks; ++k)
    if (lane + 32 * k < packs) cache[k] = load_row_pack<kVec>(a + off, lane + 32 * k, C);
  if constexpr (kFused) {
    Pack<T> other[kCachePacks];
#pragma unroll
    for (int k = 0; k < kCachePacks; ++k)
      if (lane + 32 * k < packs) other[k] = load_row_pack<kVec>(b + off, lane + 32 * k, C);
#pragma unroll
    for (int k = 0; k < kCachePacks; ++k)
      if (lane + 32 * k < packs) {
        add_packs(cache[k], other[k]);
        store_row_pack<kVec>(sum + off, lane + 32 * k, C, cache[k]);
      }
  }
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kCachePacks; ++k)
    if (lane + 32 * k < packs) add_squares(ss, cache[k]);
  for (int p = lane + 32 * kCachePacks; p < packs; p += 32) {  // rows past the cache
    Pack<T> x = load_row_pack<kVec>(a + off, p, C);
    if constexpr (kFused) {
      add_packs(x, load_row_pack<kVec>(b + off, p, C));
      store_row_pack<kVec>(sum + off, p, C, x);
    }
    add_squares(ss, x);
  }
  ss = warp_sum(ss);
  const float rs = 1.0f / sqrtf(ss / C + eps);
  // Pass 2: out = x * rs * w.
  auto write = [&](int p, const Pack<T>& x) {
    const Pack<T> w = load_row_pack<kVec>(weight, p, C);
    Pack<T> y;
#pragma unroll
    for (int e = 0; e < P; ++e) y.v[e] = from_float<T>(to_float(x.v[e]) * rs * to_float(w.v[e]));
    store_row_pack<kVec>(out + off, p, C, y);
  };
#pragma unroll
  for (int k = 0; k < kCachePacks; ++k)
    if (lane + 32 * k < packs) write(lane + 32 * k, cache[k]);
  const T* x_src = kFused ? sum : a;  // the (rounded) x this lane wrote or read in pass 1
  for (int p = lane + 32 * kCachePacks; p < packs; p += 32) write(p, load_row_pack<kVec>(x_src + off, p, C));
  if (lane == 0) rstd[row] = rs;
}

// dinp (N, C) += rs * (g - xh * mean(g * xh)), g = dy * w, xh = x * rs, for the rows
// [blockIdx.x * rows_per_block, +rows_per_block) of N, and part (gridDim.x, C) row
// blockIdx.x = Σ over those rows of dy * xh. blockDim.x = packs rounded up to a warp
// (<= kBwdMaxThreads): thread t owns pack t of every row, so it keeps its columns' dweight sums in
// registers and writes them once, and holds its weight pack throughout. The block
// takes kBwdRows rows per step (all their loads in flight together) and sums each
// row's dot over its warps in warp order.
template <class T, bool kVec>
__global__ void __launch_bounds__(kBwdMaxThreads)
    rmsnorm_backward_kernel(T* dinp, float* part, const T* dout, const T* inp, const T* weight, const float* rstd,
                            int N, int C, int rows_per_block) {
  constexpr int P = kPack<T>, U = kBwdRows;
  __shared__ float s_dot[32][U];
  const int t = threadIdx.x, lane = t % 32, warp = t / 32, warps = blockDim.x / 32;
  const int packs = (C + P - 1) / P;
  const bool mine = t < packs;
  const int r0 = blockIdx.x * rows_per_block, r1 = min(N, r0 + rows_per_block);
  Pack<T> w;
  if (mine) w = load_row_pack<kVec>(weight, t, C);
  float dw[P];
#pragma unroll
  for (int e = 0; e < P; ++e) dw[e] = 0.0f;

  for (int r = r0; r < r1; r += U) {
    Pack<T> xs[U], dys[U], ds[U];
    float rs[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      rs[u] = 0.0f;
      if (r + u < r1) {
        rs[u] = rstd[r + u];
        if (mine) {
          const size_t off = size_t(r + u) * C;
          xs[u] = load_row_pack<kVec>(inp + off, t, C);
          dys[u] = load_row_pack<kVec>(dout + off, t, C);
          ds[u] = load_row_pack<kVec>(dinp + off, t, C);
        }
      }
    }
    float dot[U];  // Σ g * xh over this thread's columns (padding and absent rows add 0)
#pragma unroll
    for (int u = 0; u < U; ++u) {
      dot[u] = 0.0f;
      if (mine && r + u < r1) {
#pragma unroll
        for (int e = 0; e < P; ++e) {
          const float dy = to_float(dys[u].v[e]), xh = to_float(xs[u].v[e]) * rs[u];
          dot[u] += dy * to_float(w.v[e]) * xh;
          dw[e] += dy * xh;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) dot[u] = warp_sum(dot[u]);
    if (lane == 0)
#pragma unroll
      for (int u = 0; u < U; ++u) s_dot[warp][u] = dot[u];
    __syncthreads();
    float mean[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float sum = 0.0f;
      for (int i = 0; i < warps; ++i) sum += s_dot[i][u];
      mean[u] = sum / C;
    }
    __syncthreads();  // s_dot is written again by the next step
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (mine && r + u < r1) {
#pragma unroll
        for (int e = 0; e < P; ++e) {
          const float dy = to_float(dys[u].v[e]), xh = to_float(xs[u].v[e]) * rs[u];
          const float d = rs[u] * (dy * to_float(w.v[e]) - xh * mean[u]);
          ds[u].v[e] = from_float<T>(to_float(ds[u].v[e]) + d);
        }
        store_row_pack<kVec>(dinp + size_t(r + u) * C, t, C, ds[u]);
      }
  }
  if (mine) {
    float* out = part + size_t(blockIdx.x) * C;
#pragma unroll
    for (int e = 0; e < P; ++e)
      if (t * P + e < C) out[t * P + e] = dw[e];
  }
}

// dweight (C) += Σ_k part (blocks, C) in a fixed order: thread (x, y) of a 32 x 32 block
// sums rows y, y + 32, ... of column blockIdx.x * 32 + x; then y = 0 adds the 32 sums
// in order of y.
__global__ void __launch_bounds__(1024) dweight_finish_kernel(float* dweight, const float* part, int blocks, int C) {
  __shared__ float s[32][33];
  const int x = threadIdx.x, y = threadIdx.y, c = blockIdx.x * 32 + x;
  float acc = 0.0f;
  if (c < C)
#pragma unroll 4
    for (int k = y; k < blocks; k += 32) acc += part[size_t(k) * C + c];
  s[y][x] = acc;
  __syncthreads();
  if (y == 0 && c < C) {
    float t = 0.0f;
    for (int i = 0; i < 32; ++i) t += s[i][x];
    dweight[c] += t;
  }
}

// The older path for rows too long for the registers: dinp one warp per row ...
constexpr int kLegacyRows = 8;  // warps per block, one row each

template <class T>
__global__ void rmsnorm_backward_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* weight,
                                             const float* rstd, int N, int C) {
  const int row = blockIdx.x * kLegacyRows + threadIdx.x / 32, lane = threadIdx.x % 32;
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

// ... and dweight by the column reduction of reduce.cuh.
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

template <class T, bool kFused>
void launch_forward(T* sum, T* out, float* rstd, const T* a, const T* b, const T* weight, int N, int C, float eps,
                    cudaStream_t stream) {
  const bool vec = C % kPack<T> == 0 && aligned16(out) && aligned16(a) && aligned16(weight) &&
                   (!kFused || (aligned16(sum) && aligned16(b)));
  const int blocks = (N + kFwdWarps - 1) / kFwdWarps;
  if (vec)
    rmsnorm_forward_kernel<T, kFused, true><<<blocks, kFwdWarps * 32, 0, stream>>>(sum, out, rstd, a, b, weight, N,
                                                                                   C, eps);
  else
    rmsnorm_forward_kernel<T, kFused, false><<<blocks, kFwdWarps * 32, 0, stream>>>(sum, out, rstd, a, b, weight, N,
                                                                                    C, eps);
  ST_CUDA_LAUNCHED("rmsnorm_forward_kernel");
}

int sm_count() {
  int dev = 0, sms = 0;
  ST_CUDA(cudaGetDevice(&dev));
  ST_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return std::max(sms, 1);
}

template <class T, bool kVec>
void launch_backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight, const float* rstd, int N,
                     int C, DeviceScratch& scratch, cudaStream_t stream) {
  auto kernel = rmsnorm_backward_kernel<T, kVec>;
  const int threads = ((C + kPack<T> - 1) / kPack<T> + 31) / 32 * 32;
  int per_sm = 0;  // resident blocks per SM: the grid is one full wave
  ST_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  int blocks = std::min((N + kBwdRows - 1) / kBwdRows, sm_count() * std::max(per_sm, 1));
  const int rows_per_block = (N + blocks - 1) / blocks;
  blocks = (N + rows_per_block - 1) / rows_per_block;
  float* part = static_cast<float*>(scratch_reserve(scratch, size_t(blocks) * C * sizeof(float), stream));
  kernel<<<blocks, threads, 0, stream>>>(dinp, part, dout, inp, weight, rstd, N, C, rows_per_block);
  ST_CUDA_LAUNCHED("rmsnorm_backward_kernel");
  dweight_finish_kernel<<<(C + 31) / 32, dim3(32, 32), 0, stream>>>(dweight, part, blocks, C);
  ST_CUDA_LAUNCHED("dweight_finish_kernel");
}

}  // namespace

void* scratch_reserve(DeviceScratch& s, size_t bytes, cudaStream_t stream) {
  if (bytes <= s.bytes) return s.ptr;
  if (s.ptr) {
    ST_CUDA(cudaFreeAsync(s.ptr, stream));  // after the work already enqueued that reads it
    s.ptr = nullptr, s.bytes = 0;
  }
  ST_CUDA(cudaMallocAsync(&s.ptr, bytes, stream));
  s.bytes = bytes;
  return s.ptr;
}

void scratch_release(DeviceScratch& s, cudaStream_t stream) noexcept {
  if (s.ptr) (void)cudaFreeAsync(s.ptr, stream);
  s.ptr = nullptr, s.bytes = 0;
}

template <class T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, int N, int C, float eps,
                     cudaStream_t stream) {
  launch_forward<T, false>(nullptr, out, rstd, inp, nullptr, weight, N, C, eps, stream);
}

template <class T>
void add_rmsnorm_forward(T* sum, T* out, float* rstd, const T* a, const T* b, const T* weight, int N, int C, float eps,
                         cudaStream_t stream) {
  launch_forward<T, true>(sum, out, rstd, a, b, weight, N, C, eps, stream);
}

template <class T>
void rmsnorm_backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight, const float* rstd,
                      int N, int C, DeviceScratch& scratch, cudaStream_t stream) {
  constexpr int P = kPack<T>;
  if ((C + P - 1) / P <= kBwdMaxThreads) {  // a thread per pack of the row
    if (C % P == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(weight))
      launch_backward<T, true>(dinp, dweight, dout, inp, weight, rstd, N, C, scratch, stream);
    else
      launch_backward<T, false>(dinp, dweight, dout, inp, weight, rstd, N, C, scratch, stream);
    return;
  }
  const int blocks = (N + kLegacyRows - 1) / kLegacyRows;
  rmsnorm_backward_dinp_kernel<<<blocks, kLegacyRows * 32, 0, stream>>>(dinp, dout, inp, weight, rstd, N, C);
  ST_CUDA_LAUNCHED("rmsnorm_backward_dinp_kernel");
  column_reduce_add(dweight, DweightTerm<T>{dout, inp, rstd, C}, N, C, stream);
}

#define ST_CUDA_NORM(T)                                                                                           \
  template void rmsnorm_forward<T>(T*, float*, const T*, const T*, int, int, float, cudaStream_t);               \
  template void add_rmsnorm_forward<T>(T*, T*, float*, const T*, const T*, const T*, int, int, float, cudaStream_t); \
  template void rmsnorm_backward<T>(T*, float*, const T*, const T*, const T*, const float*, int, int, DeviceScratch&, \
                                    cudaStream_t);
ST_CUDA_NORM(float)
ST_CUDA_NORM(bf16)
#undef ST_CUDA_NORM

}  // namespace st::cuda

// Fused cross-entropy forward + backward over logits (N, V), in place. One block of
// 1024 threads per row; the row moves in 16-byte packs (8 bf16), with the few
// elements before the first 16-byte boundary and after the last whole pack handled
// one by one, so any V and any row alignment work.
//   Pass 1 reads the row once, last pack first, keeping per thread an online
//   (max, sum of exp) in base 2 (y = x·log2 e, so each element costs one ex2), merged
//   across the block in a fixed order: lse and the loss.
//   Pass 2 (grad only) reads the row again, first pack first, and overwrites it with
//   dloss_scale * (softmax - onehot). Pass 1 ends with the row's head, so pass 2 starts
//   on the part most recently read, the most likely still in L2; pass 2's loads and
//   stores carry the streaming (evict-first) hint, since the row is never read again.
// Reads 2x and writes 1x the row: V = 151936 bf16 logits are 297 KB a row. The kernel
// takes ~50 registers a thread, so one block (row) per SM is resident: ~132 rows,
// ~40 MB, in flight, which gives pass 2's re-read a fair chance in a 50 MB L2.
// With dq (cross_entropy_fp8), pass 2 also writes each gradient value, as stored,
// times the given scale s, as e5m2 (a pack's bytes in one store where aligned); with
// keep false it writes only that copy, not the gradient itself (each value still
// rounded to T first, so the codes are the same).
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/stochastic_round.h"

namespace st::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kUnroll = 4;  // packs a thread loads before using them (memory-level parallelism)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Online log-sum-exp state in base 2: s = Σ 2^(y - m) over the values y seen, m their max.
struct MaxSum {
  float m, s;
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  if (a.m == -INFINITY) return b;  // also avoids exp2(-inf - -inf) = nan
  if (b.m == -INFINITY) return a;
  const float m = fmaxf(a.m, b.m);
  return {m, a.s * exp2f(a.m - m) + b.s * exp2f(b.m - m)};
}

// Adds n values y (already scaled by log2 e) to st: one rescale for the group at most.
template <int n>
__device__ __forceinline__ void absorb(MaxSum& st, const float* y) {
  float mx = y[0];
#pragma unroll
  for (int e = 1; e < n; ++e) mx = fmaxf(mx, y[e]);
  if (mx > st.m) {
    st.s *= exp2f(st.m - mx);  // st.m = -inf: st.s is 0 and stays 0
    st.m = mx;
  }
#pragma unroll
  for (int e = 0; e < n; ++e) st.s += exp2f(y[e] - st.m);
}

// The split of a row of V elements at address `row` into a scalar head (up to the
// first 16-byte boundary), whole packs, and a scalar tail.
struct RowSplit {
  int head, packs, tail_start;
};
template <class T>
__device__ __forceinline__ RowSplit split_row(const T* row, int V) {
  constexpr int P = kPack<T>;
  const unsigned mis = unsigned(reinterpret_cast<uintptr_t>(row) % 16);
  int head = mis == 0 ? 0 : int((16 - mis) / sizeof(T));
  if (mis % sizeof(T) != 0 || head > V) head = V;  // (never for T arrays) all scalar
  const int packs = (V - head) / P;
  return {head, packs, head + packs * P};
}

// losses (N) F32; logits (N, V) in, dlogits out when grad; targets (N), in [0, V) or
// ignore_index (the backend checks them first; a row whose target is neither gets a
// NaN loss and no onehot term, rather than a read out of bounds).
__device__ __forceinline__ uint8_t to_e5m2(float v) { return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2); }

// A pack of gradient values (as stored) times s, as e5m2 at q (aligned: one store).
// round_key nonzero: each value first rounded stochastically to e5m2's grid, element g0 + e
// of the stream (one 64-bit draw per 8 elements where g0 is a multiple of 8).
template <class T>
__device__ __forceinline__ void store_e5m2(uint8_t* q, const Pack<T>& v, float s, bool aligned, uint64_t round_key,
                                           uint64_t g0) {
  constexpr int P = kPack<T>;
  __align__(8) uint16_t b[P / 2];
  float f[P];
#pragma unroll
  for (int e = 0; e < P; ++e) f[e] = to_float(v.v[e]) * s;
  if (round_key) {
    if (g0 % 8 == 0) {  // P <= 8: one draw covers the pack
      const uint64_t bits = counter_bits(round_key, g0 >> 3);
#pragma unroll
      for (int e = 0; e < P; ++e) f[e] = e5m2_round_stochastic(f[e], uint32_t(bits >> (8 * e)) & 0xffu);
    } else {
#pragma unroll
      for (int e = 0; e < P; ++e) f[e] = e5m2_round_stochastic(f[e], random8(round_key, g0 + e));
    }
  }
#pragma unroll
  for (int e = 0; e < P; e += 2)
    b[e / 2] = __nv_cvt_float2_to_fp8x2(make_float2(f[e], f[e + 1]), __NV_SATFINITE, __NV_E5M2);
  if (aligned) {
    if constexpr (P == 8)
      *reinterpret_cast<uint2*>(q) = *reinterpret_cast<const uint2*>(b);
    else
      *reinterpret_cast<uint32_t*>(q) = *reinterpret_cast<const uint32_t*>(b);
  } else {
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(b);
#pragma unroll
    for (int e = 0; e < P; ++e) q[e] = bytes[e];
  }
}

// dq, when not null: (N, V) e5m2 = fp8(dlogits * s), and *inv_scale = 1 / s (grad only);
// keep false (dq only): the logits are not overwritten with dlogits.
template <class T>
__global__ void __launch_bounds__(kThreads) cross_entropy_kernel(float* losses, T* logits, const int32_t* targets,
                                                                 int V, int ignore_index, float dloss_scale,
                                                                 bool grad, uint8_t* dq, float s, float* inv_scale,
                                                                 bool keep, uint64_t round_key) {
  constexpr int P = kPack<T>;
  __shared__ MaxSum shared[kThreads / 32];
  __shared__ float s_lse2;
  const int r = blockIdx.x;
  T* x = logits + size_t(r) * V;
  const RowSplit sp = split_row(x, V);
  T* body = x + sp.head;  // 16-byte aligned
  const int tgt = targets[r];
  uint8_t* q = dq ? dq + size_t(r) * V : nullptr;
  const bool q_aligned = q && reinterpret_cast<uintptr_t>(q + sp.head) % P == 0;
  if (q && r == 0 && threadIdx.x == 0) *inv_scale = 1.0f / s;
  if (tgt == ignore_index) {
    if (threadIdx.x == 0) losses[r] = 0.0f;
    if (grad) {
      Pack<T> z;
#pragma unroll
      for (int e = 0; e < P; ++e) z.v[e] = from_float<T>(0.0f);
      for (int k = threadIdx.x; k < sp.packs; k += kThreads) store_pack_cs(body + size_t(k) * P, z);
      for (int i = threadIdx.x; i < sp.head; i += kThreads) x[i] = from_float<T>(0.0f);
      for (int i = sp.tail_start + threadIdx.x; i < V; i += kThreads) x[i] = from_float<T>(0.0f);
      if (q)
        for (int i = threadIdx.x; i < V; i += kThreads) q[i] = 0;
    }
    return;
  }

  // Pass 1: the scalar ends, then the packs from the last one down.
  MaxSum st{-INFINITY, 0.0f};
  for (int i = threadIdx.x; i < sp.head; i += kThreads) {
    const float y = to_float(x[i]) * kLog2e;
    absorb<1>(st, &y);
  }
  for (int i = sp.tail_start + threadIdx.x; i < V; i += kThreads) {
    const float y = to_float(x[i]) * kLog2e;
    absorb<1>(st, &y);
  }
  for (int k0 = sp.packs - 1 - int(threadIdx.x); k0 >= 0; k0 -= kUnroll * kThreads) {
    Pack<T> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (k0 - u * kThreads >= 0) v[u] = load_pack(body + size_t(k0 - u * kThreads) * P);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (k0 - u * kThreads >= 0) {
        float y[P];
#pragma unroll
        for (int e = 0; e < P; ++e) y[e] = to_float(v[u].v[e]) * kLog2e;
        absorb<P>(st, y);
      }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const MaxSum other{__shfl_xor_sync(0xffffffffu, st.m, o), __shfl_xor_sync(0xffffffffu, st.s, o)};
    st = merge(st, other);
  }
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = st;
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxSum all = shared[0];
    for (int w = 1; w < kThreads / 32; ++w) all = merge(all, shared[w]);
    const float lse2 = all.m + log2f(all.s);
    s_lse2 = lse2;
    // Read before any thread overwrites the row (they wait at the barrier below).
    losses[r] = tgt >= 0 && tgt < V ? lse2 * kLn2 - to_float(x[tgt]) : NAN;
  }
  __syncthreads();
  if (!grad) return;

  // Pass 2: dloss_scale * (softmax - onehot), first pack first.
  const float lse2 = s_lse2;
  auto grad_of = [&](float v, int i) {
    const float p = exp2f(fmaf(v, kLog2e, -lse2));
    return dloss_scale * (i == tgt ? p - 1.0f : p);
  };
  auto scalar = [&](int i) {
    const T g = from_float<T>(grad_of(to_float(x[i]), i));
    if (keep) x[i] = g;
    if (q) {
      const float f = to_float(g) * s;
      q[i] = to_e5m2(round_key ? e5m2_round_stochastic(f, random8(round_key, size_t(r) * V + i)) : f);
    }
  };
  for (int i = threadIdx.x; i < sp.head; i += kThreads) scalar(i);
  for (int i = sp.tail_start + threadIdx.x; i < V; i += kThreads) scalar(i);
  for (int k0 = threadIdx.x; k0 < sp.packs; k0 += kUnroll * kThreads) {
    Pack<T> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (k0 + u * kThreads < sp.packs) v[u] = load_pack_cs(body + size_t(k0 + u * kThreads) * P);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int k = k0 + u * kThreads;
      if (k < sp.packs) {
        const int i0 = sp.head + k * P;
#pragma unroll
        for (int e = 0; e < P; ++e) v[u].v[e] = from_float<T>(grad_of(to_float(v[u].v[e]), i0 + e));
        if (keep) store_pack_cs(body + size_t(k) * P, v[u]);
        if (q) store_e5m2(q + i0, v[u], s, q_aligned, round_key, size_t(r) * V + i0);
      }
    }
  }
}

}  // namespace

template <class T>
void cross_entropy(float* losses, T* logits, const int32_t* targets, int N, int V, int ignore_index,
                   float dloss_scale, bool grad, cudaStream_t stream, uint8_t* dq, float dq_scale, float* dq_inv,
                   bool keep_dlogits, uint64_t round_key) {
  cross_entropy_kernel<<<N, kThreads, 0, stream>>>(losses, logits, targets, V, ignore_index, dloss_scale, grad,
                                                   grad ? dq : nullptr, dq_scale, dq_inv, keep_dlogits || !dq,
                                                   round_key);
  ST_CUDA_LAUNCHED("cross_entropy_kernel");
}

template void cross_entropy<float>(float*, float*, const int32_t*, int, int, int, float, bool, cudaStream_t, uint8_t*,
                                   float, float*, bool, uint64_t);
template void cross_entropy<bf16>(float*, bf16*, const int32_t*, int, int, int, float, bool, cudaStream_t, uint8_t*,
                                  float, float*, bool, uint64_t);

}  // namespace st::cuda

// Causal grouped-query flash attention (FlashAttention-2 structure), forward and
// backward, never materialising a T x T matrix.
//
// Tiles. Every block works on 16-row slices per warp: the forward and the dQ pass
// take a query tile of 16*W rows per (b, h) and stream key/value tiles through
// shared memory; the dK/dV pass takes a key tile of 16*W keys per (b, kv head g)
// and streams query tiles of every head of its group (so GQA needs no atomics).
//   forward : S = Q Kᵀ · scale, online softmax (running max m and sum l per row),
//             O = Σ P V rescaled as m grows; writes O / l and lse = m + log l.
//   backward: D = rowsum(dO ∘ O); P = exp(S - lse) recomputed, dP = dO Vᵀ,
//             dS = P ∘ (dP - D);  dV = Σ Pᵀ dO,  dK = scale Σ dSᵀ Q  (one kernel),
//             dQ = scale Σ dS K (a second kernel: no atomics, deterministic).
//
// The tile products go through a "Math" policy with two implementations:
//   WmmaMath: bf16 tiles, tensor cores (WMMA m16n16k16, fp32 accumulation) for the
//             BF16 path. P and dS are rounded to bf16 before their products, as in
//             FlashAttention.
//   SimtMath: float tiles and plain FMAs for the all-F32 path (test oracle quality).
// Head dims are padded with zeros to HDP in {32, 64, 128} in shared memory, so any
// hd <= 128 works; rows past T are zero-filled and masked.
//
// These kernels serve the all-F32 path and head dims other than 64 and 128; BF16 at
// hd 64 / 128 goes to the FlashAttention-2 kernels of attention_fa2*.cu (cuda_backend.cpp
// picks; SHARDTRAIN_ATTENTION=legacy forces these).
//
// Speed (H200, B=4 T=2048 H=12 KV=2 hd=128, bf16): forward 1.18 ms (44 TFLOP/s),
// backward 3.9 ms (33 TFLOP/s); FlashAttention-2 does several times better. Known
// limits: tile loads are synchronous (no cp.async / TMA double buffering), score
// tiles make a round trip through shared memory for the softmax, WMMA rather than
// mma.sync/wgmma, and the dQ pass recomputes S and dP that the dK/dV pass computed.
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_utils.cuh"

namespace st::cuda {
namespace {

namespace wmma = nvcuda::wmma;

// ---- tile math policies ------------------------------------------------------------
// A warp owns 16 rows. Two products:
//   scores<N>(Sm, A, B): Sm (16 x N, float smem) = A (16 x HDP) · Bᵀ, B (N x HDP) row-major
//   mma<K>(acc, A, B):   acc (16 x HDP, registers) += A (16 x K) · B (K x HDP), both row-major
// and the accumulator operations: zero, scale, scale_rows(per-row factors), store.

template <int HDP>
struct SimtMath {
  using S = float;                 // shared-memory element type
  static constexpr int kPad = 1;   // odd float row stride: column walks hit 32 different banks
  struct Map {};                   // lane -> row map (WMMA only)
  __device__ static void init_map(Map&, const float*) {}
  // Lane l holds columns l + 32 j of all 16 rows.
  struct Acc {
    float x[16][HDP / 32];
  };
  __device__ static void zero(Acc& a) {
#pragma unroll
    for (int r = 0; r < 16; ++r)
#pragma unroll
      for (int j = 0; j < HDP / 32; ++j) a.x[r][j] = 0.0f;
  }
  __device__ static void scale(Acc& a, float s) {
#pragma unroll
    for (int r = 0; r < 16; ++r)
#pragma unroll
      for (int j = 0; j < HDP / 32; ++j) a.x[r][j] *= s;
  }
  __device__ static void scale_rows(Acc& a, const Map&, const float* f) {
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const float s = f[r];
#pragma unroll
      for (int j = 0; j < HDP / 32; ++j) a.x[r][j] *= s;
    }
  }
  __device__ static void store(const Acc& a, float* dst, int ld) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < 16; ++r)
#pragma unroll
      for (int j = 0; j < HDP / 32; ++j) dst[r * ld + lane + 32 * j] = a.x[r][j];
  }
  template <int N>
  __device__ static void scores(float* Sm, int lds, const float* A, int lda, const float* B, int ldb) {
    static_assert(N % 32 == 0, "SIMT score tiles are a multiple of 32 columns");
    const int lane = threadIdx.x & 31;
    float acc[16][N / 32];
#pragma unroll
    for (int r = 0; r < 16; ++r)
#pragma unroll
      for (int j = 0; j < N / 32; ++j) acc[r][j] = 0.0f;
#pragma unroll 2
    for (int k = 0; k < HDP; ++k) {
      float b[N / 32];
#pragma unroll
      for (int j = 0; j < N / 32; ++j) b[j] = B[(lane + 32 * j) * ldb + k];
#pragma unroll
      for (int r = 0; r < 16; ++r) {
        const float a = A[r * lda + k];  // broadcast
#pragma unroll
        for (int j = 0; j < N / 32; ++j) acc[r][j] += a * b[j];
      }
    }
#pragma unroll
    for (int r = 0; r < 16; ++r)
#pragma unroll
      for (int j = 0; j < N / 32; ++j) Sm[r * lds + lane + 32 * j] = acc[r][j];
  }
  template <int K>
  __device__ static void mma(Acc& acc, const float* A, int lda, const float* B, int ldb) {
    const int lane = threadIdx.x & 31;
#pragma unroll 2
    for (int k = 0; k < K; ++k) {
      float b[HDP / 32];
#pragma unroll
      for (int j = 0; j < HDP / 32; ++j) b[j] = B[k * ldb + lane + 32 * j];
#pragma unroll
      for (int r = 0; r < 16; ++r) {
        const float a = A[r * lda + k];
#pragma unroll
        for (int j = 0; j < HDP / 32; ++j) acc.x[r][j] += a * b[j];
      }
    }
  }
};

template <int HDP>
struct WmmaMath {
  using S = bf16;
  static constexpr int kPad = 8;  // WMMA wants a row stride of a multiple of 8 bf16; +8 staggers banks
  using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
  using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
  using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
  using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
  static constexpr int kElems = FragC::num_elements;
  // The accumulator layout is opaque, but fixed per fragment type: loading the
  // matrix M[r][c] = 16 r + c tells each lane which row its element e belongs to,
  // which is all that a per-row rescale (online softmax) needs.
  struct Map {
    int row[kElems];
  };
  __device__ static void init_map(Map& m, const float* table /* 16 x 16 smem, M[r][c] = 16 r + c */) {
    FragC f;
    wmma::load_matrix_sync(f, table, 16, wmma::mem_row_major);
#pragma unroll
    for (int e = 0; e < kElems; ++e) m.row[e] = int(f.x[e]) >> 4;
  }
  struct Acc {
    FragC f[HDP / 16];  // columns 16 n .. 16 n + 15
  };
  __device__ static void zero(Acc& a) {
#pragma unroll
    for (int n = 0; n < HDP / 16; ++n) wmma::fill_fragment(a.f[n], 0.0f);
  }
  __device__ static void scale(Acc& a, float s) {
#pragma unroll
    for (int n = 0; n < HDP / 16; ++n)
#pragma unroll
      for (int e = 0; e < kElems; ++e) a.f[n].x[e] *= s;
  }
  __device__ static void scale_rows(Acc& a, const Map& m, const float* f) {
#pragma unroll
    for (int n = 0; n < HDP / 16; ++n)
#pragma unroll
      for (int e = 0; e < kElems; ++e) a.f[n].x[e] *= f[m.row[e]];
  }
  __device__ static void store(const Acc& a, float* dst, int ld) {
#pragma unroll
    for (int n = 0; n < HDP / 16; ++n) wmma::store_matrix_sync(dst + 16 * n, a.f[n], ld, wmma::mem_row_major);
  }
  template <int N>
  __device__ static void scores(float* Sm, int lds, const bf16* A, int lda, const bf16* B, int ldb) {
    static_assert(N % 16 == 0, "WMMA score tiles are a multiple of 16 columns");
    FragA a[HDP / 16];
#pragma unroll
    for (int k = 0; k < HDP / 16; ++k) wmma::load_matrix_sync(a[k], A + 16 * k, lda);
#pragma unroll
    for (int n = 0; n < N / 16; ++n) {
      FragC c;
      wmma::fill_fragment(c, 0.0f);
#pragma unroll
      for (int k = 0; k < HDP / 16; ++k) {
        FragBCol b;  // (k, n) at B[n][k]: Bᵀ without a transpose
        wmma::load_matrix_sync(b, B + 16 * n * ldb + 16 * k, ldb);
        wmma::mma_sync(c, a[k], b, c);
      }
      wmma::store_matrix_sync(Sm + 16 * n, c, lds, wmma::mem_row_major);
    }
  }
  template <int K>
  __device__ static void mma(Acc& acc, const bf16* A, int lda, const bf16* B, int ldb) {
    static_assert(K % 16 == 0, "WMMA reduction length is a multiple of 16");
#pragma unroll
    for (int k = 0; k < K / 16; ++k) {
      FragA a;
      wmma::load_matrix_sync(a, A + 16 * k, lda);
#pragma unroll
      for (int n = 0; n < HDP / 16; ++n) {
        FragBRow b;
        wmma::load_matrix_sync(b, B + 16 * k * ldb + 16 * n, ldb);
        wmma::mma_sync(acc.f[n], a, b, acc.f[n]);
      }
    }
  }
};

// ---- shared-memory layout -----------------------------------------------------------

__host__ __device__ constexpr size_t align128(size_t x) { return (x + 127) / 128 * 128; }

// Regions of one kernel's dynamic shared memory, in bytes, each 128-byte aligned.
//   tiles: `rows` rows of S elements with stride LD (Q, K, V, dO tiles back to back);
//          reused after the main loop to stage the float output (W warps x 16 x HDP).
//   score: per warp, `nscore` float tiles of 16 x (N + 4)
//   prob : per warp, `nprob` S tiles of 16 x (N + kPad)
//   rowv : 2 x 16 W floats (per-row statistics), map: the 16 x 16 WMMA probe table.
template <class M, int HDP, int W, int N>
struct Layout {
  using S = typename M::S;
  static constexpr int LD = HDP + M::kPad;  // Q/K/V/dO tile stride (elements)
  static constexpr int LDS = N + 4;         // score tile stride (floats; WMMA wants a multiple of 4)
  static constexpr int LDP = N + M::kPad;   // P / dS tile stride (elements)
  static constexpr int LDO = HDP + 4;       // output staging stride (floats)
  __host__ __device__ static constexpr size_t tiles(int rows) {
    const size_t in = size_t(rows) * LD * sizeof(S), out = size_t(W) * 16 * LDO * sizeof(float);
    return align128(in > out ? in : out);
  }
  __host__ __device__ static constexpr size_t score(int nscore) { return align128(size_t(nscore) * W * 16 * LDS * sizeof(float)); }
  __host__ __device__ static constexpr size_t prob(int nprob) { return align128(size_t(nprob) * W * 16 * LDP * sizeof(S)); }
  static constexpr size_t rowv = align128(2 * 16 * W * sizeof(float));
  static constexpr size_t map = align128(256 * sizeof(float));
  __host__ __device__ static constexpr size_t total(int rows, int nscore, int nprob) {
    return tiles(rows) + score(nscore) + prob(nprob) + rowv + map;
  }
};

// dst (rows x HDP, stride ld) = src rows [row0, row0 + rows) (stride src_stride, hd
// columns used), zero past T or hd. The whole block cooperates. When rows are 16-byte
// aligned (the usual case: hd a multiple of 8) every thread moves 16 bytes per load,
// several in flight: the kernels spend much of their time waiting on these loads.
template <int HDP, class S, class T>
__device__ void load_tile(S* dst, int ld, const T* src, size_t src_stride, int row0, int rows, int T_, int hd) {
  constexpr int VE = 16 / sizeof(T);  // elements per 16-byte load
  constexpr int CV = HDP / VE;        // loads per tile row
  const bool vec = hd % VE == 0 && src_stride % VE == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0;
  if (vec) {
#pragma unroll 4
    for (int i = threadIdx.x; i < rows * CV; i += blockDim.x) {
      const int r = i / CV, c = (i % CV) * VE, t = row0 + r;
      uint4 u = make_uint4(0, 0, 0, 0);  // all-zero bits: 0.0 in float and bf16
      if (t < T_ && c < hd) u = *reinterpret_cast<const uint4*>(src + size_t(t) * src_stride + c);
      S* d = dst + r * ld + c;
      if constexpr (std::is_same_v<S, T> && sizeof(S) == 2) {
        *reinterpret_cast<uint4*>(d) = u;  // bf16 tiles: ld and c keep 16-byte alignment
      } else {
        const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
        for (int k = 0; k < VE; ++k) d[k] = from_float<S>(to_float(e[k]));
      }
    }
    return;
  }
  for (int i = threadIdx.x; i < rows * HDP; i += blockDim.x) {
    const int r = i / HDP, c = i % HDP, t = row0 + r;
    const float v = (t < T_ && c < hd) ? to_float(src[size_t(t) * src_stride + c]) : 0.0f;
    dst[r * ld + c] = from_float<S>(v);
  }
}

__device__ void fill_probe_table(float* table) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x) table[i] = float(i);
}

// ---- forward --------------------------------------------------------------------------
// Grid (query tiles, H, B), W warps. out (B*T, H*hd), lse (B, H, T), qkv (B*T, (H+2KV)*hd).

template <class M, class T, int HDP, int W, int BC>
__global__ void __launch_bounds__(W * 32)
    attn_forward_kernel(T* out, float* lse, const T* qkv, int T_, int H, int KV, int hd, float scale) {
  using S = typename M::S;
  using L = Layout<M, HDP, W, BC>;
  constexpr int BR = 16 * W;
  extern __shared__ __align__(128) unsigned char smem[];
  S* sq = reinterpret_cast<S*>(smem);  // (BR, HDP)
  S* sk = sq + BR * L::LD;             // (BC, HDP)
  S* sv = sk + BC * L::LD;             // (BC, HDP)
  float* s_score = reinterpret_cast<float*>(smem + L::tiles(BR + 2 * BC));
  S* s_prob = reinterpret_cast<S*>(smem + L::tiles(BR + 2 * BC) + L::score(1));
  float* s_row = reinterpret_cast<float*>(smem + L::tiles(BR + 2 * BC) + L::score(1) + L::prob(1));
  float* s_map = s_row + L::rowv / sizeof(float);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * BR;  // longest (latest) tiles first
  const int h = blockIdx.y, b = blockIdx.z, g = h / (H / KV);
  const size_t row_len = size_t(H + 2 * KV) * hd;
  const T* base = qkv + size_t(b) * T_ * row_len;

  load_tile<HDP>(sq, L::LD, base + size_t(h) * hd, row_len, q0, BR, T_, hd);
  fill_probe_table(s_map);
  __syncthreads();
  typename M::Map map;
  M::init_map(map, s_map);

  float* my_score = s_score + warp * 16 * L::LDS;  // (16, BC)
  S* my_prob = s_prob + warp * 16 * L::LDP;        // (16, BC)
  float* my_alpha = s_row + warp * 16;             // (16)
  // Softmax bookkeeping: lanes 2r and 2r+1 own row r of this warp, half a tile each.
  const int r = lane >> 1, half = lane & 1;
  const int t = q0 + warp * 16 + r;
  float m_run = -INFINITY, l_run = 0.0f;
  typename M::Acc acc;
  M::zero(acc);

  const int kv_end = min(T_, q0 + BR);  // causal: no key past the tile's last query
  for (int k0 = 0; k0 < kv_end; k0 += BC) {
    __syncthreads();  // every warp is done with the previous K/V tile
    load_tile<HDP>(sk, L::LD, base + size_t(H + g) * hd, row_len, k0, BC, T_, hd);
    load_tile<HDP>(sv, L::LD, base + size_t(H + KV + g) * hd, row_len, k0, BC, T_, hd);
    __syncthreads();
    M::template scores<BC>(my_score, L::LDS, sq + warp * 16 * L::LD, L::LD, sk, L::LD);
    __syncwarp();
    float mx = -INFINITY;
#pragma unroll 8
    for (int j = 0; j < BC / 2; ++j) {
      const int n = half * (BC / 2) + j, s = k0 + n;
      const float x = (s <= t && s < T_) ? my_score[r * L::LDS + n] * scale : -INFINITY;
      my_score[r * L::LDS + n] = x;
      mx = fmaxf(mx, x);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    // Key 0 is in the first tile and every row (padding rows t >= T too) sees it, so
    // m_new is finite from the first tile on.
    const float m_new = fmaxf(m_run, mx);
    const float alpha = expf(m_run - m_new);  // 0 on the first tile
    float sum = 0.0f;
#pragma unroll 8
    for (int j = 0; j < BC / 2; ++j) {
      const int n = half * (BC / 2) + j;
      const float p = expf(my_score[r * L::LDS + n] - m_new);
      sum += p;
      my_prob[r * L::LDP + n] = from_float<S>(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l_run = l_run * alpha + sum;
    m_run = m_new;
    if (half == 0) my_alpha[r] = alpha;
    __syncwarp();
    M::scale_rows(acc, map, my_alpha);
    M::template mma<BC>(acc, my_prob, L::LDP, sv, L::LD);
  }

  __syncwarp();
  if (half == 0) my_alpha[r] = 1.0f / l_run;
  __syncwarp();
  M::scale_rows(acc, map, my_alpha);
  __syncthreads();  // the tiles region becomes output staging
  float* staged = reinterpret_cast<float*>(smem) + warp * 16 * L::LDO;  // (16, HDP)
  M::store(acc, staged, L::LDO);
  __syncwarp();
  for (int i = lane; i < 16 * hd; i += 32) {
    const int rr = i / hd, c = i % hd, tt = q0 + warp * 16 + rr;
    if (tt < T_) out[(size_t(b) * T_ + tt) * H * hd + size_t(h) * hd + c] = from_float<T>(staged[rr * L::LDO + c]);
  }
  if (half == 0 && t < T_) lse[(size_t(b) * H + h) * T_ + t] = m_run + logf(l_run);
}

// ---- backward: D = rowsum(dO ∘ O) -----------------------------------------------------
// D (B, H, T); one warp per (row, head).
template <class T>
__global__ void attn_rowdot_kernel(float* D, const T* dout, const T* out, int B, int T_, int H, int hd) {
  const size_t w = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= size_t(B) * T_ * H) return;
  const size_t row = w / H;
  const int h = int(w % H);
  const size_t off = row * H * hd + size_t(h) * hd;
  float s = 0.0f;
  for (int c = lane; c < hd; c += 32) s += to_float(dout[off + c]) * to_float(out[off + c]);
  s = warp_sum(s);
  const size_t b = row / T_, t = row % T_;
  if (lane == 0) D[(b * H + h) * T_ + t] = s;
}

// ---- backward: dK, dV -------------------------------------------------------------------
// Grid (key tiles, KV, B), W warps, each owning 16 keys; query tiles of BR rows.
// dqkv's k and v parts (B*T, (H+2KV)*hd) are written (not added).

template <class M, class T, int HDP, int W, int BR>
__global__ void __launch_bounds__(W * 32)
    attn_backward_dkdv_kernel(T* dqkv, const T* dout, const float* lse, const float* Dsum, const T* qkv, int T_,
                              int H, int KV, int hd, float scale) {
  using S = typename M::S;
  using L = Layout<M, HDP, W, BR>;
  constexpr int BC = 16 * W;
  extern __shared__ __align__(128) unsigned char smem[];
  S* sk = reinterpret_cast<S*>(smem);  // (BC, HDP)
  S* sv = sk + BC * L::LD;             // (BC, HDP)
  S* sq = sv + BC * L::LD;             // (BR, HDP)
  S* sdo = sq + BR * L::LD;            // (BR, HDP)
  const size_t tiles = L::tiles(2 * BC + 2 * BR);
  float* s_score = reinterpret_cast<float*>(smem + tiles);  // per warp: Sᵀ then dPᵀ
  S* s_prob = reinterpret_cast<S*>(smem + tiles + L::score(2));  // per warp: Pᵀ then dSᵀ
  float* s_row = reinterpret_cast<float*>(smem + tiles + L::score(2) + L::prob(2));  // lse (BR), D (BR)
  static_assert(BR <= BC, "the row-statistics region holds 2 x 16W floats");

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int k0 = blockIdx.x * BC, g = blockIdx.y, b = blockIdx.z, group = H / KV;
  const size_t row_len = size_t(H + 2 * KV) * hd;
  const T* base = qkv + size_t(b) * T_ * row_len;
  const T* dbase = dout + size_t(b) * T_ * H * hd;

  load_tile<HDP>(sk, L::LD, base + size_t(H + g) * hd, row_len, k0, BC, T_, hd);
  load_tile<HDP>(sv, L::LD, base + size_t(H + KV + g) * hd, row_len, k0, BC, T_, hd);

  float* my_st = s_score + warp * 2 * 16 * L::LDS;  // Sᵀ (16 keys, BR queries)
  float* my_dpt = my_st + 16 * L::LDS;              // dPᵀ
  S* my_pt = s_prob + warp * 2 * 16 * L::LDP;       // Pᵀ
  S* my_dst = my_pt + 16 * L::LDP;                  // dSᵀ
  const int r = lane >> 1, half = lane & 1;         // key row r of this warp, half the queries
  const int s = k0 + warp * 16 + r;                 // key position
  typename M::Acc dk, dv;
  M::zero(dk);
  M::zero(dv);

  for (int hh = 0; hh < group; ++hh) {
    const int h = g * group + hh;
    const float* lse_h = lse + (size_t(b) * H + h) * T_;
    const float* D_h = Dsum + (size_t(b) * H + h) * T_;
    for (int q0 = k0 / BR * BR; q0 < T_; q0 += BR) {  // causal: queries from the tile's first key on
      __syncthreads();
      load_tile<HDP>(sq, L::LD, base + size_t(h) * hd, row_len, q0, BR, T_, hd);
      load_tile<HDP>(sdo, L::LD, dbase + size_t(h) * hd, size_t(H) * hd, q0, BR, T_, hd);
      for (int i = threadIdx.x; i < BR; i += blockDim.x) {
        const bool ok = q0 + i < T_;
        s_row[i] = ok ? lse_h[q0 + i] : 0.0f;
        s_row[BR + i] = ok ? D_h[q0 + i] : 0.0f;
      }
      __syncthreads();
      M::template scores<BR>(my_st, L::LDS, sk + warp * 16 * L::LD, L::LD, sq, L::LD);
      M::template scores<BR>(my_dpt, L::LDS, sv + warp * 16 * L::LD, L::LD, sdo, L::LD);
      __syncwarp();
#pragma unroll 8
      for (int j = 0; j < BR / 2; ++j) {
        const int i = half * (BR / 2) + j, tq = q0 + i;
        float p = 0.0f, ds = 0.0f;
        if (tq >= s && tq < T_ && s < T_) {
          p = expf(my_st[r * L::LDS + i] * scale - s_row[i]);
          ds = p * (my_dpt[r * L::LDS + i] - s_row[BR + i]);
        }
        my_pt[r * L::LDP + i] = from_float<S>(p);
        my_dst[r * L::LDP + i] = from_float<S>(ds);
      }
      __syncwarp();
      M::template mma<BR>(dv, my_pt, L::LDP, sdo, L::LD);  // dV (16, HDP) += Pᵀ (16, BR) dO (BR, HDP)
      M::template mma<BR>(dk, my_dst, L::LDP, sq, L::LD);  // dK += dSᵀ Q
    }
  }

  M::scale(dk, scale);
  __syncthreads();  // tiles region becomes output staging
  float* staged = reinterpret_cast<float*>(smem) + warp * 16 * L::LDO;
  T* drow = dqkv + size_t(b) * T_ * row_len;
  // Writes the staged (16, hd) rows of this warp's keys at column col0 of dqkv.
  auto write_staged = [&](size_t col0) {
    __syncwarp();
    for (int i = lane; i < 16 * hd; i += 32) {
      const int rr = i / hd, c = i % hd, ss = k0 + warp * 16 + rr;
      if (ss < T_) drow[size_t(ss) * row_len + col0 + c] = from_float<T>(staged[rr * L::LDO + c]);
    }
    __syncwarp();
  };
  M::store(dk, staged, L::LDO);
  write_staged(size_t(H + g) * hd);
  M::store(dv, staged, L::LDO);
  write_staged(size_t(H + KV + g) * hd);
}

// ---- backward: dQ ----------------------------------------------------------------------
// Grid (query tiles, H, B), W warps of 16 queries; key tiles of BC. Writes dqkv's q part.

template <class M, class T, int HDP, int W, int BC>
__global__ void __launch_bounds__(W * 32)
    attn_backward_dq_kernel(T* dqkv, const T* dout, const float* lse, const float* Dsum, const T* qkv, int T_,
                            int H, int KV, int hd, float scale) {
  using S = typename M::S;
  using L = Layout<M, HDP, W, BC>;
  constexpr int BR = 16 * W;
  extern __shared__ __align__(128) unsigned char smem[];
  S* sq = reinterpret_cast<S*>(smem);  // (BR, HDP)
  S* sdo = sq + BR * L::LD;            // (BR, HDP)
  S* sk = sdo + BR * L::LD;            // (BC, HDP)
  S* sv = sk + BC * L::LD;             // (BC, HDP)
  const size_t tiles = L::tiles(2 * BR + 2 * BC);
  float* s_score = reinterpret_cast<float*>(smem + tiles);
  S* s_prob = reinterpret_cast<S*>(smem + tiles + L::score(2));

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * BR;
  const int h = blockIdx.y, b = blockIdx.z, g = h / (H / KV);
  const size_t row_len = size_t(H + 2 * KV) * hd;
  const T* base = qkv + size_t(b) * T_ * row_len;

  load_tile<HDP>(sq, L::LD, base + size_t(h) * hd, row_len, q0, BR, T_, hd);
  load_tile<HDP>(sdo, L::LD, dout + size_t(b) * T_ * H * hd + size_t(h) * hd, size_t(H) * hd, q0, BR, T_, hd);

  float* my_s = s_score + warp * 2 * 16 * L::LDS;  // S (16 queries, BC keys)
  float* my_dp = my_s + 16 * L::LDS;               // dP
  S* my_ds = s_prob + warp * 16 * L::LDP;          // dS
  const int r = lane >> 1, half = lane & 1;
  const int t = q0 + warp * 16 + r;
  const bool row_ok = t < T_;
  const float lse_r = row_ok ? lse[(size_t(b) * H + h) * T_ + t] : 0.0f;
  const float D_r = row_ok ? Dsum[(size_t(b) * H + h) * T_ + t] : 0.0f;
  typename M::Acc dq;
  M::zero(dq);

  const int kv_end = min(T_, q0 + BR);
  for (int k0 = 0; k0 < kv_end; k0 += BC) {
    __syncthreads();
    load_tile<HDP>(sk, L::LD, base + size_t(H + g) * hd, row_len, k0, BC, T_, hd);
    load_tile<HDP>(sv, L::LD, base + size_t(H + KV + g) * hd, row_len, k0, BC, T_, hd);
    __syncthreads();
    M::template scores<BC>(my_s, L::LDS, sq + warp * 16 * L::LD, L::LD, sk, L::LD);
    M::template scores<BC>(my_dp, L::LDS, sdo + warp * 16 * L::LD, L::LD, sv, L::LD);
    __syncwarp();
#pragma unroll 8
    for (int j = 0; j < BC / 2; ++j) {
      const int n = half * (BC / 2) + j, s = k0 + n;
      float ds = 0.0f;
      if (s <= t && s < T_ && row_ok) {
        const float p = expf(my_s[r * L::LDS + n] * scale - lse_r);
        ds = p * (my_dp[r * L::LDS + n] - D_r);
      }
      my_ds[r * L::LDP + n] = from_float<S>(ds);
    }
    __syncwarp();
    M::template mma<BC>(dq, my_ds, L::LDP, sk, L::LD);  // dQ (16, HDP) += dS (16, BC) K (BC, HDP)
  }

  M::scale(dq, scale);
  __syncthreads();
  float* staged = reinterpret_cast<float*>(smem) + warp * 16 * L::LDO;
  M::store(dq, staged, L::LDO);
  __syncwarp();
  T* drow = dqkv + size_t(b) * T_ * row_len;
  for (int i = lane; i < 16 * hd; i += 32) {
    const int rr = i / hd, c = i % hd, tt = q0 + warp * 16 + rr;
    if (tt < T_) drow[size_t(tt) * row_len + size_t(h) * hd + c] = from_float<T>(staged[rr * L::LDO + c]);
  }
}

// ---- launch configuration ----------------------------------------------------------------

// Tile shapes per path: BF16/WMMA uses 4 warps (64-row tiles); F32/SIMT 2 warps, since
// its float tiles are twice the size. Every configuration stays under 99 KiB of
// shared memory, the opt-in limit of sm_89.
template <class T>
struct Config;
template <>
struct Config<bf16> {
  template <int HDP>
  using Math = WmmaMath<HDP>;
  static constexpr int W = 4, kFwdBC = 64, kDkdvBR = 32, kDqBC = 32;
};
template <>
struct Config<float> {
  template <int HDP>
  using Math = SimtMath<HDP>;
  static constexpr int W = 2, kFwdBC = 32, kDkdvBR = 32, kDqBC = 32;
};

template <class Kernel>
void prepare(Kernel kernel, size_t smem) {
  int dev = 0, optin = 0;
  ST_CUDA(cudaGetDevice(&dev));
  ST_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  ST_CHECK(smem <= size_t(optin), "attention: a tile needs ", smem, " bytes of shared memory, the device allows ",
           optin);
  ST_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
}

// Calls fn(std::integral_constant<int, HDP>) with HDP the padded head dim.
template <class Fn>
void with_hdp(int hd, Fn&& fn) {
  if (hd <= 32)
    fn(std::integral_constant<int, 32>{});
  else if (hd <= 64)
    fn(std::integral_constant<int, 64>{});
  else if (hd <= 128)
    fn(std::integral_constant<int, 128>{});
  else
    fail("attention: head_dim ", hd, " is above the CUDA kernels' limit of ", kMaxHeadDim);
}

}  // namespace

template <class T>
void attention_forward(T* out, float* lse, const T* qkv, int B, int T_, int H, int KV, int hd,
                       cudaStream_t stream) {
  using C = Config<T>;
  const float scale = float(1.0 / std::sqrt(double(hd)));
  with_hdp(hd, [&](auto hdp) {
    constexpr int HDP = decltype(hdp)::value, W = C::W, BC = C::kFwdBC, BR = 16 * W;
    using M = typename C::template Math<HDP>;
    using L = Layout<M, HDP, W, BC>;
    const size_t smem = L::total(BR + 2 * BC, 1, 1);
    auto kernel = attn_forward_kernel<M, T, HDP, W, BC>;
    prepare(kernel, smem);
    const dim3 grid((T_ + BR - 1) / BR, H, B);
    kernel<<<grid, W * 32, smem, stream>>>(out, lse, qkv, T_, H, KV, hd, scale);
    ST_CUDA_LAUNCHED("attn_forward_kernel");
  });
}

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* out, const float* lse, const T* qkv, int B, int T_,
                        int H, int KV, int hd, cudaStream_t stream) {
  using C = Config<T>;
  const float scale = float(1.0 / std::sqrt(double(hd)));
  Scratch dsum(size_t(B) * H * T_ * sizeof(float), stream);  // D (B, H, T)
  {
    const size_t warps = size_t(B) * T_ * H;
    attn_rowdot_kernel<<<unsigned((warps * 32 + 255) / 256), 256, 0, stream>>>(dsum.as<float>(), dout, out, B, T_,
                                                                              H, hd);
    ST_CUDA_LAUNCHED("attn_rowdot_kernel");
  }
  with_hdp(hd, [&](auto hdp) {
    constexpr int HDP = decltype(hdp)::value, W = C::W;
    using M = typename C::template Math<HDP>;
    {
      constexpr int BR = C::kDkdvBR, BC = 16 * W;
      using L = Layout<M, HDP, W, BR>;
      const size_t smem = L::total(2 * BC + 2 * BR, 2, 2);
      auto kernel = attn_backward_dkdv_kernel<M, T, HDP, W, BR>;
      prepare(kernel, smem);
      const dim3 grid((T_ + BC - 1) / BC, KV, B);
      kernel<<<grid, W * 32, smem, stream>>>(dqkv, dout, lse, dsum.as<float>(), qkv, T_, H, KV, hd, scale);
      ST_CUDA_LAUNCHED("attn_backward_dkdv_kernel");
    }
    {
      constexpr int BC = C::kDqBC, BR = 16 * W;
      using L = Layout<M, HDP, W, BC>;
      const size_t smem = L::total(2 * BR + 2 * BC, 2, 1);
      auto kernel = attn_backward_dq_kernel<M, T, HDP, W, BC>;
      prepare(kernel, smem);
      const dim3 grid((T_ + BR - 1) / BR, H, B);
      kernel<<<grid, W * 32, smem, stream>>>(dqkv, dout, lse, dsum.as<float>(), qkv, T_, H, KV, hd, scale);
      ST_CUDA_LAUNCHED("attn_backward_dq_kernel");
    }
  });
}

template void attention_forward<float>(float*, float*, const float*, int, int, int, int, int, cudaStream_t);
template void attention_forward<bf16>(bf16*, float*, const bf16*, int, int, int, int, int, cudaStream_t);
template void attention_backward<float>(float*, const float*, const float*, const float*, const float*, int, int,
                                        int, int, int, cudaStream_t);
template void attention_backward<bf16>(bf16*, const bf16*, const bf16*, const float*, const bf16*, int, int, int,
                                       int, int, cudaStream_t);

}  // namespace st::cuda

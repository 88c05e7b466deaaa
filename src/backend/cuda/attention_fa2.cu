// FlashAttention-2 forward for the BF16 training path at head dims 64 and 128:
// causal grouped-query attention, scale 1/sqrt(hd), tensor cores through inline PTX.
//
//   block    : 4 warps, a query tile of BR = 128 rows of one (b, h); each warp owns
//              32 consecutive query rows (two m16 tiles), as FlashAttention-2 does.
//   K/V      : key tiles of BC = 32 (hd 128) or 64 (hd 64) rows, loaded with cp.async
//              into a 2-stage ring
//              (tile j+1 is in flight while tile j is computed); Q stays in shared
//              memory and is read with ldmatrix for each key tile.
//   products : mma.sync.m16n8k16 bf16 -> fp32. S = Q Kᵀ (K fragments by ldmatrix),
//              P = exp2(S · scale·log2e - m) in registers, rounded to bf16 and reused
//              directly as the A operand of O += P V (V fragments by ldmatrix.trans).
//   softmax  : online, in registers: running max m and partial sums l per row (each
//              lane sums its own columns; the 4 lanes of a row add up at the end).
//   causal   : key tiles past the tile's last query are never loaded; a warp skips a
//              key tile that lies wholly above its rows; masking happens only on the
//              tiles that cross the diagonal.
//   order    : a 1-D grid whose slowest index is the query tile, last (heaviest)
//              tiles first, so the light tiles fill the tail.
// Rows of shared-memory tiles are padded by 16 bytes, which keeps ldmatrix and the
// cp.async stores free of bank conflicts.
//
// The legacy kernels in attention.cu stay the path for other head dims and for the
// all-F32 (test) path; cuda_backend.cpp picks.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/ptx_helpers.cuh"

namespace st::cuda {
namespace {

using namespace ptx;  // PTX helpers (ptx_helpers.cuh)

// ---- forward kernel --------------------------------------------------------------------------

struct FwdParams {
  bf16* out;         // (B*T, H*HD)
  float* lse;        // (B, H, T), natural log
  const bf16* qkv;   // (B*T, (H+2KV)*HD)
  int B, T, H, KV;
  float scale_log2;  // log2(e) / sqrt(HD)
};

// NW warps of MT m16 tiles each: a query tile of BR = 16 NW MT rows; key tiles of BC.
template <int HD, int NW_, int MT_, int BC_, int MINB_>
struct FwdCfg {
  static constexpr int NW = NW_, MT = MT_, BR = NW * MT * 16, BC = BC_, LD = HD + 8, MINB = MINB_;
  static constexpr size_t smem = size_t(BR + 4 * BC) * LD * sizeof(bf16);
};

template <int HD, class C>
__global__ void __launch_bounds__(C::NW * 32, C::MINB) fa2_forward_kernel(const FwdParams p) {
  constexpr int NW = C::NW, MT = C::MT, BR = C::BR, BC = C::BC, LD = C::LD, NT = NW * 32;
  constexpr int KC = HD / 8;   // 16-byte chunks per row
  constexpr int KK = HD / 16;  // k-steps over the head dim
  constexpr int NS = BC / 8;   // 8-column tiles of S
  constexpr int ND = HD / 8;   // 8-column tiles of O
  static_assert((BR * KC) % NT == 0 && (BC * KC) % NT == 0, "tile loads split evenly over the threads");

  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // (BR, LD)
  bf16* sKV = sQ + BR * LD;                      // stage s: K at sKV + 2 s BC LD, V right after

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int BH = p.B * p.H, T = p.T;
  const int n_qt = (T + BR - 1) / BR;
  const int bh = blockIdx.x % BH;
  const int qt = n_qt - 1 - int(blockIdx.x / BH);  // heaviest tiles first
  const int b = bh / p.H, h = bh % p.H, g = h / (p.H / p.KV);
  const int q0 = qt * BR;
  const size_t row_len = size_t(p.H + 2 * p.KV) * HD;
  const bf16* base = p.qkv + size_t(b) * T * row_len;
  const bf16* qsrc = base + size_t(h) * HD;
  const bf16* ksrc = base + size_t(p.H + g) * HD;
  const bf16* vsrc = base + size_t(p.H + p.KV + g) * HD;

  // rows [row0, row0 + ROWS) of src (stride row_len) -> dst (ROWS, LD); zeros past T.
  auto load_rows = [&](bf16* dst, const bf16* src, int row0, auto rows_c) {
    constexpr int ROWS = decltype(rows_c)::value;
#pragma unroll
    for (int it = 0; it < ROWS * KC / NT; ++it) {
      const int i = tid + it * NT, r = i / KC, c = (i % KC) * 8, t = row0 + r;
      const bool ok = t < T;
      cp_async_16(smem_u32(dst + r * LD + c), src + size_t(ok ? t : 0) * row_len + c, ok);
    }
  };
  using RowsQ = std::integral_constant<int, BR>;
  using RowsK = std::integral_constant<int, BC>;

  const int kv_end = min(T, q0 + BR);
  const int n_kt = (kv_end + BC - 1) / BC;
  load_rows(sQ, qsrc, q0, RowsQ{});
  load_rows(sKV, ksrc, 0, RowsK{});
  load_rows(sKV + BC * LD, vsrc, 0, RowsK{});
  cp_async_commit();

  // Per-lane fragment offsets (elements). A operand (16 rows x 16 k) by ldmatrix.x4:
  // lane l points at row l % 16, column 8 (l / 16). B operand from a row-major [n][k]
  // tile (K): rows (l % 8) + 8 (l / 16), column 8 ((l / 8) % 2). B operand from a
  // row-major [k][n] tile (V) by ldmatrix.trans: rows (l % 8) + 8 ((l / 8) % 2),
  // column 8 (l / 16).
  const int wrow = warp * MT * 16;  // first row of this warp inside the tile
  const uint32_t q_addr = smem_u32(sQ + (wrow + (lane & 15)) * LD + (lane >> 4) * 8);
  const int kb_off = ((lane & 7) + ((lane >> 4) << 3)) * LD + ((lane >> 3) & 1) * 8;
  const int vb_off = ((lane & 7) + (((lane >> 3) & 1) << 3)) * LD + (lane >> 4) * 8;

  float o[MT][ND][4];
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
    for (int d = 0; d < ND; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mi][d][e] = 0.0f;
    m[mi][0] = m[mi][1] = -INFINITY;
    l[mi][0] = l[mi][1] = 0.0f;
  }
  const float sl2 = p.scale_log2;
  const int row_first = q0 + wrow, row_last = row_first + MT * 16 - 1;

  for (int j = 0; j < n_kt; ++j) {
    cp_async_wait_all();
    __syncthreads();  // tile j visible to all; every warp is done with tile j-1's stage
    if (j + 1 < n_kt) {
      bf16* st = sKV + ((j + 1) & 1) * 2 * BC * LD;
      load_rows(st, ksrc, (j + 1) * BC, RowsK{});
      load_rows(st + BC * LD, vsrc, (j + 1) * BC, RowsK{});
      cp_async_commit();
    }
    const int k0 = j * BC;
    if (k0 > row_last) continue;  // warp-uniform: every key of the tile is after every row of this warp
    const bf16* sK = sKV + (j & 1) * 2 * BC * LD;
    const uint32_t k_addr = smem_u32(sK + kb_off);
    const uint32_t v_addr = smem_u32(sK + BC * LD + vb_off);

    // S = Q Kᵀ
    float s[MT][NS][4];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int n = 0; n < NS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mi][n][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KK; ++kk) {
      uint32_t qa[MT][4];
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) ldsm_x4(qa[mi], q_addr + (mi * 16 * LD + kk * 16) * 2);
#pragma unroll
      for (int np = 0; np < NS / 2; ++np) {
        uint32_t kb[4];
        ldsm_x4(kb, k_addr + (np * 16 * LD + kk * 16) * 2);
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          mma_bf16(s[mi][2 * np], qa[mi], kb[0], kb[1]);
          mma_bf16(s[mi][2 * np + 1], qa[mi], kb[2], kb[3]);
        }
      }
    }

    // Causal mask, only where the tile crosses the diagonal of this warp's rows.
    if (k0 + BC - 1 > row_first) {
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = row_first + mi * 16 + (lane >> 2) + 8 * (e >> 1);
            const int key = k0 + n * 8 + 2 * (lane & 3) + (e & 1);
            if (key > row) s[mi][n][e] = -INFINITY;
          }
    }

    // Online softmax (log2 domain), P overwrites S.
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < NS; ++n) mx = fmaxf(mx, fmaxf(s[mi][n][2 * hi], s[mi][n][2 * hi + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[mi][hi], mx * sl2);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet
        const float alpha = ex2(m[mi][hi] - m_use);            // 0 on the first tile
        m[mi][hi] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
          for (int e = 2 * hi; e < 2 * hi + 2; ++e) {
            const float pv = ex2(fmaf(s[mi][n][e], sl2, -m_use));
            s[mi][n][e] = pv;
            sum += pv;
          }
        l[mi][hi] = l[mi][hi] * alpha + sum;
#pragma unroll
        for (int d = 0; d < ND; ++d) {
          o[mi][d][2 * hi] *= alpha;
          o[mi][d][2 * hi + 1] *= alpha;
        }
      }

    // O += P V
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        pa[mi][0] = pack_bf16(s[mi][2 * kk][0], s[mi][2 * kk][1]);
        pa[mi][1] = pack_bf16(s[mi][2 * kk][2], s[mi][2 * kk][3]);
        pa[mi][2] = pack_bf16(s[mi][2 * kk + 1][0], s[mi][2 * kk + 1][1]);
        pa[mi][3] = pack_bf16(s[mi][2 * kk + 1][2], s[mi][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < HD / 16; ++dp) {
        uint32_t vb[4];
        ldsm_x4_t(vb, v_addr + (kk * 16 * LD + dp * 16) * 2);
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          mma_bf16(o[mi][2 * dp], pa[mi], vb[0], vb[1]);
          mma_bf16(o[mi][2 * dp + 1], pa[mi], vb[2], vb[3]);
        }
      }
    }
  }

  // Epilogue: O / l, lse = (m + log2 l) ln 2.
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      float sum = l[mi][hi];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = 1.0f / sum;
      const int t = row_first + mi * 16 + (lane >> 2) + 8 * hi;
      if (t < T) {
        bf16* orow = p.out + (size_t(b) * T + t) * size_t(p.H) * HD + size_t(h) * HD + 2 * (lane & 3);
#pragma unroll
        for (int d = 0; d < ND; ++d)
          *reinterpret_cast<uint32_t*>(orow + d * 8) = pack_bf16(o[mi][d][2 * hi] * inv, o[mi][d][2 * hi + 1] * inv);
        if ((lane & 3) == 0) p.lse[(size_t(b) * p.H + h) * T + t] = (m[mi][hi] + log2f(sum)) * 0.69314718055994531f;
      }
    }
}

template <int HD, class C>
void launch_forward(bf16* out, float* lse, const bf16* qkv, int B, int T_, int H, int KV, cudaStream_t stream) {
  auto kernel = fa2_forward_kernel<HD, C>;
  ST_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::smem)));
  FwdParams p{out, lse, qkv, B, T_, H, KV, float(1.4426950408889634 / std::sqrt(double(HD)))};
  const long long blocks = (long long)((T_ + C::BR - 1) / C::BR) * B * H;
  ST_CHECK(blocks < (1LL << 31), "attention_forward_fa2: grid of ", blocks, " blocks is too large");
  kernel<<<unsigned(blocks), C::NW * 32, C::smem, stream>>>(p);
  ST_CUDA_LAUNCHED("fa2_forward_kernel");
}

}  // namespace

void attention_forward_fa2(bf16* out, float* lse, const bf16* qkv, int B, int T_, int H, int KV, int hd,
                           cudaStream_t stream) {
  // Tile configurations measured on an H200 (B=4 T=2048 H=12 KV=2, 2026-12-02): at hd 128,
  // 128 x 32 tiles ran 0.193 ms against 0.216 ms for 128 x 64 (which spills more) and
  // 0.224 / 0.220 ms for 8 warps of 16 rows / 4 warps of 16 rows. Both use < 99 KiB of
  // shared memory (sm_89's limit).
  if (hd == 128) {
    launch_forward<128, FwdCfg<128, 4, 2, 32, 2>>(out, lse, qkv, B, T_, H, KV, stream);
  } else if (hd == 64) {
    launch_forward<64, FwdCfg<64, 4, 2, 64, 2>>(out, lse, qkv, B, T_, H, KV, stream);
  } else
    fail("attention_forward_fa2: head_dim ", hd, " is not 64 or 128");
}

}  // namespace st::cuda

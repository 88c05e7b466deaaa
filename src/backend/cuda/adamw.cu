// Fused AdamW over F32 param / grad / m / v, the same arithmetic as the CPU
// reference in the same order and in double precision, with explicitly rounded
// operations (__dmul_rn, __dadd_rn) so nvcc cannot contract them into FMAs: the
// result then matches the CPU to the last bit or so (sqrt and division are IEEE in
// double on the GPU too). It is memory-bound (28 bytes per element), so the double
// math costs little on data-centre GPUs.
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/stochastic_round.h"

namespace st::cuda {
namespace {

constexpr unsigned kThreads = 256;

struct AdamWConsts {
  double b1, b2, lr, eps, bc1, bc2, decay, grad_scale;
};

// One element's update; returns the new parameter.
__device__ __forceinline__ float adamw_one(float param, float grad, float& m, float& v, const AdamWConsts& k) {
  const double g = __dmul_rn(double(grad), k.grad_scale);
  // m and v are stored in float; the update reads the stored values, as the CPU does.
  const float mi = float(__dadd_rn(__dmul_rn(k.b1, double(m)), __dmul_rn(1.0 - k.b1, g)));
  const float vi = float(__dadd_rn(__dmul_rn(k.b2, double(v)), __dmul_rn(__dmul_rn(1.0 - k.b2, g), g)));
  m = mi;
  v = vi;
  const double mhat = double(mi) / k.bc1, vhat = double(vi) / k.bc2;
  const double x = __dmul_rn(double(param), k.decay);  // decoupled decay on the old parameter
  return float(__dadd_rn(x, -(__dmul_rn(k.lr, mhat) / __dadd_rn(sqrt(vhat), k.eps))));
}

// param, grad, m, v (n); copy (n, may be null): the new parameter in C.
template <class C>
__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, C* copy, size_t n, AdamWConsts k) {
  for (size_t i = global_thread(); i < n; i += grid_threads()) {
    float mi = m[i], vi = v[i];
    const float p = adamw_one(param[i], grad[i], mi, vi, k);
    m[i] = mi, v[i] = vi, param[i] = p;
    if (copy) copy[i] = from_float<C>(p);
  }
}

// The same over packs of 4 (every pointer 16-byte aligned, copy 8-byte aligned, n a
// multiple of 4): streaming loads and stores, each element touched once.
template <class C>
__global__ void adamw_pack_kernel(float* param, const float* grad, float* m, float* v, C* copy, size_t packs,
                                  AdamWConsts k) {
  for (size_t i = global_thread(); i < packs; i += grid_threads()) {
    const size_t e = i * 4;
    Pack<float> pp = load_pack_cs(param + e), pg = load_pack_cs(grad + e), pm = load_pack_cs(m + e),
                pv = load_pack_cs(v + e);
    C out[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      pp.v[j] = adamw_one(pp.v[j], pg.v[j], pm.v[j], pv.v[j], k);
      out[j] = from_float<C>(pp.v[j]);
    }
    store_pack_cs(param + e, pp);
    store_pack_cs(m + e, pm);
    store_pack_cs(v + e, pv);
    if (copy) {
      if constexpr (sizeof(C) == 2) {
        uint2 w;
        w.x = uint32_t(__bfloat16_as_ushort(out[0])) | (uint32_t(__bfloat16_as_ushort(out[1])) << 16);
        w.y = uint32_t(__bfloat16_as_ushort(out[2])) | (uint32_t(__bfloat16_as_ushort(out[3])) << 16);
        *reinterpret_cast<uint2*>(copy + e) = w;
      } else {
        Pack<float> o;
#pragma unroll
        for (int j = 0; j < 4; ++j) o.v[j] = out[j];
        store_pack(reinterpret_cast<float*>(copy) + e, o);
      }
    }
  }
}

template <class C>
void launch_adamw(float* param, const float* grad, float* m, float* v, C* copy, size_t n, const AdamWConsts& k,
                  cudaStream_t stream) {
  const bool packs = n % 4 == 0 && aligned16(param) && aligned16(grad) && aligned16(m) && aligned16(v) &&
                     (!copy || reinterpret_cast<uintptr_t>(copy) % (4 * sizeof(C)) == 0);
  if (packs) {
    adamw_pack_kernel<C><<<grid_for(n / 4, kThreads), kThreads, 0, stream>>>(param, grad, m, v, copy, n / 4, k);
    ST_CUDA_LAUNCHED("adamw_pack_kernel");
  } else {
    adamw_kernel<C><<<grid_for(n, kThreads), kThreads, 0, stream>>>(param, grad, m, v, copy, n, k);
    ST_CUDA_LAUNCHED("adamw_kernel");
  }
}

// ---- bf16 master weights and/or bf16 moments -----------------------------------------
// The same arithmetic as adamw_one (and the CPU's adamw<P, S>) on values stored as f32
// or bf16; bf16 stores round stochastically with the element's counter bits.
__device__ __forceinline__ float load_value(float x) { return x; }
__device__ __forceinline__ float load_value(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void store_value(float& dst, float x, uint32_t) { dst = x; }
__device__ __forceinline__ void store_value(bf16& dst, float x, uint32_t r) {
  dst = __ushort_as_bfloat16(bf16_bits_stochastic(x, r));
}

template <class P, class S, class C>
__global__ void adamw_mixed_kernel(P* param, const float* grad, S* m, S* v, C* copy, size_t n, AdamWConsts k,
                                   uint64_t round_key, uint64_t round_index) {
  for (size_t i = global_thread(); i < n; i += grid_threads()) {
    const uint64_t r = adamw_round_bits(round_key, round_index + i);
    const double g = __dmul_rn(double(grad[i]), k.grad_scale);
    S ms, vs;
    store_value(ms, float(__dadd_rn(__dmul_rn(k.b1, double(load_value(m[i]))), __dmul_rn(1.0 - k.b1, g))),
                uint32_t(r >> 16));
    store_value(vs, float(__dadd_rn(__dmul_rn(k.b2, double(load_value(v[i]))), __dmul_rn(__dmul_rn(1.0 - k.b2, g), g))),
                uint32_t(r >> 32));
    m[i] = ms, v[i] = vs;
    const double mhat = double(load_value(ms)) / k.bc1, vhat = double(load_value(vs)) / k.bc2;
    const double x = __dmul_rn(double(load_value(param[i])), k.decay);
    P ps;
    store_value(ps, float(__dadd_rn(x, -(__dmul_rn(k.lr, mhat) / __dadd_rn(sqrt(vhat), k.eps)))), uint32_t(r));
    param[i] = ps;
    if (copy) copy[i] = from_float<C>(load_value(ps));
  }
}

AdamWConsts consts(const AdamWParams& p) {
  AdamWConsts k;
  k.b1 = p.beta1, k.b2 = p.beta2, k.lr = p.lr, k.eps = p.eps, k.grad_scale = p.grad_scale;
  // Host pow, as the CPU reference computes them.
  k.bc1 = 1.0 - std::pow(k.b1, p.step);
  k.bc2 = 1.0 - std::pow(k.b2, p.step);
  k.decay = 1.0 - k.lr * p.weight_decay;
  return k;
}

}  // namespace

void adamw(float* param, const float* grad, float* m, float* v, size_t n, const AdamWParams& p,
           cudaStream_t stream) {
  if (n == 0) return;
  launch_adamw<float>(param, grad, m, v, nullptr, n, consts(p), stream);
}

template <class C>
void adamw_copy(float* param, const float* grad, float* m, float* v, C* copy, size_t n, const AdamWParams& p,
                cudaStream_t stream) {
  if (n == 0) return;
  launch_adamw<C>(param, grad, m, v, copy, n, consts(p), stream);
}
template void adamw_copy<float>(float*, const float*, float*, float*, float*, size_t, const AdamWParams&,
                                cudaStream_t);
template void adamw_copy<bf16>(float*, const float*, float*, float*, bf16*, size_t, const AdamWParams&,
                               cudaStream_t);

template <class P, class S, class C>
void adamw_mixed(P* param, const float* grad, S* m, S* v, C* copy, size_t n, const AdamWParams& p,
                 cudaStream_t stream) {
  if (n == 0) return;
  adamw_mixed_kernel<P, S, C><<<grid_for(n, kThreads), kThreads, 0, stream>>>(param, grad, m, v, copy, n, consts(p),
                                                                               p.round_key, p.round_index);
  ST_CUDA_LAUNCHED("adamw_mixed_kernel");
}
#define ST_ADAMW_MIXED(P, S, C) \
  template void adamw_mixed<P, S, C>(P*, const float*, S*, S*, C*, size_t, const AdamWParams&, cudaStream_t);
ST_ADAMW_MIXED(float, bf16, float)
ST_ADAMW_MIXED(float, bf16, bf16)
ST_ADAMW_MIXED(bf16, float, float)
ST_ADAMW_MIXED(bf16, float, bf16)
ST_ADAMW_MIXED(bf16, bf16, float)
ST_ADAMW_MIXED(bf16, bf16, bf16)
#undef ST_ADAMW_MIXED

}  // namespace st::cuda

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

namespace st::cuda {
namespace {

constexpr unsigned kThreads = 256;

struct AdamWConsts {
  double b1, b2, lr, eps, bc1, bc2, decay, grad_scale;
};

// param, grad, m, v (n)
__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, size_t n, AdamWConsts k) {
  for (size_t i = global_thread(); i < n; i += grid_threads()) {
    const double g = __dmul_rn(double(grad[i]), k.grad_scale);
    // m and v are stored in float; the update reads the stored values, as the CPU does.
    const float mi = float(__dadd_rn(__dmul_rn(k.b1, double(m[i])), __dmul_rn(1.0 - k.b1, g)));
    const float vi = float(__dadd_rn(__dmul_rn(k.b2, double(v[i])), __dmul_rn(__dmul_rn(1.0 - k.b2, g), g)));
    m[i] = mi;
    v[i] = vi;
    const double mhat = double(mi) / k.bc1, vhat = double(vi) / k.bc2;
    const double x = __dmul_rn(double(param[i]), k.decay);  // decoupled decay on the old parameter
    param[i] = float(__dadd_rn(x, -(__dmul_rn(k.lr, mhat) / __dadd_rn(sqrt(vhat), k.eps))));
  }
}

}  // namespace

void adamw(float* param, const float* grad, float* m, float* v, size_t n, const AdamWParams& p,
           cudaStream_t stream) {
  if (n == 0) return;
  AdamWConsts k;
  k.b1 = p.beta1, k.b2 = p.beta2, k.lr = p.lr, k.eps = p.eps, k.grad_scale = p.grad_scale;
  // Host pow, as the CPU reference computes them.
  k.bc1 = 1.0 - std::pow(k.b1, p.step);
  k.bc2 = 1.0 - std::pow(k.b2, p.step);
  k.decay = 1.0 - k.lr * p.weight_decay;
  adamw_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(param, grad, m, v, n, k);
  ST_CUDA_LAUNCHED("adamw_kernel");
}

}  // namespace st::cuda

// Fused cross-entropy forward + backward over logits (N, V), in place. One block
// per row: pass 1 keeps an online (max, sum of exp) per thread, merged across the
// block, giving lse and the loss; pass 2 overwrites the row with
// dloss_scale * (softmax - onehot). Two reads and one write of the row in all;
// V = 152064 bf16 logits is 300 KB, so a row streams through L2.
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_utils.cuh"

namespace st::cuda {
namespace {

constexpr int kThreads = 512;

// Online log-sum-exp state: sum of exp(x - max).
struct MaxSum {
  float m, s;
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  if (a.m == -INFINITY) return b;  // also avoids exp(-inf - -inf) = nan
  if (b.m == -INFINITY) return a;
  const float m = fmaxf(a.m, b.m);
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

// losses (N) F32; logits (N, V) in, dlogits out when grad; targets (N)
template <class T>
__global__ void __launch_bounds__(kThreads) cross_entropy_kernel(float* losses, T* logits, const int32_t* targets,
                                                                 int V, int ignore_index, float dloss_scale,
                                                                 bool grad) {
  __shared__ MaxSum shared[kThreads / 32];
  __shared__ float s_lse;
  const int r = blockIdx.x;
  T* x = logits + size_t(r) * V;
  const int tgt = targets[r];
  if (tgt == ignore_index) {
    if (threadIdx.x == 0) losses[r] = 0.0f;
    if (grad)
      for (int i = threadIdx.x; i < V; i += blockDim.x) x[i] = from_float<T>(0.0f);
    return;
  }
  MaxSum st{-INFINITY, 0.0f};
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float v = to_float(x[i]);
    if (v > st.m) {
      st.s = st.s * expf(st.m - v) + 1.0f;
      st.m = v;
    } else {
      st.s += expf(v - st.m);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, st.m, o), __shfl_xor_sync(0xffffffffu, st.s, o)};
    st = merge(st, other);
  }
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = st;
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxSum all = shared[0];
    for (int w = 1; w < kThreads / 32; ++w) all = merge(all, shared[w]);
    const float lse = all.m + logf(all.s);
    s_lse = lse;
    losses[r] = lse - to_float(x[tgt]);  // read before any thread overwrites the row
  }
  __syncthreads();
  if (!grad) return;
  const float lse = s_lse;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float p = expf(to_float(x[i]) - lse);
    x[i] = from_float<T>(dloss_scale * (i == tgt ? p - 1.0f : p));
  }
}

}  // namespace

template <class T>
void cross_entropy(float* losses, T* logits, const int32_t* targets, int N, int V, int ignore_index,
                   float dloss_scale, bool grad, cudaStream_t stream) {
  cross_entropy_kernel<<<N, kThreads, 0, stream>>>(losses, logits, targets, V, ignore_index, dloss_scale, grad);
  ST_CUDA_LAUNCHED("cross_entropy_kernel");
}

template void cross_entropy<float>(float*, float*, const int32_t*, int, int, int, float, bool, cudaStream_t);
template void cross_entropy<bf16>(float*, bf16*, const int32_t*, int, int, int, float, bool, cudaStream_t);

}  // namespace st::cuda

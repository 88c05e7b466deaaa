// SwiGLU's pointwise math, shared by its kernels (elementwise.cu) and the backward
// that casts straight to FP8 (fp8.cu), so both compute the same bits. .cu files only.
#pragma once
#include <cuda_runtime.h>

namespace st::cuda {

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// out = silu(g) * u
__device__ __forceinline__ float swiglu_value(float g, float u) { return g * sigmoid(g) * u; }

// dgu (N, 2F): d gate = dy * u * silu'(g), silu'(g) = s (1 + g (1 - s)); d up = dy * silu(g)
__device__ __forceinline__ void swiglu_grads(float g, float u, float dy, float* dg, float* du) {
  const float s = sigmoid(g);
  *dg = dy * u * s * (1.0f + g * (1.0f - s));
  *du = dy * g * s;
}

}  // namespace st::cuda

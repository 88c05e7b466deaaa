// Scalar kernels of the CPU reference backend, templated on the activation type
// T (float or double; explicit instantiations live next to each definition).
// They trust their arguments: cpu_backend.cpp checks dtypes, sizes and ids first.
// Sums are accumulated in double for both T, so the F32 path is as close to exact
// as its storage allows and can serve as the oracle for the CUDA backend.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/backend.h"

namespace st::cpu {

// ---- cpu_layers.cpp ------------------------------------------------------------
template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int N, int C);
template <class T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int N, int C);

template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int N, int C, double eps);
template <class T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const T* rstd, int N,
                      int C);

template <class T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int IC, int OC);
template <class T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int N,
                     int IC, int OC);

template <class T>
void swiglu_forward(T* out, const T* gu, int N, int F);
template <class T>
void swiglu_backward(T* dgu, const T* dout, const T* gu, int N, int F);

template <class T>
void cross_entropy(T* losses, T* logits, const int32_t* targets, int N, int V, int ignore_index,
                   double dloss_scale, bool grad);

// P, S: float, or uint16_t holding bf16 bits (stored with stochastic rounding).
template <class P, class S>
void adamw(P* param, const float* grad, S* m, S* v, size_t n, const AdamWParams& p);

// ---- cpu_attention.cpp ---------------------------------------------------------
// sign = +1 rotates by +angle (forward), -1 by -angle (the transpose, backward).
template <class T>
void rope(T* qkv, int B, int T_, int H, int KV, int hd, double theta, int sign);

template <class T>
void attention_forward(T* out, T* lse, const T* qkv, int B, int T_, int H, int KV, int hd);
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* out, const T* lse, const T* qkv, int B, int T_,
                        int H, int KV, int hd);

}  // namespace st::cpu

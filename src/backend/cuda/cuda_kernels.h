// Kernel launchers of the CUDA backend, one group per .cu file. Templated on the
// activation type T: float (the all-F32 test path) or __nv_bfloat16 (training);
// explicit instantiations live next to each definition. Parameter gradients and
// statistics are always float. Launchers trust their arguments (cuda_backend.cpp
// checks dtypes and sizes) and enqueue on `stream` without synchronising.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/backend.h"
#include "backend/fp8.h"
#include "core/dtype.h"

namespace st::cuda {

using bf16 = __nv_bfloat16;

// ---- fp8.cu ------------------------------------------------------------------------
// q (rows, cols) and/or qt (cols, rows) (either may be null) = the fp8 quantization of
// x with the power-of-two scale of its amax (backend/fp8.h); *inv_scale = 1 / scale.
// amax_scratch: one device word the launcher zeroes and the kernels use; null: the
// scale is 1 / *inv_scale as given (an earlier quantization's), and x is read once.
// record (may be null): *record = max(*record, amax |x|) as float bits, in the cast.
template <class T>
void fp8_quantize(uint8_t* q, uint8_t* qt, float* inv_scale, const T* x, int rows, int cols, Fp8Format format,
                  unsigned* amax_scratch, unsigned* record, cudaStream_t stream);
// Backend::swiglu_backward_fp8 in one kernel (a given scale: *inv_scale); false, with
// nothing launched, where the shape or alignment does not allow it (F % 8, dout and gu
// 16-byte aligned, q 8-byte aligned).
template <class T>
bool swiglu_backward_fp8(uint8_t* q, uint8_t* qt, const float* inv_scale, unsigned* record, const T* dout, const T* gu,
                         int N, int F, Fp8Format format, cudaStream_t stream);
// Backend::swiglu_forward_fp8 in one kernel, the same way (F % 8, gu 16-byte and q
// 8-byte aligned).
template <class T>
bool swiglu_forward_fp8(uint8_t* q, uint8_t* qt, const float* inv_scale, unsigned* record, const T* gu, int N, int F,
                        Fp8Format format, cudaStream_t stream);
// qt (cols, rows) = q (rows, cols) transposed, one byte an element as it is (an FP8
// tensor's other layout, without casting again).
void fp8_transpose(uint8_t* qt, const uint8_t* q, int rows, int cols, cudaStream_t stream);
// Backend::fp8_roll_scales (delayed scaling's once-a-step update).
void fp8_roll_scales(float* inv_scale, int stride, float* amax, float* history, int n, int len, int pos,
                     Fp8Format format, cudaStream_t stream);

// ---- elementwise.cu -------------------------------------------------------------
// p (n) = value, converted to dt (F32, F64, BF16, I32, I64).
void fill(void* p, DType dt, size_t n, double value, cudaStream_t stream);
// dst (n) = src (n) converted element-wise; float -> int truncates toward zero.
void convert(void* dst, DType dst_dt, const void* src, DType src_dt, size_t n, cudaStream_t stream);
template <class T>
void add(T* out, const T* a, const T* b, size_t n, cudaStream_t stream);
template <class T>
void accumulate(T* acc, const T* x, size_t n, cudaStream_t stream);
// *first_bad (device int) = lowest row r with ids[r] outside [0, V) (skipping `ignore`
// when has_ignore); left untouched when every id is fine. The caller presets it.
void find_bad_id(int* first_bad, const int32_t* ids, int N, int V, bool has_ignore, int ignore,
                 cudaStream_t stream);
template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int N, int C, cudaStream_t stream);
template <class T>
void embedding_backward(float* dwte, const T* dout, const int32_t* tokens, int N, int C, int V, cudaStream_t stream);
template <class T>
void swiglu_forward(T* out, const T* gu, int N, int F, cudaStream_t stream);
template <class T>
void swiglu_backward(T* dgu, const T* dout, const T* gu, int N, int F, cudaStream_t stream);

// ---- reduce.cu -------------------------------------------------------------------
// *result (device double) = Σ x², deterministic (fixed two-stage tree).
template <class T>
void sum_squares(double* result, const T* x, size_t n, cudaStream_t stream);
// out (C) += Σ_rows x (N, C), deterministic; the matmul bias gradient.
template <class T>
void column_sums_add(float* out, const T* x, int N, int C, cudaStream_t stream);
// out (N, C) += bias (C) broadcast over rows (when the GEMM epilogue cannot do it).
template <class T>
void add_bias(T* out, const T* bias, int N, int C, cudaStream_t stream);

// *result (device) += a 64-bit fingerprint of `bytes` bytes at p (p 8-byte aligned,
// bytes a multiple of 8): a sum of position-salted mixes, so its value does not depend
// on the order of the additions. Equal bytes give equal fingerprints; any change of a
// word almost surely changes it. For comparing two outputs bit for bit.
void fingerprint_add(unsigned long long* result, const void* p, size_t bytes, cudaStream_t stream);

// ---- norm.cu ---------------------------------------------------------------------
// A device buffer that its owner (the backend) keeps between calls and that launchers
// grow on demand, in stream order; the owner releases it before destroying the stream.
struct DeviceScratch {
  void* ptr = nullptr;
  size_t bytes = 0;
};
// s.ptr, grown to at least `bytes` first when smaller (the old buffer is freed after
// the work already enqueued on `stream`). Work on other streams must not use it.
void* scratch_reserve(DeviceScratch& s, size_t bytes, cudaStream_t stream);
void scratch_release(DeviceScratch& s, cudaStream_t stream) noexcept;

template <class T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, int N, int C, float eps,
                     cudaStream_t stream);
// sum (N, C) = a + b rounded to T; out, rstd = rmsnorm(sum): bit for bit add() then
// rmsnorm_forward(). sum may alias a or b.
template <class T>
void add_rmsnorm_forward(T* sum, T* out, float* rstd, const T* a, const T* b, const T* weight, int N, int C, float eps,
                         cudaStream_t stream);
// dinp (N, C) +=, dweight (C) += (deterministic: per-block partials in `scratch`, then a
// fixed-order sum).
template <class T>
void rmsnorm_backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight, const float* rstd,
                      int N, int C, DeviceScratch& scratch, cudaStream_t stream);

// ---- rope.cu ---------------------------------------------------------------------
// sign +1 rotates by +angle (forward), -1 by -angle (backward).
template <class T>
void rope(T* qkv, int B, int T_, int H, int KV, int hd, float theta, int sign, cudaStream_t stream);

// ---- attention.cu ----------------------------------------------------------------
constexpr int kMaxHeadDim = 128;
template <class T>
void attention_forward(T* out, float* lse, const T* qkv, int B, int T_, int H, int KV, int hd,
                       cudaStream_t stream);
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* out, const float* lse, const T* qkv, int B, int T_,
                        int H, int KV, int hd, cudaStream_t stream);

// ---- attention_fa2.cu, attention_fa2_bwd.cu -------------------------------------------
// FlashAttention-2 kernels (mma.sync, cp.async) for the BF16 path at hd 64 and 128 only;
// the same contract as attention_forward / attention_backward above. qkv, out, dout and
// dqkv must be 16-byte aligned. The backward is deterministic (no atomics).
void attention_forward_fa2(bf16* out, float* lse, const bf16* qkv, int B, int T_, int H, int KV, int hd,
                           cudaStream_t stream);
void attention_backward_fa2(bf16* dqkv, const bf16* dout, const bf16* out, const float* lse, const bf16* qkv, int B,
                            int T_, int H, int KV, int hd, cudaStream_t stream);

// ---- loss.cu ---------------------------------------------------------------------
// With dq (grad only): dq (N, V) e5m2 = fp8(the gradient as written * dq_scale), and
// *dq_inv = 1 / dq_scale (Backend::cross_entropy_fp8); keep_dlogits false (with dq):
// the gradient goes to dq only, the logits are left as they were; round_key nonzero:
// dq's codes round stochastically (Backend::cross_entropy_fp8).
template <class T>
void cross_entropy(float* losses, T* logits, const int32_t* targets, int N, int V, int ignore_index,
                   float dloss_scale, bool grad, cudaStream_t stream, uint8_t* dq = nullptr, float dq_scale = 1.0f,
                   float* dq_inv = nullptr, bool keep_dlogits = true, uint64_t round_key = 0);

// ---- init.cu ---------------------------------------------------------------------
// out (n, F32 or F64) = stddev * counter_normal(key, first + i) (core/rng.h).
void fill_normal(void* out, DType dt, size_t n, uint64_t key, uint64_t first, double stddev, cudaStream_t stream);

// ---- adamw.cu --------------------------------------------------------------------
void adamw(float* param, const float* grad, float* m, float* v, size_t n, const AdamWParams& p,
           cudaStream_t stream);
// adamw, and copy (n) = the updated param converted to C (float or bf16), one pass.
template <class C>
void adamw_copy(float* param, const float* grad, float* m, float* v, C* copy, size_t n, const AdamWParams& p,
                cudaStream_t stream);
// adamw with a bf16 param and/or bf16 m and v (P, S: float or bf16; not both float),
// bf16 stores rounded stochastically (AdamWParams::round_key); copy (n, C: float or
// bf16, may be null) = the stored param converted.
template <class P, class S, class C>
void adamw_mixed(P* param, const float* grad, S* m, S* v, C* copy, size_t n, const AdamWParams& p,
                 cudaStream_t stream);

}  // namespace st::cuda

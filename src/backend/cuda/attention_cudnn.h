// Causal grouped-query attention through cuDNN's fused flash attention ("SDPA"),
// built with the C backend graph API (no cudnn-frontend). The same contract as
// attention_forward / attention_backward in cuda_kernels.h, BF16 only:
//   qkv  (B*T, (H+2KV)*hd), per row [q (H*hd) | k (KV*hd) | v (KV*hd)], RoPE applied;
//   out  (B*T, H*hd);  lse (B, H, T) fp32, natural-log log-sum-exp of each row of the
//   scaled scores (cuDNN's softmax "stats" are exactly this, so no conversion);
//   dqkv (same layout as qkv) overwritten by the backward.
// Query head h reads kv head h / (H/KV); softmax scale 1/sqrt(hd). Q, K, V, dQ, dK and
// dV are strided views into qkv / dqkv: nothing is repacked.
//
// Execution plans are built on first use of a shape (or ahead, by prepare()) and cached; a shape cuDNN has no
// engine for (or a GPU without the fused kernels) makes forward/backward return false
// without touching the outputs, and why_not() says why, so the caller can fall back to
// the FlashAttention-2 kernels. Errors while running a plan that was built throw
// st::Error naming the call, the status and cuDNN's own last error message.
//
// Determinism: by default the backward uses cuDNN's deterministic formulation (dQ from
// a materialised dP/dS workspace, no atomics; about 2*B*H*T*T bytes of workspace).
// set_deterministic(false) selects the dQ-accumulation formulation (fp32 atomics into a
// B*H*T*hd workspace: less memory, not bitwise reproducible).
//
// Everything runs on the stream given to the constructor; one object per stream, not
// thread-safe (prepare()'s own threads only build plans); destroy it before the stream (the workspace is freed on that stream).
// Measured on an H200 (cuDNN 9.14 loaded), B=16 T=2048 H=12 KV=2 hd=128: forward 363 us
// (568 TFLOP/s), deterministic backward 1316 us (392 TFLOP/s, 1.8 GB workspace), the
// dQ-atomics backward 1303 us (396 TFLOP/s; repeats differ bitwise at this shape). SHARDTRAIN_CUDNN_VERBOSE=1 prints each plan as it is built (engine,
// notes, workspace, build time) and each build failure in full.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>

namespace st::cuda {

class CudnnAttention {
 public:
  explicit CudnnAttention(cudaStream_t stream);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // False (outputs untouched) when cuDNN has no engine for this shape on this GPU, or
  // the arguments are outside what the graph supports (dtype alignment, head dim);
  // why_not() then names the reason. True once the work is enqueued on the stream.
  bool forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T, int H, int KV, int hd);
  bool backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* out, const float* lse,
                const __nv_bfloat16* qkv, int B, int T, int H, int KV, int hd);

  // Starts building the forward and backward plans of this shape (backward with the
  // current set_deterministic) on background threads, so that the runtime compilation
  // of cuDNN's engines overlaps whatever the caller does next; the first forward or
  // backward of the shape waits for its plan. Shapes the graphs cannot take are left
  // for forward/backward to refuse.
  void prepare(int B, int T, int H, int KV, int hd);

  // The reason the last forward/backward returned false ("" after a success).
  std::string why_not() const;
  // The plan the last successful call ran: direction, shape, engine index, its
  // numerical and behaviour notes, workspace bytes.
  std::string plan_info() const;

  // Deterministic backward (default true); see above. Plans are cached per setting.
  void set_deterministic(bool on);
  bool deterministic() const;

  // Device bytes this object holds for workspaces (one buffer, grown as needed).
  size_t workspace_bytes() const;

  // cudnnGetVersion() of the loaded library, e.g. 91900 for 9.19.0.
  static size_t version();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace st::cuda

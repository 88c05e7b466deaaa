// The op interface. Every op has a CPU reference (fp32, and fp64 for gradient
// checks) and a CUDA implementation (bf16 compute, fp32 masters) with this same
// signature; the CPU one is the oracle the CUDA one is tested against.
//
// Conventions
// - N = B*T rows (tokens), C = hidden size, row-major everywhere.
// - Linear layers use the Hugging Face layout: weight (OC, IC), y = x·Wᵀ + b.
// - Parameter gradients are ACCUMULATED (+=): gradient accumulation over
//   micro-batches and tied weights both rely on it.
// - Activation gradients are OVERWRITTEN, except rmsnorm_backward's dinp, which
//   ADDS (the residual stream's gradient flows through it).
// - q, k, v live in one fused buffer per row: [q (H*hd) | k (KV*hd) | v (KV*hd)];
//   gate and up likewise: [gate (F) | up (F)]. The layout stores the weights in
//   that order so one GEMM computes each.
// - Dtypes. CPU: everything F32 (or everything F64 for gradient checks).
//   CUDA: activations and weights BF16, parameter gradients (dweight, dbias, dwte,
//   rmsnorm dweight) F32 so that accumulation over micro-batches stays exact;
//   tokens/targets I32. Statistics (rstd, lse, losses) are F64 on the F64 path and
//   F32 otherwise.
#pragma once
#include <cstdlib>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/fp8.h"
#include "backend/tensor.h"

namespace st {

enum class Device { CPU, CUDA };

struct AdamWParams {
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0;
  int step = 1;            // 1-based, for bias correction
  float grad_scale = 1.0f; // multiplies the gradient first (global-norm clipping)
  // Stochastic rounding of bf16 stores (a bf16 param, m or v): element i draws
  // counter_bits(round_key, round_index + i) (core/rng.h) and rounds with its bits
  // (backend/stochastic_round.h), so the CPU and a GPU store the same bits.
  uint64_t round_key = 0;
  uint64_t round_index = 0;
};

// The ops with an argument contract are non-virtual fronts: each checks its
// arguments once (backend.cpp, with op_checks.h), by the backend's OpRules where
// backends differ (the dtypes they compute in, attention's head_dim limit), then calls
// its protected do_<op>, which the backends implement and may take as checked. The
// memory primitives, the hints and the accounting have no contract and stay virtual.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;

  // ---- memory -------------------------------------------------------------------
  virtual Tensor alloc(DType dtype, size_t numel) = 0;  // zero-filled
  virtual void free(Tensor& t) = 0;                      // sets t.data = nullptr
  virtual void zero(Tensor t) = 0;
  void fill(Tensor t, double value);
  // t[i] = float(stddev * counter_normal(key, first + i)) (core/rng.h), the seeded
  // initialisation computed where the tensor lives; t is F32 (or F64: the double).
  void fill_normal(Tensor t, uint64_t key, uint64_t first, double stddev);
  // dst = src element-wise, converting dtype; numel must match.
  void copy(Tensor dst, Tensor src);
  // Host <-> backend: host pointers hold elements of the tensor's own dtype.
  void upload(Tensor dst, const void* host);
  void download(void* host, Tensor src);
  // upload() of token ids (I32), checked on the host first: every id in [0, V) (or
  // equal to `ignore` when has_ignore); a bad one is an error naming `what`, the id
  // and its row, before anything is uploaded. Ops that read ids checked this way
  // skip their own check (on a GPU that check waits for the device).
  void upload_ids(Tensor dst, const int32_t* host, int V, bool has_ignore, int ignore, const char* what);
  // Host memory that download() fills fastest (page-locked on CUDA, so the copy runs
  // at the bus's rate); null when it cannot be had. Freed with free_host.
  virtual void* alloc_host(size_t bytes) { return std::malloc(bytes); }
  virtual void free_host(void* p) { std::free(p); }
  // upload() / download() without waiting, in the order of work of a lane: Compute (the
  // ops' own order), or ToDevice / ToHost, which run beside the compute (CUDA: streams of
  // their own, so both directions of the bus and the kernels overlap). `host` should come
  // from alloc_host; the host must not read or reuse it before the lane's work is done
  // (synchronize() waits for Compute only: make Compute wait for the lane first). The CPU
  // copies at once, whatever the lane.
  enum class Lane { Compute, ToDevice, ToHost };
  void upload_async(Tensor dst, const void* host, Lane lane = Lane::Compute);
  void download_async(void* host, Tensor src, Lane lane = Lane::Compute);
  // Work enqueued on `waiting` from now on starts after everything enqueued on `on` so far.
  virtual void lane_wait(Lane waiting, Lane on) {}
  virtual void synchronize() {}
  // The stream the backend enqueues its work on (a cudaStream_t for CUDA), so that a
  // communicator can enqueue collectives in order with it; null where there is none.
  virtual void* native_stream() { return nullptr; }

  // ---- memory accounting (for the memory table and the peak report) --------------
  // Fixed buffers the backend holds (GEMM workspace, ...).
  virtual size_t workspace_bytes() const { return 0; }
  // Most memory the backend's allocations held at once since the last reset;
  // 0 where the backend does not track it.
  virtual size_t peak_allocated_bytes() const { return 0; }
  virtual void reset_peak_allocated() {}
  // Memory this backend could still allocate now, as the system reports it, for the
  // check before a run allocates (CPU: host RAM, MemAvailable in /proc/meminfo within
  // any cgroup limit; CUDA: the device's free memory, cudaMemGetInfo); 0 when unknown.
  virtual size_t memory_available_bytes() const { return 0; }
  // Where that number comes from, for messages ("MemAvailable", "cudaMemGetInfo").
  virtual std::string memory_available_source() const { return "unknown"; }

  // ---- element-wise -------------------------------------------------------------
  // out = a + b  (n)
  void add(Tensor out, Tensor a, Tensor b, size_t n);
  // acc += x  (n)
  void accumulate(Tensor acc, Tensor x, size_t n);
  // Sum of squares of x[0:n), computed in double, returned on the host.
  double sum_squares(Tensor x, size_t n);
  // sum_squares of each part, summed in order on the host: the same double as
  // calling sum_squares part by part, with one wait for the device instead of many.
  double sum_squares_total(const std::vector<std::pair<Tensor, size_t>>& parts);

  // ---- embedding ----------------------------------------------------------------
  // out (N,C) = wte (V,C)[tokens (N)]. Token ids outside [0,V) are an error.
  void embedding_forward(Tensor out, Tensor tokens, Tensor wte, int N, int C, int V);
  // dwte (V,C) += scatter of dout (N,C) by tokens.
  void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int N, int C, int V);

  // ---- RMSNorm: out = inp / sqrt(mean(inp^2) + eps) * weight ---------------------
  // out (N,C), rstd (N) saved for backward, inp (N,C), weight (C).
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, int N, int C, float eps);
  // dinp (N,C) +=, dweight (C) +=.
  void rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd, int N,
                        int C);
  // The residual add fused into the norm that follows it: sum (N,C) = a + b, then
  // out, rstd = rmsnorm(sum). The norm reads the rounded sum, so the result equals
  // add() followed by rmsnorm_forward() bit for bit.
  void add_rmsnorm_forward(Tensor sum, Tensor out, Tensor rstd, Tensor a, Tensor b, Tensor weight, int N, int C,
                           float eps);

  // ---- linear: out (N,OC) = inp (N,IC) · weight (OC,IC)ᵀ + bias (OC, may be empty) -
  void matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias, int N, int IC, int OC);
  // dinp (N,IC) = dout·weight (overwritten; skipped when empty),
  // dweight (OC,IC) += doutᵀ·inp, dbias (OC) += Σ_rows dout (skipped when empty).
  void matmul_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight, int N,
                       int IC, int OC);

  // ---- FP8 linear layers (train.matmul_dtype = "fp8"; formats and scales: fp8.h) ------
  // q (rows, cols) = fp8(x (rows, cols) * s) and qt (cols, rows) = its transpose, with
  // s = fp8_scale(amax |x|) of the whole tensor; q and qt share a dtype (F8E4M3 or
  // F8E5M2), either may be empty but not both; inv_scale (1, F32) = 1/s, for
  // matmul_fp8. Computed where the tensors live: no wait for the device. With
  // `reuse_scale`, inv_scale is read instead: the scale of an earlier quantization of
  // the same values (a layer's input or weight again in backward), so x is read once.
  // With `amax` (1, F32; may be empty): amax = max(amax, amax |x|) in the same pass,
  // a step's running amax for delayed scaling (fp8_roll_scales). Non-negative floats
  // order as their bits, and a NaN is larger than every finite value.
  void fp8_quantize(Tensor q, Tensor qt, Tensor inv_scale, Tensor x, int rows, int cols, bool reuse_scale = false,
                    Tensor amax = {});
  // qt (cols, rows) = q (rows, cols) transposed, the FP8 bytes as they are (either
  // format): a weight gathered already cast (dist.fp8_gather), for the backward GEMM
  // that reads it the other way.
  void fp8_transpose(Tensor qt, Tensor q, int rows, int cols);
  // Delayed scaling, once per optimizer step (train.fp8_scaling = "delayed"): for each
  // of n tensors i, history[i * len + pos] = amax[i], amax[i] = 0, and
  // inv_scale[i * stride] = 1 / fp8_scale(max_j history[i * len + j], format's largest
  // finite): the scale the next step's casts reuse, from the last `len` steps' amax.
  void fp8_roll_scales(Tensor inv_scale, int stride, Tensor amax, Tensor history, int n, int len, int pos,
                       Fp8Format format);
  // out (M, N) = a (M, K) · b (N, K)ᵀ · a_inv · b_inv (+ bias (N)), fp32 accumulation.
  // a, b: fp8, not both e5m2; a_inv, b_inv (1, F32) from fp8_quantize. out: the
  // activation dtype, overwritten; or, with `accumulate`, the parameter-gradient dtype,
  // added to (+=, no bias). M, K and N are multiples of 16 (the FP8 tensor cores').
  // fast_accum: the tensor cores may keep the running sum in their own narrower
  // accumulator without promoting it to fp32 along K (faster; a GPU choice: the CPU's
  // emulation accumulates exactly either way).
  void matmul_fp8(Tensor out, Tensor a, Tensor a_inv, Tensor b, Tensor b_inv, Tensor bias, int M, int K, int N,
                  bool accumulate, bool fast_accum = false);
  // "" when this backend computes the two ops above, else why it cannot (a GPU without
  // FP8 tensor cores): a run asking for fp8 is refused with it before it allocates.
  virtual std::string fp8_unsupported_reason() const { return ""; }

  // ---- rotary position embedding (Hugging Face "rotate_half" convention) ----------
  // In place on the q and k parts of qkv (B*T, (H+2KV)*hd); position of row r is
  // r % T; inv_freq[i] = theta^(-2i/hd), i < hd/2; pairs are (j, j + hd/2).
  void rope_forward(Tensor qkv, int B, int T, int H, int KV, int hd, float theta);
  // The transpose (rotation by -angle), in place on dqkv.
  void rope_backward(Tensor dqkv, int B, int T, int H, int KV, int hd, float theta);

  // ---- causal grouped-query attention, softmax scale 1/sqrt(hd) -----------------
  // out (B*T, H*hd); lse (B, H, T) log-sum-exp of each score row, saved for backward;
  // qkv (B*T, (H+2KV)*hd). Query head h reads kv head h / (H/KV).
  // Never materialises more than one score row per (b, h) at a time.
  void attention_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int H, int KV, int hd);
  // A hint, before the first step: attention will run at this shape. A backend that
  // builds per-shape plans (cuDNN on CUDA) may start building them in the background
  // so that the first step does not wait for them. Changes no result.
  virtual void prepare_attention(int /*B*/, int /*T*/, int /*H*/, int /*KV*/, int /*hd*/) {}
  // dqkv (B*T, (H+2KV)*hd) overwritten.
  void attention_backward(Tensor dqkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv, int B, int T, int H, int KV,
                          int hd);

  // ---- SwiGLU: out (N,F) = silu(gate) * up, gu (N, 2F) = [gate | up] per row ------
  void swiglu_forward(Tensor out, Tensor gu, int N, int F);
  // dgu (N, 2F) overwritten.
  void swiglu_backward(Tensor dgu, Tensor dout, Tensor gu, int N, int F);
  // swiglu_backward with its output cast to FP8 in the same pass, for the gate|up
  // layer's backward under delayed scaling: q (N, 2F) and/or qt (2F, N) (either may
  // be empty, not both) = fp8_quantize(dgu, inv_scale given, amax) of the dgu that
  // swiglu_backward would write (rounded to the activation dtype first), bit for bit;
  // dgu itself is not written. A backend without a fused kernel does exactly that.
  void swiglu_backward_fp8(Tensor q, Tensor qt, Tensor inv_scale, Tensor amax, Tensor dout, Tensor gu, int N, int F);
  // swiglu_forward with its output cast to FP8 in the same pass, for the down layer's
  // input under delayed scaling: q (N, F) and/or qt (F, N) (not both empty) =
  // fp8_quantize(out, inv_scale given, amax) of the out that swiglu_forward would write
  // (rounded to the activation dtype first), bit for bit; out itself is not written.
  void swiglu_forward_fp8(Tensor q, Tensor qt, Tensor inv_scale, Tensor amax, Tensor gu, int N, int F);

  // ---- cross-entropy, fused forward + backward, in place over logits -------------
  // logits (N,V) in; losses (N) out (statistics dtype): -log softmax(logits)[target], 0 where
  // target == ignore_index. When `grad` is true, logits are overwritten with
  // dloss_scale * (softmax - onehot(target)) (zero rows where ignored).
  // Targets outside [0,V) other than ignore_index are an error.
  void cross_entropy(Tensor losses, Tensor logits, Tensor targets, int N, int V, int ignore_index, float dloss_scale,
                     bool grad);
  // cross_entropy with grad whose dlogits also go to dq (N, V; e5m2), cast in the same
  // pass for the lm_head's FP8 gradients. |dlogits| <= |dloss_scale| bounds them, so
  // their scale is known before they exist: s = fp8_scale(|dloss_scale|, e5m2's largest
  // finite), and inv_scale (1, F32) is set to 1 / s. dq = fp8_quantize(dlogits as
  // cross_entropy writes them (rounded to the logits' dtype), that scale), bit for bit;
  // a backend without a fused kernel does exactly that. With dqt (V, N; e5m2, may be
  // empty): also dq's transpose (the lm_head's FP8 weight gradient reads it), and then
  // the logits are left unspecified (the gradient lives in dq and dqt only: a fused
  // kernel need not write it back). round_key nonzero: the codes round stochastically
  // (e5m2_round_stochastic, element r * V + v of the stream random8(round_key, .))
  // instead of to nearest: the same bits on every backend.
  void cross_entropy_fp8(Tensor losses, Tensor logits, Tensor dq, Tensor dqt, Tensor inv_scale, Tensor targets, int N,
                         int V, int ignore_index, float dloss_scale, uint64_t round_key = 0);
  // The scale cross_entropy_fp8 casts with.
  static float dlogits_fp8_scale(float dloss_scale);

  // ---- optimizer: AdamW with decoupled weight decay and bias correction ---------
  // param, grad, m, v (n) are F32. Caller passes weight_decay = 0 for no-decay spans.
  // param (n) F32 or BF16, grad (n) F32, m and v (n) both F32 or both BF16: the update
  // is computed in double from the stored values; bf16 stores round stochastically (p).
  void adamw(Tensor param, Tensor grad, Tensor m, Tensor v, size_t n, const AdamWParams& p);
  // adamw, then copy (n, any float dtype) = the updated param converted, in one pass
  // where the backend can (the compute-dtype copy of the shard that gathers read).
  void adamw_copy(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor copy, size_t n, const AdamWParams& p);

 protected:
  // What a backend computes in (the "Dtypes" convention above), for the fronts' checks.
  struct OpRules {
    DType act[2];               // the activation dtypes (CPU: f32, f64; CUDA: bf16, f32)
    const char* act_text;       // ends the message for any other: "the CPU backend computes in f32 or f64"
    bool f32_grads_and_stats;   // parameter gradients and statistics are F32 (CUDA); else the activations' dtype
    int max_head_dim;           // attention's largest head_dim; 0: no limit
    const char* max_head_dim_text;  // whose limit it is: "the CUDA kernels'"
  };
  virtual OpRules op_rules() const = 0;

  // The activation dtype of an op, taken from one of its activation arguments; an
  // error naming the op and the argument unless it is one of op_rules().act.
  DType act_dtype(const char* op, const char* name, Tensor t) const;
  // The dtype of parameter gradients and of statistics (rstd, lse, losses) next to
  // activations of dtype `act`.
  DType side_dtype(DType act) const { return op_rules().f32_grads_and_stats ? DType::F32 : act; }

  // Ids outside [0, V) (other than `ignore` when has_ignore) are an error naming `op`,
  // `what`, the id and its first offending row; read where the ids live (the CPU on the
  // host, CUDA on the device unless upload_ids checked them).
  virtual void check_ids(const char* op, const char* what, Tensor ids, int N, int V, bool has_ignore,
                         int ignore) = 0;

  // The ops proper, called by the fronts above once the arguments are checked (and
  // n > 0 or numel > 0 where a front returns early on nothing to do).
  virtual void do_fill(Tensor t, double value) = 0;
  // The default computes on the host and uploads; backends override it.
  virtual void do_fill_normal(Tensor t, uint64_t key, uint64_t first, double stddev);
  virtual void do_copy(Tensor dst, Tensor src) = 0;
  virtual void do_upload(Tensor dst, const void* host) = 0;
  virtual void do_download(void* host, Tensor src) = 0;
  virtual void do_upload_async(Tensor dst, const void* host, Lane) { do_upload(dst, host); }
  virtual void do_download_async(void* host, Tensor src, Lane) { do_download(host, src); }
  // The ids are checked (host values in range): upload them; a backend may remember it.
  virtual void do_upload_ids(Tensor dst, const int32_t* host, int V, bool has_ignore, int ignore) {
    do_upload(dst, host);
  }
  virtual void do_add(Tensor out, Tensor a, Tensor b, size_t n) = 0;
  virtual void do_accumulate(Tensor acc, Tensor x, size_t n) = 0;
  virtual double do_sum_squares(Tensor x, size_t n) = 0;
  // Parts with n == 0 add 0.
  virtual double do_sum_squares_total(const std::vector<std::pair<Tensor, size_t>>& parts) {
    double total = 0;
    for (const auto& [x, n] : parts) total += n ? do_sum_squares(x, n) : 0.0;
    return total;
  }
  virtual void do_embedding_forward(Tensor out, Tensor tokens, Tensor wte, int N, int C, int V) = 0;
  virtual void do_embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int N, int C, int V) = 0;
  virtual void do_rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, int N, int C, float eps) = 0;
  virtual void do_rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd,
                                   int N, int C) = 0;
  virtual void do_add_rmsnorm_forward(Tensor sum, Tensor out, Tensor rstd, Tensor a, Tensor b, Tensor weight, int N,
                                      int C, float eps) {
    do_add(sum, a, b, static_cast<size_t>(N) * C);
    do_rmsnorm_forward(out, rstd, sum, weight, N, C, eps);
  }
  virtual void do_matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias, int N, int IC, int OC) = 0;
  virtual void do_matmul_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                                  int N, int IC, int OC) = 0;
  virtual void do_fp8_quantize(Tensor q, Tensor qt, Tensor inv_scale, Tensor x, int rows, int cols,
                               bool reuse_scale, Tensor amax) = 0;
  virtual void do_fp8_roll_scales(Tensor inv_scale, int stride, Tensor amax, Tensor history, int n, int len, int pos,
                                  Fp8Format format) = 0;
  virtual void do_fp8_transpose(Tensor qt, Tensor q, int rows, int cols) = 0;
  virtual void do_matmul_fp8(Tensor out, Tensor a, Tensor a_inv, Tensor b, Tensor b_inv, Tensor bias, int M, int K,
                             int N, bool accumulate, bool fast_accum) = 0;
  // sign +1: rope_forward; -1: rope_backward.
  virtual void do_rope(Tensor qkv, int B, int T, int H, int KV, int hd, float theta, int sign) = 0;
  virtual void do_attention_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int H, int KV, int hd) = 0;
  virtual void do_attention_backward(Tensor dqkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv, int B, int T,
                                     int H, int KV, int hd) = 0;
  virtual void do_swiglu_forward(Tensor out, Tensor gu, int N, int F) = 0;
  virtual void do_swiglu_backward(Tensor dgu, Tensor dout, Tensor gu, int N, int F) = 0;
  virtual void do_swiglu_backward_fp8(Tensor q, Tensor qt, Tensor inv_scale, Tensor amax, Tensor dout, Tensor gu,
                                      int N, int F);
  virtual void do_swiglu_forward_fp8(Tensor q, Tensor qt, Tensor inv_scale, Tensor amax, Tensor gu, int N, int F);
  virtual void do_cross_entropy(Tensor losses, Tensor logits, Tensor targets, int N, int V, int ignore_index,
                                float dloss_scale, bool grad) = 0;
  virtual void do_cross_entropy_fp8(Tensor losses, Tensor logits, Tensor dq, Tensor dqt, Tensor inv_scale,
                                   Tensor targets, int N, int V, int ignore_index, float dloss_scale,
                                   uint64_t round_key);
  virtual void do_adamw(Tensor param, Tensor grad, Tensor m, Tensor v, size_t n, const AdamWParams& p) = 0;
  virtual void do_adamw_copy(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor copy, size_t n,
                             const AdamWParams& p) {
    do_adamw(param, grad, m, v, n, p);
    do_copy(copy.slice(0, n), param.slice(0, n));
  }

 private:
  // A decorator (profiler.h): its own front checks each call, then it hands the call
  // to the inner backend's do_<op>, op_rules and check_ids, so nothing is checked twice.
  friend class ProfilingBackend;

  void check_rope(const char* op, Tensor qkv, int B, int T, int H, int KV, int hd, float theta) const;
  void check_attention(const char* op, int B, int T, int H, int KV, int hd) const;
  // cross_entropy's and cross_entropy_fp8's shared checks (dims, losses, logits,
  // targets and their ids).
  void check_cross_entropy(const char* op, Tensor losses, Tensor logits, Tensor targets, int N, int V,
                           int ignore_index);
};

// The CPU reference backend (OpenBLAS GEMMs, fp32 and fp64).
std::unique_ptr<Backend> make_cpu_backend();

// The CUDA backend on device `device_index` (bf16 activations, fp32 gradients and
// optimizer state). Defined only in builds with CUDA (SHARDTRAIN_HAVE_CUDA).
std::unique_ptr<Backend> make_cuda_backend(int device_index);
// True when this build has the CUDA backend and a CUDA device is present.
bool cuda_available();

}  // namespace st

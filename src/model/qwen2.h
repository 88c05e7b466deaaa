// The Qwen2 decoder as a forward/backward program over the op interface.
// It owns activations for one micro-batch shape (B, T) and reads weights through a
// ParamProvider, one unit at a time, so FSDP decides what is gathered when.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/options.h"
#include "model/fp8_scaling_state.h"
#include "model/layout.h"
#include "model/param_provider.h"

namespace st {

struct LossSum {
  double sum = 0;     // Σ per-token loss over non-ignored targets
  int64_t count = 0;  // number of non-ignored targets
};

// Activations not kept from forward to backward, recomputed by the backward of each
// layer instead (less memory, more work; the results are the same bits):
//   none:   everything kept
//   norm:   the two RMSNorm outputs (2 x C per token per layer; one norm pass each)
//   swiglu: silu(gate) * up (F per token per layer; one element-wise pass)
//   ffn:    the second norm, gate|up and the SwiGLU output (C + 3F; one GEMM more)
//   attn:   the first norm, q|k|v, the attention output and its statistics
//           (C + QKV + C; the QKV GEMM, RoPE and the attention forward again)
//   block:  all but the layer's input (the whole layer forward again)
enum class Recompute { None, Norm, Swiglu, Ffn, Attn, Block };
// The names of Recompute, in order: recompute_choices() (config/options.h).
Recompute parse_recompute(const std::string& name);   // an error naming the choices

// Which of the blocks' linear layers compute in FP8 (Qwen2Model's fp8 argument).
struct Fp8Options {
  bool on = false;       // train.matmul_dtype = "fp8"
  bool delayed = false;  // train.fp8_scaling = "delayed"
  // Bit k < 4: the layer kind of slot k in every block (0 qkv, 1 o, 2 gate|up, 3 down);
  // bit 4: the lm_head, all three of its GEMMs; bit 5: its two gradients' GEMMs only,
  // the logits in bf16; bit 6: its forward only (the logits), the gradients in bf16
  // (train.fp8_layers, in fp8_layer_kinds()'s order).
  unsigned kinds = 0xF;
  int bf16_end_blocks = 0;  // the first and the last this many blocks stay in bf16
  bool fast_accum = false;  // the forward GEMMs with the tensor cores' fast accumulation
  bool dlogits_stochastic = false;  // the lm_head's e5m2 logit gradient rounded stochastically
  static constexpr unsigned kLmHead = 1u << 4, kLmHeadGrad = 1u << 5, kLmHeadFwd = 1u << 6;
  // The lm_head's input and weight gradients in FP8 (lm_head or lm_head_grad).
  bool lm_head() const { return on && (kinds & (kLmHead | kLmHeadGrad)); }
  // Its forward (the logits) in FP8 (lm_head or lm_head_fwd).
  bool lm_head_forward() const { return on && (kinds & (kLmHead | kLmHeadFwd)); }
  // Any of its GEMMs in FP8 (the shape rules and the scales apply).
  bool lm_head_any() const { return lm_head() || lm_head_forward(); }
  bool delayed_on() const { return on && delayed; }  // delayed scales to keep and roll
  // From the run's [train] keys (matmul_dtype, fp8_scaling, fp8_layers,
  // fp8_bf16_end_blocks, fp8_fast_accum, fp8_dlogits_rounding).
  static Fp8Options from(const TrainOptions& t);
};

class Qwen2Model {
 public:
  // dtype: activation dtype (F32 or F64 on the CPU; BF16 on CUDA).
  // head_chunk: rows of logits materialised at a time by the lm_head + loss.
  // fp8.on: the blocks' linear layers (QKV, O, gate|up, down; those fp8.kinds and
  // fp8.bf16_end_blocks leave) compute in FP8 (train.matmul_dtype = "fp8"; e4m3 weights
  // and activations, e5m2 gradients, per-tensor scales, fp32 accumulation); attention
  // stays in `dtype`, and so does the lm_head unless fp8.kinds names it: then its input
  // and weight gradients run in FP8 (the logits' gradient cast by the loss kernel with
  // the scale its bound gives, and transposed, cross_entropy_fp8), and with lm_head (not
  // lm_head_grad) its forward too; lm_head_fwd runs the forward alone in FP8 (the loss,
  // the logits' gradient and the two gradient GEMMs in `dtype`). Needs the hidden, q/kv, FFN and token (B*T)
  // dimensions, and the vocabulary with an FP8 lm_head, to be multiples of 16.
  // fp8.delayed (train.fp8_scaling = "delayed"): activations and gradients are cast in
  // one pass with the scale of the largest amax of their last kFp8History steps
  // (begin_step), recording this step's amax as they go; the first step, with no
  // history, scales from the current amax. Weights always use their current amax.
  Qwen2Model(const ParamLayout& layout, Backend& backend, DType dtype, int B, int T, int head_chunk = 0,
             Recompute recompute = Recompute::None, Fp8Options fp8 = {});
  ~Qwen2Model();
  Qwen2Model(const Qwen2Model&) = delete;
  Qwen2Model& operator=(const Qwen2Model&) = delete;

  // Before the first micro-batch of each optimizer step. With delayed FP8 scaling, it
  // moves the last step's amax into the history and sets this step's scales (on the
  // device, nothing waits); otherwise it does nothing.
  void begin_step();
  static constexpr int kFp8History = 16;
  // Delayed scaling: this step's running amax of the blocks' FP8 inputs and output
  // gradients (2 x L x 4 f32 on the device), recorded by the casts; empty otherwise.
  // After the last micro-batch of a step the trainer makes it the maximum over the
  // ranks (Comm::all_reduce_max), so every rank scales the next step alike.
  Tensor fp8_step_amax() const { return fp8_opts_.delayed_on() ? amax_ : Tensor{}; }
  // The scaling state to save with a checkpoint, between steps (copied from the device:
  // it waits for the work enqueued so far); nullopt when no matmul is FP8.
  std::optional<Fp8ScalingState> fp8_scaling_state() const;
  // Continues from a saved state (before the first step of a resumed run): "" when
  // restored, else why it does not fit this model's FP8 settings, and nothing changes
  // (the next step then scales from its current amax, as a fresh start does).
  std::string restore_fp8_scaling(const Fp8ScalingState& s);

  // One micro-batch: forward, loss, and backward into provider.grad(...).
  // tokens, targets: host arrays of B*T ids. Gradients are scaled by dloss_scale
  // (1 / number of valid targets in the whole global batch gives the mean).
  LossSum forward_backward(ParamProvider& params, const int32_t* tokens, const int32_t* targets,
                           float dloss_scale, int ignore_index);

  // Forward only. If logits_out is not null it receives B*T*V fp32 logits.
  LossSum forward(ParamProvider& params, const int32_t* tokens, const int32_t* targets, int ignore_index,
                  float* logits_out = nullptr);

  // Bytes of activation and scratch memory this model holds.
  size_t activation_bytes() const;
  // What activation_bytes() comes to for these arguments (as the constructor's),
  // computed without building or allocating anything, in 64 bits (saturating at
  // UINT64_MAX): the memory check before a run allocates.
  static uint64_t activation_bytes_for(const ModelConfig& c, DType dtype, int64_t B, int64_t T, int head_chunk = 0,
                                       Recompute recompute = Recompute::None, const Fp8Options& fp8 = {});
  // "" when the blocks' linear layers can run in FP8 at this shape, else why not
  // (a dimension that is not a multiple of 16, naming it).
  // lm_head: the lm_head in FP8 too (the vocabulary size checked as well).
  static std::string fp8_shape_problem(const ModelConfig& c, int64_t B, int64_t T, bool lm_head = false);
  // The FP8 weights a provider may hand over already cast (ParamProvider::fp8_weights),
  // per unit: a block's FP8 layers that end it, the MLP's (gate|up fused, then down, or
  // down alone), in order; none for other units, or where the MLP is bf16 (the QKV and
  // O weights, FP8 or not, sit before bf16 tensors and are not among them).
  static std::vector<std::vector<Fp8Span>> fp8_gather_spans(const ParamLayout& layout, const Fp8Options& o);

 private:
  void forward_blocks(ParamProvider& params);
  // Final norm, lm_head and per-token losses (and their gradient when `grad`).
  void head(ParamProvider& params, bool grad, float dloss_scale, int ignore_index, float* logits_out);
  // Σ of the per-token losses of the last head() over valid targets (host copy); reads
  // them back from the device, so it waits for the work enqueued so far.
  LossSum sum_losses(const int32_t* host_targets, int ignore_index);
  void backward_blocks(ParamProvider& params);
  // Recomputes what recompute_ dropped for layer l from what was kept, into the
  // layer's (shared) buffers; w: the layer's gathered weights.
  void recompute_layer(int l, Tensor w);
  // The blocks' linear layers: matmul_forward / matmul_backward in the activation
  // dtype, or through fp8_quantize + matmul_fp8 when fp8_opts_.on. slot = 4 * layer + (0 qkv,
  // 1 o, 2 gate|up, 3 down): where the forward keeps its input's and weight's scales.
  void linear_forward(int slot, Tensor out, Tensor x, Tensor w, Tensor b, int IC, int OC);
  // Whether the linear layer of this slot computes in FP8 (fp8_opts_.on and its kind and block
  // chosen), and whether its delayed scales are given (a history exists).
  bool fp8_at(int slot) const { return fp8_layer(fp8_opts_, L_, slot); }
  static bool fp8_layer(const Fp8Options& o, int L, int slot);
  // The FP8 input of slot kept transposed for its weight gradient, or empty (not FP8, or
  // the O projection, whose input attention's backward needs in bf16 anyway).
  Tensor kept_xt(int slot) const { return xt_[slot % 4].empty() ? Tensor{} : xt_[slot % 4][slot / 4]; }
  bool fp8_given() const { return fp8_opts_.delayed_on() && fp8_rolls_ > 0; }
  // The amax_ element of slot's input (region 0) or output gradient (region 1).
  Tensor fp8_amax(int region, int slot) const { return amax_.slice(size_t(region) * L_ * 4 + size_t(slot), 1); }
  void linear_backward(int slot, Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x, Tensor w, int IC, int OC);
  // Whether the down layer of `slot` takes its input from swiglu_forward_fp8 (delayed
  // scaling with a history), and SwiGLU of layer l into sw_ or, so, into xq_ and the
  // kept transpose.
  bool fused_swiglu_cast(int slot) const { return fp8_given() && fp8_at(slot); }
  void swiglu_into_down(int l);
  bool input_dropped(int slot) const {
    const int k = slot % 4;
    return k == 0 ? drop_ln1_ : k == 2 ? drop_ln2_ : k == 3 ? drop_sw_ : drop_attn_;
  }
  // After recompute_layer refilled the bf16 input x of slot (dropped, so its kept
  // transpose is the shared buffer): the transpose again, at the forward's scale.
  void recast_kept_xt(int slot, Tensor x, int IC);
  // The weight of FP8 slot `slot` as the provider handed it over cast (fp8w_), with its
  // inverse scale into *inv; empty: not handed over (cast it here).
  Tensor given_wq(int slot, Tensor* inv) const;

  const ParamLayout& layout_;
  Backend& be_;
  DType dt_, st_;  // activations, statistics
  int B_, T_, N_, C_, F_, V_, H_, KV_, hd_, QKV_, L_, chunk_;
  float eps_, theta_;
  Recompute recompute_;
  Fp8Options fp8_opts_;
  bool fp8_begun_ = false;  // begin_step has run: the next one rolls the history
  int fp8_rolls_ = 0;       // rolls so far: the scales are given once there is one
  bool recording_ = false;  // forward_backward, not forward: the casts record amax
  // Which per-layer activations are one shared buffer, refilled by recompute_layer.
  bool drop_ln1_ = false, drop_ln2_ = false, drop_attn_ = false, drop_mid_ = false, drop_gu_ = false,
       drop_sw_ = false;

  // Activations, saved for backward (shape comments per layer l).
  Tensor tokens_, targets_;        // (N) i32
  std::vector<Tensor> resid_;      // L+1 x (N, C): input of layer l; resid_[L] feeds the final norm
  std::vector<Tensor> ln1_, ln2_;  // L x (N, C)
  std::vector<Tensor> rstd1_, rstd2_;  // L x (N)
  std::vector<Tensor> qkv_;        // L x (N, QKV) after RoPE
  std::vector<Tensor> att_;        // L x (N, C) attention output before o_proj
  std::vector<Tensor> lse_;        // L x (B, H, T)
  std::vector<Tensor> mid_;        // L x (N, C) residual after attention
  std::vector<Tensor> gu_;         // L x (N, 2F) [gate | up]
  std::vector<Tensor> sw_;         // L x (N, F) silu(gate) * up
  // An FP8 layer's input (ln1 for QKV, ln2 for gate|up, sw for down) is kept as the
  // e4m3 transpose its weight gradient reads, (IC, N) per layer, written by the
  // forward's cast; its bf16 copy is then one shared buffer (nothing in backward reads
  // it). Dropped by recompute: one shared transpose, recast in recompute_layer.
  std::vector<Tensor> xt_[4];
  Tensor lnf_, rstdf_;             // (N, C), (N)
  Tensor logits_;                  // (chunk, V)
  Tensor losses_;                  // (N)
  // Backward scratch.
  Tensor dresid_;                  // (N, C) gradient of the residual stream
  Tensor dln_;                     // (N, C)
  Tensor datt_;                    // (N, C)
  Tensor dqkv_;                    // (N, QKV)
  Tensor dgu_;                     // (N, 2F)
  Tensor dsw_;                     // (N, F)
  Tensor tmp_;                     // (N, C)
  // FP8 scratch (fp8_opts_.on only), reused by every linear layer: an input (N, IC) or its
  // transpose, a weight (OC, IC) or its transpose (e4m3); an output gradient (N, OC)
  // and its transpose (e5m2). scales_: the inverse scales per linear layer, one
  // 16-byte slot each (cuBLASLt reads them in place): input, weight and output
  // gradient regions of L x 4 slots (fp8_inv). amax_: this step's amax of each input,
  // then of each output gradient (2 x L x 4); history_: the last kFp8History steps' of
  // each (delayed scaling).
  Tensor xq_, wq_, dq_, dqt_, scales_, amax_, history_;
  // An FP8 lm_head (fp8_opts_.lm_head_any()): its weight cast (V, C; lm_head_forward())
  // and transposed (C, V; lm_head(), as the rest but the scales) (e4m3, current scaling,
  // once a micro-batch), a chunk's logit
  // gradient (chunk, V) and its transpose (V, chunk) (e5m2), the chunk's final-norm
  // output transposed (C, chunk; e4m3), and the inverse scales of the final norm's
  // output, the weight and the logits' gradient (16-byte slots, as scales_).
  Tensor head_wq_, head_wqt_, head_dq_, head_dqt_, head_xt_, head_scales_;
  // Chunks of logits whose gradient has been cast so far: the stochastic rounding's
  // stream for each is counter_bits(kDlogitsStream, its number), so a run repeats.
  uint64_t dlogits_casts_ = 0;
  // The block being computed: its FP8 weights as its provider handed them over, and
  // what fp8_gather_spans says they are, per unit.
  Fp8Weights fp8w_;
  std::vector<std::vector<Fp8Span>> fp8_spans_;
  Tensor fp8_inv(int region, int slot) const;
  std::vector<Tensor*> owned_;
};

}  // namespace st

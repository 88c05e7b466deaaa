#include "model/qwen2.h"

#include <algorithm>
#include <array>
#include <limits>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/nvtx.h"
#include "core/rng.h"

namespace st {

Recompute parse_recompute(const std::string& name) {
  const auto& names = recompute_choices();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<Recompute>(i);
  std::string all;
  for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
  fail("train.recompute: unknown choice '", name, "' (one of ", all, ")");
}

Fp8Options Fp8Options::from(const TrainOptions& t) {
  Fp8Options o;
  o.on = t.matmul_dtype == "fp8";
  o.delayed = t.fp8_scaling == "delayed";
  o.kinds = 0;
  const auto& kinds = fp8_layer_kinds();
  for (const std::string& k : t.fp8_layers) {
    const auto it = std::find(kinds.begin(), kinds.end(), k);
    ST_CHECK(it != kinds.end(), "train.fp8_layers: unknown layer '", k, "'");
    o.kinds |= 1u << (it - kinds.begin());
  }
  o.bf16_end_blocks = t.fp8_bf16_end_blocks;
  o.fast_accum = t.fp8_fast_accum;
  o.dlogits_stochastic = t.fp8_dlogits_rounding == "stochastic";
  return o;
}

namespace {

// The stochastic rounding of the lm_head's logit gradient: chunk k's stream key is
// counter_bits(kDlogitsStream, k) (made odd: a key of 0 means rounding to nearest).
constexpr uint64_t kDlogitsStream = 0x646c6f6769747301ull;  // "dlogits" + 1

// Which activations a recompute choice leaves out (recomputed in backward): the
// constructor allocates by it and activation_bytes_for counts by it.
struct Dropped {
  bool ln1, ln2, attn, mid, gu, sw;
};
// A per-layer buffer: its own, the one all such layers share (refilled for each), or none.
enum class BufferMode { None, Own, Shared };

// A linear layer's input in bf16 (transposed = false) or its kept e4m3 transpose: the
// bf16 copy is shared once the transpose is kept (only the weight gradient reads the
// input in backward) or recompute drops it; the transpose exists for FP8 layers only,
// shared when dropped (recompute_layer recasts it).
BufferMode input_mode(bool dropped, bool fp8, bool transposed) {
  if (transposed) return !fp8 ? BufferMode::None : dropped ? BufferMode::Shared : BufferMode::Own;
  return dropped || fp8 ? BufferMode::Shared : BufferMode::Own;
}

Dropped dropped_by(Recompute r) {
  return {r == Recompute::Norm || r == Recompute::Attn || r == Recompute::Block,
          r == Recompute::Norm || r == Recompute::Ffn || r == Recompute::Block,
          r == Recompute::Attn || r == Recompute::Block,
          r == Recompute::Block,
          r == Recompute::Ffn || r == Recompute::Block,
          r == Recompute::Swiglu || r == Recompute::Ffn || r == Recompute::Block};
}

}  // namespace

Qwen2Model::Qwen2Model(const ParamLayout& layout, Backend& backend, DType dtype, int B, int T, int head_chunk,
                       Recompute recompute, Fp8Options fp8)
    : layout_(layout), be_(backend), dt_(dtype), st_(dtype == DType::F64 ? DType::F64 : DType::F32), B_(B), T_(T),
      recompute_(recompute), fp8_opts_(fp8) {
  const ModelConfig& c = layout.config();
  ST_CHECK(B >= 1 && T >= 1, "micro-batch shape must be positive, got B=", B, " T=", T);
  N_ = B * T;
  C_ = c.hidden_size;
  F_ = c.intermediate_size;
  V_ = c.vocab_size;
  H_ = c.num_heads;
  KV_ = c.num_kv_heads;
  hd_ = c.head_dim();
  QKV_ = (H_ + 2 * KV_) * hd_;
  L_ = c.num_layers;
  chunk_ = head_chunk > 0 ? std::min(head_chunk, N_) : N_;
  eps_ = static_cast<float>(c.rms_norm_eps);
  theta_ = static_cast<float>(c.rope_theta);
  fp8_spans_ = fp8_gather_spans(layout, fp8);
  if (fp8_opts_.on) {  // refused before anything is allocated (a throw here leaves nothing behind)
    const std::string why = fp8_shape_problem(c, B, T, fp8.lm_head_any());
    ST_CHECK(why.empty(), "train.matmul_dtype=fp8: ", why);
    ST_CHECK(!fp8.lm_head_any() || chunk_ % 16 == 0, "train.fp8_layers with the lm_head: the logits' chunk of ", chunk_,
             " rows is not a multiple of 16");
  }

  auto make = [&](Tensor& t, DType d, size_t n) {
    t = be_.alloc(d, n);
    owned_.push_back(&t);
  };
  auto make_vec = [&](std::vector<Tensor>& v, int count, DType d, size_t n, bool shared = false) {
    v.resize(count);
    if (!shared) {
      for (auto& t : v) make(t, d, n);
      return;
    }
    if (count == 0) return;
    make(v[0], d, n);  // one buffer, refilled for each layer (recomputed in backward)
    for (auto& t : v) t = v[0];
  };
  const Dropped d = dropped_by(recompute);
  drop_ln1_ = d.ln1, drop_ln2_ = d.ln2, drop_attn_ = d.attn, drop_mid_ = d.mid, drop_gu_ = d.gu, drop_sw_ = d.sw;
  const size_t N = N_, C = C_, F = F_;
  make(tokens_, DType::I32, N);
  make(targets_, DType::I32, N);
  make_vec(resid_, L_ + 1, dt_, N * C);
  // Per layer: a buffer of its own, the one buffer the layers share, or none.
  auto make_layers = [&](std::vector<Tensor>& v, DType dt, size_t n, const auto& mode) {
    v.assign(L_, Tensor{});
    int first = -1;
    for (int l = 0; l < L_; ++l) {
      const BufferMode m = mode(l);
      if (m == BufferMode::Own || (m == BufferMode::Shared && first < 0)) make(v[l], dt, n);
      if (m == BufferMode::Shared) first < 0 ? void(first = l) : void(v[l] = v[first]);
    }
  };
  const std::array<bool, 4> dropped = {drop_ln1_, false, drop_ln2_, drop_sw_};
  const std::array<size_t, 4> in_cols = {C, 0, C, F};
  std::vector<Tensor>* inputs[4] = {&ln1_, nullptr, &ln2_, &sw_};
  for (int k : {0, 2, 3}) {
    make_layers(*inputs[k], dt_, N * in_cols[k],
                [&](int l) { return input_mode(dropped[k], fp8_layer(fp8, L_, 4 * l + k), false); });
    make_layers(xt_[k], DType::F8E4M3, N * in_cols[k],
                [&](int l) { return input_mode(dropped[k], fp8_layer(fp8, L_, 4 * l + k), true); });
  }
  make_vec(rstd1_, L_, st_, N);
  make_vec(rstd2_, L_, st_, N);
  make_vec(qkv_, L_, dt_, N * QKV_, drop_attn_);
  make_vec(att_, L_, dt_, N * H_ * hd_, drop_attn_);
  make_vec(lse_, L_, st_, static_cast<size_t>(B_) * H_ * T_, drop_attn_);
  make_vec(mid_, L_, dt_, N * C, drop_mid_);
  make_vec(gu_, L_, dt_, N * 2 * F, drop_gu_);
  make(lnf_, dt_, N * C);
  make(rstdf_, st_, N);
  make(logits_, dt_, static_cast<size_t>(chunk_) * V_);
  make(losses_, st_, N);
  make(dresid_, dt_, N * C);
  make(dln_, dt_, N * C);
  make(datt_, dt_, N * H_ * hd_);
  make(dqkv_, dt_, N * QKV_);
  make(dgu_, dt_, N * 2 * F);
  make(dsw_, dt_, N * F);
  make(tmp_, dt_, N * C);
  if (fp8_opts_.on) {
    const size_t A = size_t(H_) * hd_, QKV = QKV_;
    make(xq_, DType::F8E4M3, N * std::max({C, A, F}));
    make(wq_, DType::F8E4M3, std::max({QKV * C, C * A, 2 * F * C, C * F}));
    make(dq_, DType::F8E5M2, N * std::max({QKV, C, 2 * F}));
    make(dqt_, DType::F8E5M2, N * std::max({QKV, C, 2 * F}));
    make(scales_, DType::F32, size_t(L_) * 4 * 3 * 4);
    make(amax_, DType::F32, size_t(L_) * 4 * 2);
    make(history_, DType::F32, size_t(L_) * 4 * 2 * kFp8History);
    if (fp8.lm_head_forward()) make(head_wq_, DType::F8E4M3, size_t(V_) * C);
    if (fp8.lm_head()) {
      make(head_wqt_, DType::F8E4M3, size_t(V_) * C);
      make(head_dq_, DType::F8E5M2, size_t(chunk_) * V_);
      make(head_dqt_, DType::F8E5M2, size_t(chunk_) * V_);
      make(head_xt_, DType::F8E4M3, size_t(chunk_) * C);
    }
    if (fp8.lm_head_any()) make(head_scales_, DType::F32, 3 * 4);
  }
}

std::string Qwen2Model::fp8_shape_problem(const ModelConfig& c, int64_t B, int64_t T, bool lm_head) {
  const int64_t hd = c.num_heads > 0 ? c.head_dim() : 0;
  const std::pair<const char*, int64_t> dims[] = {
      {"hidden_size", c.hidden_size},
      {"num_heads * head_dim", c.num_heads * hd},
      {"(num_heads + 2 * num_kv_heads) * head_dim", (c.num_heads + 2 * int64_t(c.num_kv_heads)) * hd},
      {"intermediate_size", c.intermediate_size},
      {"micro_batch * seq_len (tokens per micro-batch)", B * T},
      {"vocab_size (with the lm_head in FP8)", lm_head ? c.vocab_size : 0}};
  for (const auto& [name, v] : dims)
    if (v % 16 != 0)
      return std::string(name) + " = " + std::to_string(v) +
             " is not a multiple of 16, which FP8 tensor cores need for every GEMM dimension";
  return "";
}

Tensor Qwen2Model::fp8_inv(int region, int slot) const {
  return scales_.slice((size_t(region) * L_ * 4 + size_t(slot)) * 4, 1);
}

void Qwen2Model::begin_step() {
  if (!fp8_opts_.delayed_on()) return;
  if (fp8_begun_) {
    const int n = L_ * 4, len = kFp8History, pos = fp8_rolls_ % len;
    be_.fp8_roll_scales(scales_.slice(0, size_t(n) * 4), 4, amax_.slice(0, n), history_.slice(0, size_t(n) * len), n,
                        len, pos, Fp8Format::E4M3);
    be_.fp8_roll_scales(scales_.slice(size_t(2) * n * 4, size_t(n) * 4), 4, amax_.slice(n, n),
                        history_.slice(size_t(n) * len, size_t(n) * len), n, len, pos, Fp8Format::E5M2);
    ++fp8_rolls_;
  }
  fp8_begun_ = true;
}

std::optional<Fp8ScalingState> Qwen2Model::fp8_scaling_state() const {
  if (!fp8_opts_.on) return std::nullopt;
  Fp8ScalingState s;
  s.layers = L_;
  s.kinds = fp8_opts_.kinds;
  s.bf16_end_blocks = fp8_opts_.bf16_end_blocks;
  s.dlogits_casts = dlogits_casts_;
  if (!fp8_opts_.delayed_on()) return s;
  s.history_len = kFp8History;
  s.rolls = fp8_rolls_;
  s.begun = fp8_begun_;
  s.amax.resize(amax_.numel);
  s.history.resize(history_.numel);
  be_.download(s.amax.data(), amax_);
  be_.download(s.history.data(), history_);
  return s;
}

std::string Qwen2Model::restore_fp8_scaling(const Fp8ScalingState& s) {
  if (!fp8_opts_.on) return "this run's matmuls are not FP8";
  const int len = fp8_opts_.delayed_on() ? kFp8History : 0;
  if (s.layers != L_) return "it is of " + std::to_string(s.layers) + " blocks, this model has " + std::to_string(L_);
  if (s.kinds != fp8_opts_.kinds || s.bf16_end_blocks != fp8_opts_.bf16_end_blocks)
    return "it was saved with other train.fp8_layers or train.fp8_bf16_end_blocks";
  if (s.history_len != len)
    return len ? "it was saved with current scaling (no amax history)"
               : "it was saved with delayed scaling, this run scales from the current amax";
  if (len && (s.amax.size() != amax_.numel || s.history.size() != history_.numel || s.rolls < 0))
    return "its amax or history has the wrong length";
  dlogits_casts_ = s.dlogits_casts;
  if (!len) return "";
  be_.upload(amax_, s.amax.data());
  be_.upload(history_, s.history.data());
  fp8_rolls_ = s.rolls;
  fp8_begun_ = s.begun;
  return "";
}

std::vector<std::vector<Fp8Span>> Qwen2Model::fp8_gather_spans(const ParamLayout& layout, const Fp8Options& o) {
  std::vector<std::vector<Fp8Span>> spans(layout.num_units());
  const ModelConfig& c = layout.config();
  const size_t C = c.hidden_size, F = c.intermediate_size;
  const BlockOffsets& b = layout.block();
  for (int l = 0; l < c.num_layers; ++l) {
    if (!fp8_layer(o, c.num_layers, 4 * l + 3)) continue;  // down is the block's last tensor
    auto& u = spans[layout.layer_unit(l)];
    if (fp8_layer(o, c.num_layers, 4 * l + 2)) u.push_back({b.gate_up_w, 2 * F * C});
    u.push_back({b.down_w, C * F});
  }
  return spans;
}

Tensor Qwen2Model::given_wq(int slot, Tensor* inv) const {
  const int kind = slot % 4;
  if (fp8w_.codes.empty() || kind < 2) return {};
  const BlockOffsets& o = layout_.block();
  const size_t at = kind == 2 ? o.gate_up_w : o.down_w;
  const auto& spans = fp8_spans_.at(layout_.layer_unit(slot / 4));
  for (size_t k = 0; k < spans.size(); ++k)
    if (spans[k].offset == at) {
      *inv = fp8w_.inv_scales.slice(4 * k, 1);
      return fp8w_.codes.slice(at - fp8w_.from, spans[k].numel);
    }
  return {};
}

bool Qwen2Model::fp8_layer(const Fp8Options& o, int L, int slot) {
  const int l = slot / 4, ends = std::max(o.bf16_end_blocks, 0);
  return o.on && (o.kinds >> (slot % 4) & 1u) && l >= ends && l < L - ends;
}

void Qwen2Model::linear_forward(int slot, Tensor out, Tensor x, Tensor w, Tensor b, int IC, int OC) {
  if (!fp8_at(slot)) return be_.matmul_forward(out, x, w, b, N_, IC, OC);
  Tensor x_inv = fp8_inv(0, slot), w_inv = fp8_inv(1, slot);
  // Delayed: the step's scale, this cast's amax recorded for the next steps. The kept
  // transpose is written in the same pass (a shared one is recompute_layer's to fill).
  // x empty: xq_ already holds it (swiglu_forward_fp8).
  if (!x.empty())
    be_.fp8_quantize(xq_, input_dropped(slot) ? Tensor{} : kept_xt(slot), x_inv, x, N_, IC, fp8_given(),
                     fp8_opts_.delayed_on() && recording_ ? fp8_amax(0, slot) : Tensor{});
  Tensor wq = given_wq(slot, &w_inv);  // gathered already cast, or cast here
  if (wq.empty()) be_.fp8_quantize(wq = wq_, Tensor{}, w_inv, w, OC, IC);
  be_.matmul_fp8(out, xq_, x_inv, wq, w_inv, b, N_, IC, OC, false, fp8_opts_.fast_accum);
}

// dx (N, IC) = dout (N, OC) · W: a = dout (e5m2), b = Wᵀ (IC, OC);
// dW (OC, IC) += doutᵀ · x: a = doutᵀ (OC, N), b = xᵀ (IC, N); db from dout as is.
// x and W are the forward's values (kept, recomputed or regathered: the same bits),
// so their transposes reuse the forward's scales.
// With dout empty, dq_ and dqt_ already hold it (swiglu_backward_fp8).
void Qwen2Model::linear_backward(int slot, Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x, Tensor w, int IC,
                                 int OC) {
  if (!fp8_at(slot)) return be_.matmul_backward(dx, dw, db, dout, x, w, N_, IC, OC);
  Tensor x_inv = fp8_inv(0, slot), w_inv = fp8_inv(1, slot), d_inv = fp8_inv(2, slot);
  if (!dout.empty())
    be_.fp8_quantize(dq_, dw.empty() ? Tensor{} : dqt_, d_inv, dout, N_, OC, fp8_given(),
                     fp8_opts_.delayed_on() ? fp8_amax(1, slot) : Tensor{});
  if (!dx.empty()) {
    if (const Tensor given = given_wq(slot, &w_inv); !given.empty())
      be_.fp8_transpose(wq_, given, OC, IC);
    else
      be_.fp8_quantize(Tensor{}, wq_, w_inv, w, OC, IC, true);
    be_.matmul_fp8(dx, dq_, d_inv, wq_, w_inv, Tensor{}, N_, OC, IC, false);
  }
  if (!dw.empty()) {
    Tensor xt = kept_xt(slot);  // x itself is then a shared buffer, not this layer's
    if (xt.empty()) be_.fp8_quantize(Tensor{}, xt = xq_, x_inv, x, N_, IC, true);
    be_.matmul_fp8(dw, dqt_, d_inv, xt, x_inv, Tensor{}, OC, N_, IC, true);
  }
  if (!db.empty()) be_.matmul_backward(Tensor{}, Tensor{}, db, dout, x, w, N_, IC, OC);
}

void Qwen2Model::recast_kept_xt(int slot, Tensor x, int IC) {
  const Tensor xt = kept_xt(slot);
  if (!xt.empty()) be_.fp8_quantize(Tensor{}, xt, fp8_inv(0, slot), x, N_, IC, true);
}

Qwen2Model::~Qwen2Model() {
  for (Tensor* t : owned_) be_.free(*t);
}

size_t Qwen2Model::activation_bytes() const {
  size_t n = 0;
  for (const Tensor* t : owned_) n += t->bytes();
  return n;
}

uint64_t Qwen2Model::activation_bytes_for(const ModelConfig& c, DType dtype, int64_t B, int64_t T, int head_chunk,
                                          Recompute r, const Fp8Options& fp8_opts) {
  const bool fp8 = fp8_opts.on;
  // The constructor's buffers, one term each; unsigned 128-bit sums cannot overflow
  // for 32-bit dimensions, and the total saturates to 64 bits.
  using U = unsigned __int128;
  const U dt = dtype_size(dtype), st = dtype == DType::F64 ? 8 : 4, i32 = 4;
  const U N = static_cast<U>(B) * static_cast<U>(T), C = c.hidden_size, F = c.intermediate_size, V = c.vocab_size,
          H = c.num_heads, hd = c.num_heads > 0 ? c.head_dim() : 0, QKV = (H + 2 * static_cast<U>(c.num_kv_heads)) * hd,
          L = c.num_layers;
  const U chunk = head_chunk > 0 ? std::min<U>(head_chunk, N) : N;
  const Dropped d = dropped_by(r);
  auto per_layer = [&](bool shared) -> U { return shared ? (L > 0 ? 1 : 0) : L; };
  // The constructor's make_layers: own buffers, plus one when any layer shares it.
  auto buffers = [&](int kind, bool dropped, bool transposed) -> U {
    U own = 0;
    bool shared = false;
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const BufferMode m = input_mode(dropped, fp8_layer(fp8_opts, c.num_layers, int(4 * l + kind)), transposed);
      own += m == BufferMode::Own, shared |= m == BufferMode::Shared;
    }
    return own + (shared ? 1 : 0);
  };
  U bytes = 2 * N * i32                                   // tokens, targets
            + (L + 1) * N * C * dt                        // resid
            + buffers(0, d.ln1, false) * N * C * dt + buffers(2, d.ln2, false) * N * C * dt
            + buffers(0, d.ln1, true) * N * C + buffers(2, d.ln2, true) * N * C + buffers(3, d.sw, true) * N * F
            + 2 * L * N * st                              // rstd1, rstd2
            + per_layer(d.attn) * (N * QKV * dt + N * H * hd * dt + static_cast<U>(B) * H * T * st)
            + per_layer(d.mid) * N * C * dt + per_layer(d.gu) * N * 2 * F * dt + buffers(3, d.sw, false) * N * F * dt
            + N * C * dt + N * st + chunk * V * dt + N * st   // lnf, rstdf, logits, losses
            + 3 * N * C * dt + N * H * hd * dt + N * QKV * dt + N * 2 * F * dt + N * F * dt;  // backward scratch
  if (fp8) {  // xq_, wq_, dq_, dqt_ (one byte an element), scales_, amax_, history_
    const U A = H * hd;
    bytes += N * std::max({C, A, F}) + std::max({QKV * C, C * A, 2 * F * C, C * F}) +
             2 * N * std::max({QKV, C, 2 * F}) + L * 4 * 3 * 4 * 4 + L * 4 * 2 * 4 + L * 4 * 2 * kFp8History * 4;
    if (fp8_opts.lm_head_forward()) bytes += V * C;  // head_wq_
    if (fp8_opts.lm_head()) bytes += V * C + 2 * chunk * V + chunk * C;  // head_wqt_, head_dq_, head_dqt_, head_xt_
    if (fp8_opts.lm_head_any()) bytes += 3 * 4 * 4;  // head_scales_
  }
  return bytes > std::numeric_limits<uint64_t>::max() ? std::numeric_limits<uint64_t>::max()
                                                       : static_cast<uint64_t>(bytes);
}

void Qwen2Model::forward_blocks(ParamProvider& params) {
  const BlockOffsets& o = layout_.block();
  const size_t C = C_, F = F_, QKV = QKV_, A = static_cast<size_t>(H_) * hd_;
  for (int l = 0; l < L_; ++l) {
    ST_NVTX_RANGE("forward layer", l);
    const int u = layout_.layer_unit(l);
    Tensor w = params.acquire(u, Pass::Forward);
    fp8w_ = params.fp8_weights(u);
    params.prefetch(l + 1 < L_ ? layout_.layer_unit(l + 1) : layout_.final_unit(), Pass::Forward);
    // The residual add that ends the previous layer is fused into this norm (tmp_
    // still holds that layer's down projection).
    NvtxRange op("norm");
    if (l == 0)
      be_.rmsnorm_forward(ln1_[l], rstd1_[l], resid_[l], w.slice(o.ln1, C), N_, C_, eps_);
    else
      be_.add_rmsnorm_forward(resid_[l], ln1_[l], rstd1_[l], mid_[l - 1], tmp_, w.slice(o.ln1, C), N_, C_, eps_);
    op.next("attention");
    linear_forward(4 * l + 0, qkv_[l], ln1_[l], w.slice(o.qkv_w, QKV * C), w.slice(o.qkv_b, QKV), C_, QKV_);
    be_.rope_forward(qkv_[l], B_, T_, H_, KV_, hd_, theta_);
    be_.attention_forward(att_[l], lse_[l], qkv_[l], B_, T_, H_, KV_, hd_);
    linear_forward(4 * l + 1, tmp_, att_[l], w.slice(o.o_w, C * A), Tensor{}, H_ * hd_, C_);
    op.next("norm");
    be_.add_rmsnorm_forward(mid_[l], ln2_[l], rstd2_[l], resid_[l], tmp_, w.slice(o.ln2, C), N_, C_, eps_);
    op.next("mlp");
    linear_forward(4 * l + 2, gu_[l], ln2_[l], w.slice(o.gate_up_w, 2 * F * C), Tensor{}, C_, 2 * F_);
    swiglu_into_down(l);
    linear_forward(4 * l + 3, tmp_, fused_swiglu_cast(4 * l + 3) ? Tensor{} : sw_[l], w.slice(o.down_w, C * F),
                   Tensor{}, F_, C_);
    op.end();
    // resid_[l + 1] = mid_[l] + tmp_ is done by the next norm (the next layer's, or
    // the final one in head()).
    params.release(u, Pass::Forward);
    fp8w_ = {};
  }
}

void Qwen2Model::head(ParamProvider& params, bool grad, float dloss_scale, int ignore_index, float* logits_out) {
  const size_t C = C_, V = V_;
  const int fu = layout_.final_unit(), hu = layout_.lm_head_unit();
  Tensor wf = params.acquire(fu, Pass::Forward);
  // For a tied head this unit (the embedding) is still held from the forward start.
  Tensor wh = hu == fu ? wf : params.acquire(hu, Pass::Forward);
  if (grad) params.prefetch(layout_.layer_unit(L_ - 1), Pass::Backward);
  Tensor w_lm = wh.slice(layout_.lm_head_offset(), V * C);  // (V, C)
  NvtxRange op("norm");
  if (L_ == 0)
    be_.rmsnorm_forward(lnf_, rstdf_, resid_[L_], wf.slice(layout_.final_norm_offset(), C), N_, C_, eps_);
  else  // the last layer's residual add, fused
    be_.add_rmsnorm_forward(resid_[L_], lnf_, rstdf_, mid_[L_ - 1], tmp_, wf.slice(layout_.final_norm_offset(), C),
                            N_, C_, eps_);
  op.next("loss");  // lm_head, cross-entropy and (training) their backward

  Tensor dw_lm = grad ? params.grad(hu).slice(layout_.lm_head_offset(), V * C) : Tensor{};
  Tensor logits_f32;
  if (logits_out && dt_ != DType::F32) logits_f32 = be_.alloc(DType::F32, static_cast<size_t>(chunk_) * V);
  // An FP8 lm_head: the weight cast once (current scaling), in the layouts its GEMMs
  // read; with its forward in FP8, the final norm's output too (the chunks' transposes
  // for the weight gradient reuse that scale; without, each chunk's has its own). With
  // the forward alone in FP8 (lm_head_fwd) the gradients below are the bf16 ones.
  const bool fp8 = fp8_opts_.lm_head() && grad, fp8_fwd = fp8_opts_.lm_head_forward();
  Tensor x_inv, w_inv, d_inv;
  if (fp8_opts_.lm_head_any()) {
    x_inv = head_scales_.slice(0, 1), w_inv = head_scales_.slice(4, 1), d_inv = head_scales_.slice(8, 1);
    if (fp8_fwd) be_.fp8_quantize(xq_, Tensor{}, x_inv, lnf_, N_, C_);
    if (fp8_fwd || fp8)
      be_.fp8_quantize(fp8_fwd ? head_wq_ : Tensor{}, fp8 ? head_wqt_ : Tensor{}, w_inv, w_lm, V_, C_);
  }
  for (int r0 = 0; r0 < N_; r0 += chunk_) {
    const int rows = std::min(chunk_, N_ - r0);
    Tensor logits = logits_.slice(0, rows * V);                   // (rows, V)
    Tensor x = lnf_.slice(static_cast<size_t>(r0) * C, rows * C);  // (rows, C)
    if (fp8_fwd)
      be_.matmul_fp8(logits, xq_.slice(static_cast<size_t>(r0) * C, rows * C), x_inv, head_wq_, w_inv, Tensor{}, rows,
                     C_, V_, false, fp8_opts_.fast_accum);
    else
      be_.matmul_forward(logits, x, w_lm, Tensor{}, rows, C_, V_);
    if (logits_out) {
      float* dst = logits_out + static_cast<size_t>(r0) * V;
      if (dt_ == DType::F32) {
        be_.download(dst, logits);
      } else {
        Tensor f = logits_f32.slice(0, rows * V);
        be_.copy(f, logits);
        be_.download(dst, f);
      }
    }
    Tensor dx = grad ? dln_.slice(static_cast<size_t>(r0) * C, rows * C) : Tensor{};
    if (fp8) {  // dlogits as e5m2, both layouts: dx = dlogits · W and dW += dlogitsᵀ · x in FP8
      Tensor dq = head_dq_.slice(0, size_t(rows) * V), dqt = head_dqt_.slice(0, size_t(rows) * V),
             xt = head_xt_.slice(0, size_t(rows) * C);
      const uint64_t key = fp8_opts_.dlogits_stochastic ? counter_bits(kDlogitsStream, dlogits_casts_++) | 1u : 0;
      be_.cross_entropy_fp8(losses_.slice(r0, rows), logits, dq, dqt, d_inv, targets_.slice(r0, rows), rows, V_,
                            ignore_index, dloss_scale, key);
      be_.matmul_fp8(dx, dq, d_inv, head_wqt_, w_inv, Tensor{}, rows, V_, C_, false);
      be_.fp8_quantize(Tensor{}, xt, x_inv, x, rows, C_, fp8_fwd);
      be_.matmul_fp8(dw_lm, dqt, d_inv, xt, x_inv, Tensor{}, V_, rows, C_, true);
      continue;
    }
    be_.cross_entropy(losses_.slice(r0, rows), logits, targets_.slice(r0, rows), rows, V_, ignore_index,
                      dloss_scale, grad);
    if (grad)  // logits now hold dlogits
      be_.matmul_backward(dx, dw_lm, Tensor{}, logits, x, w_lm, rows, C_, V_);
  }
  if (!logits_f32.empty()) be_.free(logits_f32);

  op.next("norm");
  if (grad) {
    be_.zero(dresid_);
    be_.rmsnorm_backward(dresid_, params.grad(fu).slice(layout_.final_norm_offset(), C), dln_, resid_[L_],
                         wf.slice(layout_.final_norm_offset(), C), rstdf_, N_, C_);
  }
  op.end();
  if (hu != fu) params.release(hu, Pass::Forward);
  params.release(fu, Pass::Forward);
  if (grad) params.grad_ready(fu);
}

// In double on the host (targets: the caller's host copy).
LossSum Qwen2Model::sum_losses(const int32_t* host_targets, int ignore_index) {
  LossSum out;
  const int32_t* tg = host_targets;
  if (st_ == DType::F64) {
    std::vector<double> ls(N_);
    be_.download(ls.data(), losses_);
    for (int i = 0; i < N_; ++i)
      if (tg[i] != ignore_index) out.sum += ls[i], ++out.count;
  } else {
    std::vector<float> ls(N_);
    be_.download(ls.data(), losses_);
    for (int i = 0; i < N_; ++i)
      if (tg[i] != ignore_index) out.sum += ls[i], ++out.count;
  }
  return out;
}

void Qwen2Model::backward_blocks(ParamProvider& params) {
  const BlockOffsets& o = layout_.block();
  const size_t C = C_, F = F_, QKV = QKV_, A = static_cast<size_t>(H_) * hd_;
  for (int l = L_ - 1; l >= 0; --l) {
    ST_NVTX_RANGE("backward layer", l);
    const int u = layout_.layer_unit(l);
    Tensor w = params.acquire(u, Pass::Backward);
    fp8w_ = params.fp8_weights(u);
    if (l > 0)
      params.prefetch(layout_.layer_unit(l - 1), Pass::Backward);
    else if (layout_.lm_head_unit() != layout_.embed_unit())
      params.prefetch(layout_.embed_unit(), Pass::Backward);  // a tied embedding is still held
    Tensor g = params.grad(u);
    NvtxRange op("recompute");
    recompute_layer(l, w);
    op.next("mlp");
    // resid[l+1] = mid + down(swiglu(gate_up(norm2(mid)))): dresid flows to mid unchanged.
    linear_backward(4 * l + 3, dsw_, g.slice(o.down_w, C * F), Tensor{}, dresid_, sw_[l], w.slice(o.down_w, C * F),
                    F_, C_);
    // Delayed FP8 scaling knows dgu's scale before dgu exists: the SwiGLU backward casts
    // it for the gate|up layer in the same pass, and the bf16 dgu is never written.
    const bool fused_cast = fp8_given() && fp8_at(4 * l + 2);
    if (fused_cast)
      be_.swiglu_backward_fp8(dq_, dqt_, fp8_inv(2, 4 * l + 2), fp8_amax(1, 4 * l + 2), dsw_, gu_[l], N_, F_);
    else
      be_.swiglu_backward(dgu_, dsw_, gu_[l], N_, F_);
    linear_backward(4 * l + 2, dln_, g.slice(o.gate_up_w, 2 * F * C), Tensor{}, fused_cast ? Tensor{} : dgu_, ln2_[l],
                    w.slice(o.gate_up_w, 2 * F * C), C_, 2 * F_);
    op.next("norm");
    be_.rmsnorm_backward(dresid_, g.slice(o.ln2, C), dln_, mid_[l], w.slice(o.ln2, C), rstd2_[l], N_, C_);
    op.next("attention");
    // mid = resid + o_proj(attention(rope(qkv(norm1(resid))))).
    linear_backward(4 * l + 1, datt_, g.slice(o.o_w, C * A), Tensor{}, dresid_, att_[l], w.slice(o.o_w, C * A),
                    H_ * hd_, C_);
    be_.attention_backward(dqkv_, datt_, att_[l], lse_[l], qkv_[l], B_, T_, H_, KV_, hd_);
    be_.rope_backward(dqkv_, B_, T_, H_, KV_, hd_, theta_);
    linear_backward(4 * l + 0, dln_, g.slice(o.qkv_w, QKV * C), g.slice(o.qkv_b, QKV), dqkv_, ln1_[l],
                    w.slice(o.qkv_w, QKV * C), C_, QKV_);
    op.next("norm");
    be_.rmsnorm_backward(dresid_, g.slice(o.ln1, C), dln_, resid_[l], w.slice(o.ln1, C), rstd1_[l], N_, C_);
    op.end();
    params.release(u, Pass::Backward);
    fp8w_ = {};
    params.grad_ready(u);
  }
}

void Qwen2Model::recompute_layer(int l, Tensor w) {
  if (recompute_ == Recompute::None) return;
  const BlockOffsets& o = layout_.block();
  const size_t C = C_, F = F_, QKV = QKV_, A = static_cast<size_t>(H_) * hd_;
  // The forward's own ops on the kept inputs: the same bits (the fused add + norm of
  // the forward equals add then norm bit for bit).
  if (drop_ln1_) {
    be_.rmsnorm_forward(ln1_[l], rstd1_[l], resid_[l], w.slice(o.ln1, C), N_, C_, eps_);
    recast_kept_xt(4 * l + 0, ln1_[l], C_);
  }
  if (drop_attn_) {
    linear_forward(4 * l + 0, qkv_[l], ln1_[l], w.slice(o.qkv_w, QKV * C), w.slice(o.qkv_b, QKV), C_, QKV_);
    be_.rope_forward(qkv_[l], B_, T_, H_, KV_, hd_, theta_);
    be_.attention_forward(att_[l], lse_[l], qkv_[l], B_, T_, H_, KV_, hd_);
  }
  if (drop_mid_) {
    linear_forward(4 * l + 1, tmp_, att_[l], w.slice(o.o_w, C * A), Tensor{}, H_ * hd_, C_);
    be_.add(mid_[l], resid_[l], tmp_, N_ * C);
  }
  if (drop_ln2_) {
    be_.rmsnorm_forward(ln2_[l], rstd2_[l], mid_[l], w.slice(o.ln2, C), N_, C_, eps_);
    recast_kept_xt(4 * l + 2, ln2_[l], C_);
  }
  if (drop_gu_)
    linear_forward(4 * l + 2, gu_[l], ln2_[l], w.slice(o.gate_up_w, 2 * F * C), Tensor{}, C_, 2 * F_);
  if (drop_sw_) {
    if (fused_swiglu_cast(4 * l + 3)) {  // the transpose alone, at the forward's scale
      be_.swiglu_forward_fp8(Tensor{}, kept_xt(4 * l + 3), fp8_inv(0, 4 * l + 3), Tensor{}, gu_[l], N_, F_);
      return;
    }
    be_.swiglu_forward(sw_[l], gu_[l], N_, F_);
    recast_kept_xt(4 * l + 3, sw_[l], F_);
  }
}

void Qwen2Model::swiglu_into_down(int l) {
  const int down = 4 * l + 3;
  if (!fused_swiglu_cast(down)) return be_.swiglu_forward(sw_[l], gu_[l], N_, F_);
  // Delayed FP8 knows the down layer's input scale before sw exists: the SwiGLU writes
  // its e4m3 cast (and the kept transpose) itself, and the bf16 sw is never written.
  be_.swiglu_forward_fp8(xq_, drop_sw_ ? Tensor{} : kept_xt(down), fp8_inv(0, down),
                         recording_ ? fp8_amax(0, down) : Tensor{}, gu_[l], N_, F_);
}

LossSum Qwen2Model::forward_backward(ParamProvider& params, const int32_t* tokens, const int32_t* targets,
                                     float dloss_scale, int ignore_index) {
  const int eu = layout_.embed_unit();
  const bool tied = layout_.lm_head_unit() == eu;
  const size_t C = C_, V = V_;
  // Checked here once per micro-batch, so the ops that read them need not wait for
  // the device to check them.
  be_.upload_ids(tokens_, tokens, V_, false, 0, "token id");
  be_.upload_ids(targets_, targets, V_, true, ignore_index, "target");
  recording_ = true;  // the casts' amax feed delayed scaling (forward() alone leaves it)

  NvtxRange pass("forward");
  Tensor we = params.acquire(eu, Pass::Forward);  // held to the end when tied
  params.prefetch(layout_.layer_unit(0), Pass::Forward);
  NvtxRange op("embedding");
  be_.embedding_forward(resid_[0], tokens_, we.slice(layout_.embed_offset(), V * C), N_, C_, V_);
  op.end();
  if (!tied) params.release(eu, Pass::Forward);

  forward_blocks(params);
  pass.next("head");  // final norm, lm_head and loss, forward and backward
  head(params, true, dloss_scale, ignore_index, nullptr);
  pass.next("backward");
  backward_blocks(params);

  if (!tied) params.acquire(eu, Pass::Backward);
  op.next("embedding");
  be_.embedding_backward(params.grad(eu).slice(layout_.embed_offset(), V * C), dresid_, tokens_, N_, C_, V_);
  op.end();
  params.release(eu, tied ? Pass::Forward : Pass::Backward);
  params.grad_ready(eu);
  pass.end();
  // Read the losses back last: the host does not wait for the GPU before it has
  // enqueued the whole backward.
  return sum_losses(targets, ignore_index);
}

LossSum Qwen2Model::forward(ParamProvider& params, const int32_t* tokens, const int32_t* targets, int ignore_index,
                            float* logits_out) {
  const int eu = layout_.embed_unit();
  const bool tied = layout_.lm_head_unit() == eu;
  const size_t C = C_, V = V_;
  // Checked here once per micro-batch, so the ops that read them need not wait for
  // the device to check them.
  be_.upload_ids(tokens_, tokens, V_, false, 0, "token id");
  be_.upload_ids(targets_, targets, V_, true, ignore_index, "target");
  recording_ = false;  // an evaluation's inputs do not move the training's scales
  Tensor we = params.acquire(eu, Pass::Forward);
  params.prefetch(layout_.layer_unit(0), Pass::Forward);
  be_.embedding_forward(resid_[0], tokens_, we.slice(layout_.embed_offset(), V * C), N_, C_, V_);
  if (!tied) params.release(eu, Pass::Forward);
  forward_blocks(params);
  head(params, false, 0.0f, ignore_index, logits_out);
  if (tied) params.release(eu, Pass::Forward);
  return sum_losses(targets, ignore_index);
}

}  // namespace st

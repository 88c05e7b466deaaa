#include "fsdp/fsdp.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/collective.h"
#include "core/log.h"
#include "core/nvtx.h"
#include "core/rng.h"
#include "model/init.h"

namespace st {

Fsdp::Fsdp(const ShardPlan& plan, Backend& backend, Comm& comm, Comm* replicate, FsdpOptions options)
    : plan_(plan), layout_(plan.layout()), be_(backend), comm_(comm), replicate_(replicate), opt_(options) {
  ST_CHECK(plan.world() == comm.world(), "shard plan made for ", plan.world(), " ranks but the shard group has ",
           comm.world());
  ST_CHECK(options.reduce_dtype == DType::F32 || options.reduce_dtype == DType::BF16,
           "gradients are reduced in f32 or bf16, not ", dtype_name(options.reduce_dtype));
  ST_CHECK(options.master_dtype == DType::F32 || options.master_dtype == DType::BF16,
           "master weights are f32 or bf16, not ", dtype_name(options.master_dtype));
  ST_CHECK(options.state_dtype == DType::F32 || options.state_dtype == DType::BF16,
           "AdamW state is f32 or bf16, not ", dtype_name(options.state_dtype));
  ST_CHECK(options.offload_state || !options.offload_master, "offloading the master weights needs the optimizer "
           "state offloaded too (train.offload=optimizer+master)");
  // A compute copy where gathers cannot read the master itself.
  const bool low = opt_.offload_master || opt_.master_dtype != opt_.compute_dtype;
  size_t largest = 0;
  for (int u = 0; u < plan.num_units(); ++u) {
    UnitState s;
    const size_t n = plan.shard_numel(u);
    largest = std::max(largest, n);
    s.master = opt_.offload_master ? host_alloc(opt_.master_dtype, n) : be_.alloc(opt_.master_dtype, n);
    s.grad = be_.alloc(DType::F32, n);
    s.m = opt_.offload_state ? host_alloc(opt_.state_dtype, n) : be_.alloc(opt_.state_dtype, n);
    s.v = opt_.offload_state ? host_alloc(opt_.state_dtype, n) : be_.alloc(opt_.state_dtype, n);
    if (low) s.low = be_.alloc(opt_.compute_dtype, n);
    s.spans = plan.decay_spans(u, comm.rank());
    units_.push_back(s);
  }
  // Two staging slots: one unit's state comes in while the previous one's is updated.
  if (opt_.offload_state) {
    stage_m_ = be_.alloc(opt_.state_dtype, 2 * largest);
    stage_v_ = be_.alloc(opt_.state_dtype, 2 * largest);
  }
  if (opt_.offload_master) stage_master_ = be_.alloc(opt_.master_dtype, 2 * largest);
  stage_slot_ = largest;

  if (opt_.fp8_gather.empty()) return;
  ST_CHECK(static_cast<int>(opt_.fp8_gather.size()) == plan.num_units(), "dist.fp8_gather: FP8 weights given for ",
           opt_.fp8_gather.size(), " units, the model has ", plan.num_units());
  fp8_slot_.assign(plan.num_units(), 0);
  for (int u = 0; u < plan.num_units(); ++u) {
    const auto& spans = opt_.fp8_gather[u];
    fp8_slot_[u] = fp8_slots_;
    fp8_slots_ += spans.size();
    if (spans.empty()) continue;
    // A tail: back to back up to the unit's end, and its codes fit in the gathered
    // buffer behind the compute-dtype part.
    size_t at = spans.front().offset;
    for (const Fp8Span& sp : spans) {
      ST_CHECK(sp.offset == at && sp.numel > 0, "dist.fp8_gather: unit '", layout_.unit(u).name,
               "': its FP8 weights are not back to back");
      at += sp.numel;
    }
    const size_t es = dtype_size(opt_.compute_dtype), n = plan.numel(u);
    ST_CHECK(at == n, "dist.fp8_gather: unit '", layout_.unit(u).name, "': its FP8 weights do not end it");
    ST_CHECK(fp8_gather_byte(n, spans.front().offset, es) <= plan.padded_numel(u) * es,
             "dist.fp8_gather: unit '", layout_.unit(u).name, "': no room for its FP8 codes");
  }
  if (fp8_slots_ == 0 || in_place()) return;
  for (int u = 0; u < plan.num_units(); ++u) {
    if (opt_.fp8_gather[u].empty()) continue;
    // The shard plan's slices are the helper's: the unit padded to a multiple of the world.
    units_[u].part_bytes =
        fp8_gather_part_bytes(plan.numel(u), fp8_from(u), comm.world(), dtype_size(opt_.compute_dtype));
  }
  fp8_amax_ = be_.alloc(DType::F32, fp8_slots_);
  fp8_inv_ = be_.alloc(DType::F32, 4 * fp8_slots_);
  fp8_hist_ = be_.alloc(DType::F32, fp8_slots_);
  fp8_one_ = be_.alloc(DType::F32, 1);
  const float one = 1.0f;
  be_.upload(fp8_one_, &one);
  fp8_scratch_ = be_.alloc(DType::F8E4M3, largest);
}

Tensor Fsdp::fp8_codes(const UnitState& s, int u) const {
  const size_t from = fp8_from(u);
  return Tensor{static_cast<char*>(s.full.data) + fp8_gather_codes_at(from, dtype_size(opt_.compute_dtype)),
                DType::F8E4M3, plan_.numel(u) - from};
}

// Each rank's amax of its part of every FP8 tail weight (one pass that also casts, into
// scratch, at scale 1), the maximum over the shard group, and the scale it gives: what
// fp8_quantize's current scaling computes from the whole tensor (max is exact, so the
// same bits at any world size).
void Fsdp::agree_fp8_scales() {
  if (!fp8_stale_) return;
  ST_NVTX_RANGE("fp8 weight scales");
  be_.zero(fp8_amax_);
  const int r = comm_.rank();
  for (int u = 0; u < layout_.num_units(); ++u) {
    const auto& spans = opt_.fp8_gather[u];
    const ElemRange mine = plan_.valid_range_of(u, r);
    const size_t base = plan_.range_of(u, r).begin;
    const Tensor src = compute_shard(units_[u]);
    for (size_t k = 0; k < spans.size(); ++k) {
      const size_t a = std::max(spans[k].offset, mine.begin), b = std::min(spans[k].offset + spans[k].numel, mine.end);
      if (a >= b) continue;
      be_.fp8_quantize(fp8_scratch_.slice(0, b - a), Tensor{}, fp8_one_, src.slice(a - base, b - a), 1,
                       static_cast<int>(b - a), true, fp8_amax_.slice(fp8_slot_[u] + k, 1));
    }
  }
  comm_.all_reduce_max(fp8_amax_, fp8_slots_);
  be_.fp8_roll_scales(fp8_inv_, 4, fp8_amax_, fp8_hist_, static_cast<int>(fp8_slots_), 1, 0, Fp8Format::E4M3);
  fp8_stale_ = false;
}

Fp8Weights Fsdp::fp8_weights(int u) {
  if (!fp8_gathered(u)) return {};
  const UnitState& s = units_.at(u);
  ST_CHECK(s.refs > 0 && !s.full.empty(), "unit '", layout_.unit(u).name, "': fp8_weights of a unit not acquired");
  return {fp8_codes(s, u), fp8_from(u), fp8_inv_.slice(4 * fp8_slot_[u], 4 * opt_.fp8_gather[u].size())};
}

Tensor Fsdp::host_alloc(DType dtype, size_t n) {
  Tensor t{nullptr, dtype, n};
  if (n == 0) return t;
  t.data = be_.alloc_host(t.bytes());
  if (!t.data)
    fail("train.offload: cannot allocate ", human_bytes(double(t.bytes())), " of page-locked host memory for the "
         "offloaded optimizer state (the host is out of memory, or its locked-memory limit, ulimit -l, is too low)");
  std::memset(t.data, 0, t.bytes());
  return t;
}

void Fsdp::host_free(Tensor& t) {
  if (t.empty()) return;
  be_.free_host(t.data);
  t.data = nullptr;
}

bool Fsdp::on_host(ShardState which) const {
  if (which == ShardState::Master) return opt_.offload_master;
  return which != ShardState::Grad && opt_.offload_state;
}

Fsdp::~Fsdp() {
  // Collectives still in flight write into these buffers: let them finish first. A
  // comm that failed has aborted them already (and says so by throwing).
  try {
    sync_grads();
    for (auto& s : units_) drop_full(s);
  } catch (...) {
  }
  for (Reduction& r : reductions_)
    for (Tensor* t : {&r.full_grad, &r.part})
      if (!t->empty()) be_.free(*t);
  try {
    be_.synchronize();  // offloaded state may still be in flight to the host
  } catch (...) {
  }
  for (auto& s : units_) {
    if (opt_.offload_master) host_free(s.master);
    if (opt_.offload_state) host_free(s.m), host_free(s.v);
    for (Tensor* t : {&s.master, &s.grad, &s.m, &s.v, &s.low, &s.full, &s.full_grad})
      if (!t->empty()) be_.free(*t);
  }
  for (Tensor* t : {&stage_master_, &stage_m_, &stage_v_, &fp8_amax_, &fp8_inv_, &fp8_hist_, &fp8_one_, &fp8_scratch_})
    if (!t->empty()) be_.free(*t);
}

void Fsdp::init_weights(uint64_t seed, double std) {
  for (int u = 0; u < layout_.num_units(); ++u) {
    const ElemRange r = plan_.range_of(u, comm_.rank());
    UnitState& s = units_[u];
    if (s.master.dtype == DType::F32 && !opt_.offload_master) {
      init_unit_tensor(be_, layout_.unit(u), seed, std, r.begin, r.end, s.master);
    } else {  // initialised in f32, then stored (rounded to nearest)
      Tensor f32 = be_.alloc(DType::F32, plan_.shard_numel(u));
      init_unit_tensor(be_, layout_.unit(u), seed, std, r.begin, r.end, f32);
      set_state_f32(u, ShardState::Master, f32);
      be_.free(f32);
    }
    refresh_low(u);
  }
}

void Fsdp::refresh_low(int u) {
  fp8_stale_ = true;  // the weights changed: their FP8 scales are agreed again
  UnitState& s = units_[u];
  if (s.low.empty()) return;
  if (!opt_.offload_master) {
    be_.copy(s.low, s.master);
    return;
  }
  be_.synchronize();  // the stream-ordered staging buffer is free (nothing of a step in flight)
  Tensor stage = stage_master_.slice(0, s.master.numel);
  be_.upload(stage, s.master.data);
  be_.copy(s.low, stage);
}

Tensor Fsdp::state_f32(int u, ShardState which) {
  Tensor& t = state_tensor(u, which);
  Tensor f32 = be_.alloc(DType::F32, t.numel);
  if (!on_host(which)) {
    be_.copy(f32, t);
    return f32;
  }
  be_.synchronize();  // the last step's downloads into host memory have landed
  Tensor stage = be_.alloc(t.dtype, t.numel);
  be_.upload(stage, t.data);
  be_.copy(f32, stage);
  be_.free(stage);
  return f32;
}

void Fsdp::set_state_f32(int u, ShardState which, Tensor f32) {
  Tensor& t = state_tensor(u, which);
  if (!on_host(which)) {
    be_.copy(t, f32);  // rounded to nearest where t is bf16
    return;
  }
  be_.synchronize();
  Tensor stage = be_.alloc(t.dtype, t.numel);
  be_.copy(stage, f32);
  be_.download(t.data, stage);
  be_.free(stage);
}

void Fsdp::load_unit(int u, const std::vector<float>& values) {
  const Unit& unit = layout_.unit(u);
  ST_CHECK(values.size() == unit.numel, "unit '", unit.name, "' expects ", unit.numel, " values, got ",
           values.size());
  const ElemRange r = plan_.range_of(u, comm_.rank()), valid = plan_.valid_range_of(u, comm_.rank());
  std::vector<float> shard(r.size(), 0.0f);
  std::copy(values.begin() + valid.begin, values.begin() + valid.end, shard.begin());
  UnitState& s = units_[u];
  if (s.refs == 0) drop_full(s);  // stale now (before the upload: an in-flight gather reads master)
  Tensor f32 = be_.alloc(DType::F32, shard.size());
  be_.upload(f32, shard.data());
  set_state_f32(u, ShardState::Master, f32);
  be_.free(f32);
  refresh_low(u);
}

std::vector<float> Fsdp::gather_unit(int u) {
  sync_grads();
  Tensor all = be_.alloc(DType::F32, plan_.padded_numel(u));
  Tensor mine = state_f32(u, ShardState::Master);
  comm_.all_gather(all, mine, plan_.shard_numel(u));
  be_.free(mine);
  std::vector<float> v(plan_.padded_numel(u));
  be_.download(v.data(), all);
  be_.free(all);
  v.resize(plan_.numel(u));
  return v;
}

Tensor& Fsdp::state_tensor(int u, ShardState which) {
  if (which == ShardState::Grad) sync_grads();  // a complete gradient
  UnitState& s = units_.at(u);
  switch (which) {
    case ShardState::Master: return s.master;
    case ShardState::Grad: return s.grad;
    case ShardState::AdamM: return s.m;
    default: return s.v;
  }
}

void Fsdp::download_shard_into(int u, ShardState which, float* host) {
  Tensor& t = state_tensor(u, which);
  if (t.dtype == DType::F32 && !on_host(which)) {
    be_.download(host, t);
    return;
  }
  Tensor f32 = state_f32(u, which);  // bf16 widens exactly
  be_.download(host, f32);
  be_.free(f32);
}

std::vector<float> Fsdp::download_shard(int u, ShardState which) {
  std::vector<float> v(plan_.shard_numel(u));
  download_shard_into(u, which, v.data());
  return v;
}

void Fsdp::upload_shard(int u, ShardState which, const std::vector<float>& values) {
  ST_CHECK(values.size() == plan_.shard_numel(u), "unit '", layout_.unit(u).name, "': a shard of ",
           plan_.shard_numel(u), " values expected, got ", values.size());
  UnitState& s = units_.at(u);
  if (which == ShardState::Master && s.refs == 0) drop_full(s);  // its gathered copy is stale
  Tensor& t = state_tensor(u, which);
  if (t.dtype == DType::F32 && !on_host(which)) {
    be_.upload(t, values.data());
  } else {  // converted (rounded to nearest; exact for values saved from bf16)
    Tensor f32 = be_.alloc(DType::F32, values.size());
    be_.upload(f32, values.data());
    set_state_f32(u, which, f32);
    be_.free(f32);
  }
  if (which == ShardState::Master) refresh_low(u);
}

void Fsdp::zero_grads() {
  sync_grads();
  for (auto& s : units_) {
    be_.zero(s.grad);
    s.synced = s.local = false;
  }
}

void Fsdp::track_gathered() {
  // A freed tensor keeps its shape (free() only clears the pointer): count live ones.
  auto held = [](const Tensor& t) { return t.empty() ? size_t{0} : t.bytes(); };
  gathered_now_ = 0;
  for (const auto& s : units_) gathered_now_ += held(s.full) + held(s.full_grad);
  for (const Reduction& r : reductions_) gathered_now_ += held(r.full_grad) + held(r.part);
  gathered_peak_ = std::max(gathered_peak_, gathered_now_);
}

// The all-gather runs in place: this rank's shard, cast to the compute dtype, is
// written into its own slot of the gathered buffer (no staging buffer, and the
// collective never reads the master weights the optimizer updates).
void Fsdp::start_gather(int u) {
  UnitState& s = units_[u];
  if (in_place()) {  // the shard is the whole (padded) unit: lend it, nothing to gather
    s.full = compute_shard(s);
    return;
  }
  ST_NVTX_RANGE("all-gather", layout_.unit(u).name);
  const size_t n = plan_.shard_numel(u);
  if (fp8_gathered(u)) {
    agree_fp8_scales();
    s.full = be_.alloc(opt_.compute_dtype, plan_.padded_numel(u));
    const int r = comm_.rank();
    const size_t from = fp8_from(u);
    const ElemRange mine = plan_.valid_range_of(u, r);
    const size_t base = plan_.range_of(u, r).begin;
    const Tensor src = compute_shard(s);
    // This rank's part before the tail, as it is, then its part of the tail cast into
    // its place among the codes: one run of bytes (fp8_gather_byte), gathered at once.
    if (mine.begin < from) {
      const size_t head = std::min(mine.end, from) - mine.begin;
      be_.copy(s.full.slice(mine.begin, head), src.slice(mine.begin - base, head));
    }
    const Tensor codes = fp8_codes(s, u);
    const auto& spans = opt_.fp8_gather[u];
    for (size_t k = 0; k < spans.size(); ++k) {
      const size_t a = std::max(spans[k].offset, mine.begin), b = std::min(spans[k].offset + spans[k].numel, mine.end);
      if (a < b)
        be_.fp8_quantize(codes.slice(a - from, b - a), Tensor{}, fp8_inv_.slice(4 * (fp8_slot_[u] + k), 1),
                         src.slice(a - base, b - a), 1, static_cast<int>(b - a), true);
    }
    const size_t total = fp8_gather_byte(plan_.numel(u), from, dtype_size(opt_.compute_dtype));
    s.gathering = comm_.all_gather_v_async(Tensor{s.full.data, DType::F8E4M3, total}, s.part_bytes);
    s.gather_pending = true;
    track_gathered();
    return;
  }
  s.full = be_.alloc(opt_.compute_dtype, plan_.padded_numel(u));
  Tensor mine = s.full.slice(static_cast<size_t>(comm_.rank()) * n, n);
  be_.copy(mine, compute_shard(s));
  s.gathering = comm_.all_gather_async(s.full, mine, n);
  s.gather_pending = true;
  track_gathered();
}

void Fsdp::drop_full(UnitState& s) {
  if (s.full.empty()) return;
  if (in_place()) {  // lent, not owned
    s.full = Tensor{};
    return;
  }
  if (s.gather_pending) {
    s.gather_pending = false;
    comm_.wait(s.gathering);  // a prefetch nobody acquired: its collective still writes here
  }
  be_.free(s.full);
}

Tensor Fsdp::acquire(int u, Pass) {
  UnitState& s = units_.at(u);
  if (s.full.empty()) start_gather(u);
  if (s.gather_pending) {
    ST_NVTX_RANGE("wait all-gather", layout_.unit(u).name);
    s.gather_pending = false;
    comm_.wait(s.gathering);
  }
  ++s.refs;
  return s.full;
}

void Fsdp::prefetch(int u, Pass) {
  if (u < 0 || u >= layout_.num_units()) return;
  if (units_[u].full.empty()) start_gather(u);
}

void Fsdp::release(int u, Pass pass) {
  UnitState& s = units_.at(u);
  ST_CHECK(s.refs > 0, "unit '", layout_.unit(u).name, "' released more often than acquired");
  if (--s.refs == 0 && (pass == Pass::Backward || opt_.reshard_after_forward)) drop_full(s);
}

Tensor Fsdp::grad(int u) {
  UnitState& s = units_.at(u);
  if (in_place()) return s.grad;  // accumulated in place: the shard is the whole unit
  if (s.full_grad.empty()) {
    s.full_grad = be_.alloc(DType::F32, plan_.padded_numel(u));
    track_gathered();
  }
  return s.full_grad;
}

void Fsdp::grad_ready(int u) {
  UnitState& s = units_.at(u);
  if (in_place()) return;
  ST_NVTX_RANGE("reduce-scatter", layout_.unit(u).name);
  ST_CHECK(!s.full_grad.empty(), "unit '", layout_.unit(u).name, "' has no gradient to reduce");
  const size_t n = plan_.shard_numel(u);
  // An older reduction of this unit (previous micro-batch) must have reached the shard
  // first: the new one adds to it.
  for (Reduction& old : reductions_)
    if (old.unit == u)
      while (!retire(old)) {
      }
  // Start the reduce-scatter of this micro-batch's gradient (fp32, or rounded to the
  // reduce dtype, the fp32 one freed); it is added to the shard when retired.
  Tensor full = s.full_grad;
  s.full_grad = Tensor{};
  if (low_reduce()) {
    Tensor wire = be_.alloc(opt_.reduce_dtype, plan_.padded_numel(u));
    be_.copy(wire, full);
    be_.free(full);
    full = wire;
  }
  Reduction r{u, full, be_.alloc(opt_.reduce_dtype, n), {}, replica_sync_, false};
  r.work = comm_.reduce_scatter_async(r.part, r.full_grad, n);
  // Every older reduction advances one stage; each rank does the same in the same
  // order, so the collectives match across ranks.
  size_t kept = 0;
  for (size_t i = 0; i < reductions_.size(); ++i)
    if (!retire(reductions_[i])) reductions_[kept++] = reductions_[i];  // true at once for one completed above
  reductions_.resize(kept);
  reductions_.push_back(r);
  track_gathered();
}

// Stages: the reduce-scatter lands (its input is freed); then, without HSDP, `part` is
// added to the shard. With HSDP:
//   shard holds nothing summed yet, no sync   add `part`; the shard is now local
//   shard holds nothing summed yet, sync      add `part`, all-reduce the whole shard
//                                             (this replica's micro-batches so far)
//   shard already summed                      all-reduce `part`, then add it
// so every contribution is summed across the replicas exactly once.
bool Fsdp::retire(Reduction& r) {
  UnitState& s = units_[r.unit];
  const size_t n = plan_.shard_numel(r.unit);
  if (r.replicating) {
    replicate_->wait(r.work);
    r.replicating = false;
    if (r.replaces) {
      r.replaces = false;
      put_back_whole(s.grad, r.part);
    } else if (!r.part.empty()) {
      add_part(s.grad, r.part, n);
    }
    return true;
  }
  if (r.full_grad.empty() && r.part.empty()) return true;  // completed earlier
  comm_.wait(r.work);
  be_.free(r.full_grad);
  if (replicate_ && s.synced) {
    r.work = replicate_->all_reduce_async(r.part, n);
    r.replicating = true;
    return false;
  }
  add_part(s.grad, r.part, n);
  if (!replicate_) return true;
  if (!r.sync) {
    s.local = true;
    return true;
  }
  r.work = all_reduce_whole(s.grad, n, r.part);
  r.replaces = !r.part.empty();
  r.replicating = true;
  s.synced = true;
  s.local = false;
  return false;
}

void Fsdp::sync_grads() {
  ST_NVTX_RANGE("sync grads");
  for (Reduction& r : reductions_)
    while (!retire(r)) {
    }
  reductions_.clear();
  if (!replicate_) return;
  // Shards that only this replica has summed (no micro-batch asked for the sync).
  struct Pending {
    int unit;
    CommWork work;
    Tensor wire;  // the reduce-dtype copy being summed (empty: in place)
  };
  std::vector<Pending> pending;
  for (int u = 0; u < layout_.num_units(); ++u) {
    UnitState& s = units_[u];
    if (!s.local) continue;
    Pending p{u, {}, {}};
    p.work = all_reduce_whole(s.grad, plan_.shard_numel(u), p.wire);
    pending.push_back(p);
    s.local = false;
    s.synced = true;
  }
  for (Pending& p : pending) {
    replicate_->wait(p.work);
    put_back_whole(units_[p.unit].grad, p.wire);
  }
}

void Fsdp::add_part(Tensor grad, Tensor& part, size_t n) {
  if (part.dtype == DType::F32) {
    be_.accumulate(grad, part, n);
    be_.free(part);
    return;
  }
  Tensor wide = be_.alloc(DType::F32, n);
  be_.copy(wide, part);
  be_.free(part);
  be_.accumulate(grad, wide, n);
  be_.free(wide);
}

CommWork Fsdp::all_reduce_whole(Tensor grad, size_t n, Tensor& wire) {
  if (!low_reduce()) return replicate_->all_reduce_async(grad, n);
  wire = be_.alloc(opt_.reduce_dtype, n);
  be_.copy(wire, grad.slice(0, n));
  return replicate_->all_reduce_async(wire, n);
}

void Fsdp::put_back_whole(Tensor grad, Tensor& wire) {
  if (wire.empty()) return;
  be_.copy(grad.slice(0, wire.numel), wire);
  be_.free(wire);
}

double Fsdp::grad_norm() {
  ST_NVTX_RANGE("grad norm");
  sync_grads();
  std::vector<std::pair<Tensor, size_t>> parts;
  for (int u = 0; u < layout_.num_units(); ++u) parts.push_back({units_[u].grad, plan_.shard_numel(u)});
  const double local = be_.sum_squares_total(parts);  // one wait for the device
  return std::sqrt(comm_.all_reduce_sum(local));
}

// With train.offload, unit u's state is uploaded into staging slot u % 2 on the
// ToDevice lane while unit u-1 is updated on the compute lane, and downloaded from its
// slot on the ToHost lane after its update: both directions of the bus and the kernels
// overlap. The lanes' order: an upload into a slot waits for the download that last used
// it (and that download for the update before it); an update waits for its upload.
void Fsdp::step(const AdamWParams& params) {
  ST_NVTX_RANGE("optimizer step");
  sync_grads();
  fp8_stale_ = true;
  using Lane = Backend::Lane;
  const int U = layout_.num_units();
  auto staged = [&](const Tensor& stage, int u) {
    return stage.slice(size_t(u % 2) * stage_slot_, plan_.shard_numel(u));
  };
  auto bring_in = [&](int u) {
    be_.lane_wait(Lane::ToDevice, Lane::ToHost);  // the slot's last download, and the host copy's
    UnitState& s = units_[u];
    if (opt_.offload_state) {
      be_.upload_async(staged(stage_m_, u), s.m.data, Lane::ToDevice);
      be_.upload_async(staged(stage_v_, u), s.v.data, Lane::ToDevice);
    }
    if (opt_.offload_master) be_.upload_async(staged(stage_master_, u), s.master.data, Lane::ToDevice);
  };
  if (opt_.offload_state) {
    be_.lane_wait(Lane::ToDevice, Lane::Compute);  // the staging buffers exist; the gradients are final
    bring_in(0);
  }
  for (int u = 0; u < U; ++u) {
    UnitState& s = units_[u];
    ST_CHECK(s.refs == 0, "optimizer step while a unit is still gathered");
    drop_full(s);  // stale after this step (and a prefetch in flight must land first)
    Tensor master = s.master, m = s.m, v = s.v;
    if (opt_.offload_state) {
      be_.lane_wait(Lane::Compute, Lane::ToDevice);  // unit u's state is in (u+1's is not yet asked for)
      if (u + 1 < U) bring_in(u + 1);
      m = staged(stage_m_, u), v = staged(stage_v_, u);
      if (opt_.offload_master) master = staged(stage_master_, u);
    }
    const uint64_t first = plan_.range_of(u, comm_.rank()).begin;  // this shard's place in the unit
    for (const DecaySpan& sp : s.spans) {
      AdamWParams p = params;
      if (!sp.decay) p.weight_decay = 0;
      p.round_key = hash_combine(params.round_key, static_cast<uint64_t>(u));
      p.round_index = first + sp.offset;
      if (s.low.empty())
        be_.adamw(master.slice(sp.offset, sp.numel), s.grad.slice(sp.offset, sp.numel), m.slice(sp.offset, sp.numel),
                  v.slice(sp.offset, sp.numel), sp.numel, p);
      else  // the update and the compute-dtype copy in one pass
        be_.adamw_copy(master.slice(sp.offset, sp.numel), s.grad.slice(sp.offset, sp.numel),
                       m.slice(sp.offset, sp.numel), v.slice(sp.offset, sp.numel), s.low.slice(sp.offset, sp.numel),
                       sp.numel, p);
    }
    if (opt_.offload_state) {
      be_.lane_wait(Lane::ToHost, Lane::Compute);  // after the update
      be_.download_async(s.m.data, m, Lane::ToHost);
      be_.download_async(s.v.data, v, Lane::ToHost);
      if (opt_.offload_master) be_.download_async(s.master.data, master, Lane::ToHost);
    }
  }
  // The compute lane's next work (and synchronize()) comes after the last download.
  if (opt_.offload_state) be_.lane_wait(Lane::Compute, Lane::ToHost);
}

FsdpMemory Fsdp::memory() const {
  FsdpMemory m;
  for (const auto& s : units_) {
    (opt_.offload_master ? m.host_bytes : m.master_bytes) += s.master.bytes();
    m.grad_bytes += s.grad.bytes();
    (opt_.offload_state ? m.host_bytes : m.optimizer_bytes) += s.m.bytes() + s.v.bytes();
    m.master_bytes += s.low.empty() ? 0 : s.low.bytes();
  }
  for (const Tensor* t : {&stage_master_, &stage_m_, &stage_v_}) m.staging_bytes += t->bytes();
  m.gathered_peak_bytes = gathered_peak_;
  return m;
}

}  // namespace st

#include "fsdp/fsdp.h"

#include <algorithm>
#include <cmath>

#include "model/init.h"

namespace st {

Fsdp::Fsdp(const ParamLayout& layout, Backend& backend, Comm& comm, Comm* replicate, FsdpOptions options)
    : layout_(layout), be_(backend), comm_(comm), replicate_(replicate), opt_(options) {
  ST_CHECK(layout.world() == comm.world(), "layout built for world ", layout.world(), " but the comm has ",
           comm.world(), " ranks");
  size_t max_shard = 0;
  const size_t r = static_cast<size_t>(comm.rank());
  for (const Unit& u : layout.units()) {
    UnitState s;
    const size_t n = u.shard_numel;
    s.master = be_.alloc(DType::F32, n);
    s.grad = be_.alloc(DType::F32, n);
    s.m = be_.alloc(DType::F32, n);
    s.v = be_.alloc(DType::F32, n);
    // Split this rank's slice [r*n, (r+1)*n) of the unit by parameter decay.
    const size_t lo = r * n, hi = lo + n;
    for (const ParamSpec& p : u.params) {
      const size_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.numel);
      if (a >= b) continue;
      if (!s.spans.empty() && s.spans.back().decay == p.decay && s.spans.back().offset + s.spans.back().numel == a - lo)
        s.spans.back().numel += b - a;
      else
        s.spans.push_back({a - lo, b - a, p.decay});
    }
    max_shard = std::max(max_shard, n);
    units_.push_back(s);
  }
  if (opt_.compute_dtype != DType::F32) send_ = be_.alloc(opt_.compute_dtype, max_shard);
}

Fsdp::~Fsdp() {
  for (auto& s : units_)
    for (Tensor* t : {&s.master, &s.grad, &s.m, &s.v, &s.full, &s.full_grad})
      if (!t->empty()) be_.free(*t);
  if (!send_.empty()) be_.free(send_);
}

void Fsdp::init_weights(uint64_t seed, double std) {
  const size_t r = static_cast<size_t>(comm_.rank());
  for (int u = 0; u < layout_.num_units(); ++u) {
    const Unit& unit = layout_.unit(u);
    const size_t n = unit.shard_numel;
    std::vector<float> v(n);
    init_unit_values(unit, seed, std, r * n, (r + 1) * n, v.data());
    be_.upload(units_[u].master, v.data());
  }
}

void Fsdp::load_unit(int u, const std::vector<float>& values) {
  const Unit& unit = layout_.unit(u);
  ST_CHECK(values.size() == unit.numel, "unit '", unit.name, "' expects ", unit.numel, " values, got ",
           values.size());
  const size_t n = unit.shard_numel, lo = static_cast<size_t>(comm_.rank()) * n;
  std::vector<float> shard(n, 0.0f);
  for (size_t i = 0; i < n && lo + i < unit.numel; ++i) shard[i] = values[lo + i];
  be_.upload(units_[u].master, shard.data());
  if (!units_[u].full.empty() && units_[u].refs == 0) be_.free(units_[u].full);
}

std::vector<float> Fsdp::gather_unit(int u) {
  const Unit& unit = layout_.unit(u);
  Tensor all = be_.alloc(DType::F32, unit.padded_numel);
  comm_.all_gather(all, units_[u].master, unit.shard_numel);
  std::vector<float> v(unit.padded_numel);
  be_.download(v.data(), all);
  be_.free(all);
  v.resize(unit.numel);
  return v;
}

void Fsdp::zero_grads() {
  for (auto& s : units_) be_.zero(s.grad);
}

void Fsdp::track_gathered() {
  gathered_now_ = 0;
  for (const auto& s : units_) gathered_now_ += s.full.bytes() + s.full_grad.bytes();
  gathered_peak_ = std::max(gathered_peak_, gathered_now_);
}

Tensor Fsdp::acquire(int u, Pass) {
  UnitState& s = units_.at(u);
  if (s.full.empty()) {
    const Unit& unit = layout_.unit(u);
    s.full = be_.alloc(opt_.compute_dtype, unit.padded_numel);
    if (opt_.compute_dtype == DType::F32) {
      comm_.all_gather(s.full, s.master, unit.shard_numel);
    } else {
      Tensor send = send_.slice(0, unit.shard_numel);
      be_.copy(send, s.master);
      comm_.all_gather(s.full, send, unit.shard_numel);
    }
    track_gathered();
  }
  ++s.refs;
  return s.full;
}

void Fsdp::release(int u, Pass pass) {
  UnitState& s = units_.at(u);
  ST_CHECK(s.refs > 0, "unit '", layout_.unit(u).name, "' released more often than acquired");
  if (--s.refs == 0 && (pass == Pass::Backward || opt_.reshard_after_forward)) be_.free(s.full);
}

Tensor Fsdp::grad(int u) {
  UnitState& s = units_.at(u);
  if (s.full_grad.empty()) {
    s.full_grad = be_.alloc(DType::F32, layout_.unit(u).padded_numel);
    track_gathered();
  }
  return s.full_grad;
}

void Fsdp::grad_ready(int u) {
  UnitState& s = units_.at(u);
  ST_CHECK(!s.full_grad.empty(), "unit '", layout_.unit(u).name, "' has no gradient to reduce");
  const size_t n = layout_.unit(u).shard_numel;
  // Reduce-scatter this micro-batch's fp32 gradient, then add it to the shard.
  Tensor part = be_.alloc(DType::F32, n);
  comm_.reduce_scatter(part, s.full_grad, n);
  if (replicate_) replicate_->all_reduce(part, n);
  be_.accumulate(s.grad, part, n);
  be_.free(part);
  be_.free(s.full_grad);
}

double Fsdp::grad_norm() {
  double local = 0;
  for (int u = 0; u < layout_.num_units(); ++u) local += be_.sum_squares(units_[u].grad, layout_.unit(u).shard_numel);
  return std::sqrt(comm_.all_reduce_sum(local));
}

void Fsdp::step(const AdamWParams& params) {
  for (auto& s : units_) {
    ST_CHECK(s.refs == 0, "optimizer step while a unit is still gathered");
    for (const Span& sp : s.spans) {
      AdamWParams p = params;
      if (!sp.decay) p.weight_decay = 0;
      be_.adamw(s.master.slice(sp.offset, sp.numel), s.grad.slice(sp.offset, sp.numel),
                s.m.slice(sp.offset, sp.numel), s.v.slice(sp.offset, sp.numel), sp.numel, p);
    }
    if (!s.full.empty()) be_.free(s.full);  // stale now
  }
}

FsdpMemory Fsdp::memory() const {
  FsdpMemory m;
  for (const auto& s : units_) {
    m.master_bytes += s.master.bytes();
    m.grad_bytes += s.grad.bytes();
    m.optimizer_bytes += s.m.bytes() + s.v.bytes();
  }
  m.gathered_peak_bytes = gathered_peak_;
  return m;
}

}  // namespace st

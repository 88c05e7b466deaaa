#include "fsdp/shard_plan.h"

#include <algorithm>

#include "core/error.h"

namespace st {

ShardPlan::ShardPlan(const ParamLayout& layout, int world) : layout_(layout), world_(world) {
  ST_CHECK(world >= 1, "a shard plan needs a world of at least 1 rank, got ", world);
}

size_t ShardPlan::numel(int unit) const { return layout_.unit(unit).numel; }

size_t ShardPlan::padded_numel(int unit) const {
  const size_t w = static_cast<size_t>(world_);
  return (numel(unit) + w - 1) / w * w;
}

size_t ShardPlan::shard_numel(int unit) const { return padded_numel(unit) / static_cast<size_t>(world_); }

ElemRange ShardPlan::range_of(int unit, int rank) const {
  ST_CHECK(rank >= 0 && rank < world_, "rank ", rank, " outside a shard group of ", world_);
  const size_t n = shard_numel(unit), lo = static_cast<size_t>(rank) * n;
  return {lo, lo + n};
}

ElemRange ShardPlan::valid_range_of(int unit, int rank) const {
  const ElemRange r = range_of(unit, rank);
  const size_t n = numel(unit);
  return {std::min(r.begin, n), std::min(r.end, n)};
}

std::vector<DecaySpan> ShardPlan::decay_spans(int unit, int rank) const {
  const ElemRange r = range_of(unit, rank);
  std::vector<DecaySpan> spans;
  for (const ParamSpec& p : layout_.unit(unit).params) {
    const size_t a = std::max(r.begin, p.offset), b = std::min(r.end, p.offset + p.numel);
    if (a >= b) continue;
    if (!spans.empty() && spans.back().decay == p.decay && spans.back().offset + spans.back().numel == a - r.begin)
      spans.back().numel += b - a;
    else
      spans.push_back({a - r.begin, b - a, p.decay});
  }
  return spans;
}

std::vector<ShardPiece> ShardPlan::pieces_from(const ShardPlan& src, int unit, int dst_rank) const {
  ST_CHECK(&src.layout_ == &layout_ || src.numel(unit) == numel(unit), "resharding unit '",
           layout_.unit(unit).name, "': ", src.numel(unit), " elements saved, ", numel(unit), " expected");
  const ElemRange want = valid_range_of(unit, dst_rank);
  std::vector<ShardPiece> pieces;
  size_t at = want.begin;
  while (at < want.end) {
    const int s = static_cast<int>(at / src.shard_numel(unit));
    const ElemRange have = src.range_of(unit, s);
    const size_t hi = std::min(want.end, have.end);
    pieces.push_back({s, at - have.begin, at - want.begin, hi - at});
    at = hi;
  }
  return pieces;
}

size_t ShardPlan::total_shard_numel() const {
  size_t n = 0;
  for (int u = 0; u < num_units(); ++u) n += shard_numel(u);
  return n;
}

GatheredMemory ShardPlan::gathered_peak(size_t cdt, bool reshard, size_t rdt) const {
  const int L = layout_.config().num_layers;
  const int e = layout_.embed_unit(), f = layout_.final_unit();
  const bool tied = layout_.lm_head_unit() == e;
  auto w = [&](int u) { return u < 0 ? size_t{0} : padded_numel(u) * cdt; };
  auto g = [&](int u) { return padded_numel(u) * 4; };
  // A reduction in flight: the unit and its shard in the reduce dtype. Starting one:
  // in f32 the gradient itself becomes its input and the shard is allocated; in bf16
  // the gradient and its bf16 copy are held at once (the shard comes after).
  auto p = [&](int u) { return shard_numel(u) * rdt; };
  auto reducing_now = [&](int u) { return rdt == 4 ? p(u) : padded_numel(u) * rdt; };
  auto in_flight_of = [&](int u) { return padded_numel(u) * rdt + p(u); };
  auto block = [&](int l) { return l < 0 || l >= L ? -1 : layout_.layer_unit(l); };
  // Without resharding a unit gathered in forward stays until its backward releases
  // it: blocks 0..l, an untied embedding, and the final unit (it has no backward
  // acquire, so it stays to the optimizer step), as does a tied embedding after its
  // last use.
  auto blocks_upto = [&](int l) {
    size_t n = 0;
    for (int k = 0; k <= l && k < L; ++k) n += w(block(k));
    return n;
  };
  const size_t held = tied ? w(e) : 0, tied_grad = tied ? g(e) : 0;
  const size_t untied_e = tied ? 0 : w(e);

  GatheredMemory best;
  auto consider = [&](size_t weights, size_t grads, size_t in_flight, const std::string& where,
                      bool embedding_held = true) {
    GatheredMemory m{weights, embedding_held ? held : 0, grads, in_flight, where};
    if (m.total() > best.total()) best = m;
  };
  const int first = L > 0 ? block(0) : f;
  consider(untied_e + w(first), 0, 0, "forward of the embedding (next unit prefetched)");
  for (int l = 0; l < L; ++l) {
    const int next = l + 1 < L ? block(l + 1) : f;
    consider(reshard ? w(block(l)) + w(next) : untied_e + blocks_upto(l) + w(next), 0, 0,
             "forward of a block (next unit prefetched)");
  }
  // The head: final norm (+ untied lm_head) gathered, the last block prefetched for
  // backward, the final unit's gradient (and a tied embedding's, kept to the end).
  consider(reshard ? w(f) + w(block(L - 1)) : untied_e + blocks_upto(L - 1) + w(f), g(f) + tied_grad, 0,
           "lm_head and loss (last block prefetched)");
  for (int l = L - 1; l >= 0; --l) {
    const int reducing = l + 1 < L ? block(l + 1) : f;  // retired at this unit's grad_ready
    const int prefetched = l > 0 ? block(l - 1) : (tied ? -1 : e);
    const size_t weights = reshard ? w(block(l)) + w(prefetched) : untied_e + blocks_upto(l) + w(f);
    const size_t in_flight = in_flight_of(reducing);
    consider(weights, g(block(l)) + tied_grad, in_flight,
             "backward of a block (previous unit prefetched, the next one's reduction in flight)");
    // grad_ready: this unit's weights are released, its reduction starts before the
    // previous one is retired.
    consider(weights - w(block(l)), g(block(l)) + tied_grad, in_flight + reducing_now(block(l)),
             "gradient reduction of a block starting while the previous one lands");
  }
  const size_t kept_f = reshard ? 0 : w(f);
  const size_t in_flight_first = L > 0 ? in_flight_of(block(0)) : in_flight_of(f);
  consider(untied_e + kept_f, g(e), in_flight_first, "backward of the embedding");
  // Its weights are released before its reduction starts: dropped, unless a tied
  // embedding without resharding (released as a forward use) stays to the step.
  consider(kept_f, g(e), in_flight_first + reducing_now(e), "gradient reduction of the embedding starting", !reshard);
  return best;
}

}  // namespace st

// How the units of a layout are split across the ranks of a shard group: all the
// arithmetic of sharding in one place. A unit's flat buffer is padded to a multiple
// of the world size W and rank r owns the contiguous slice
// [r * shard, (r + 1) * shard) of it, so a checkpoint saved at N ranks reshards to M
// by range arithmetic alone (pieces_from).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "model/layout.h"

namespace st {

// Elements [begin, end) of a unit's flat buffer.
struct ElemRange {
  size_t begin = 0, end = 0;
  size_t size() const { return end > begin ? end - begin : 0; }
  bool empty() const { return end <= begin; }
};

// A run of a rank's shard with one weight-decay rule; offset within the shard.
struct DecaySpan {
  size_t offset = 0, numel = 0;
  bool decay = false;
};

// Resharding: `numel` elements of a destination rank's shard, at `dst_offset` in
// it, come from source rank `src_rank`'s shard at `src_offset`.
struct ShardPiece {
  int src_rank = 0;
  size_t src_offset = 0, dst_offset = 0, numel = 0;
};

// Gathered (unsharded) buffers resident at once at the worst point of a step, in
// bytes, with the point named: weights in the compute dtype, gradients in fp32.
struct GatheredMemory {
  size_t weights = 0;            // units being computed and the one prefetched
  size_t held_tied_embedding = 0;  // a tied embedding stays gathered from the first forward to the last backward
  size_t grads = 0;              // unit gradients being accumulated (a tied embedding's for the whole backward)
  size_t in_flight = 0;          // a reduction not yet retired: its input and the part it lands in (reduce dtype)
  std::string where;             // the point of the step this is
  size_t total() const { return weights + held_tied_embedding + grads + in_flight; }
};

class ShardPlan {
 public:
  ShardPlan(const ParamLayout& layout, int world);

  const ParamLayout& layout() const { return layout_; }
  int world() const { return world_; }
  int num_units() const { return layout_.num_units(); }

  size_t numel(int unit) const;         // the unit's parameters
  size_t padded_numel(int unit) const;  // numel rounded up to a multiple of world
  size_t shard_numel(int unit) const;   // padded_numel / world: every rank's shard size

  // The slice rank `rank` owns, in the unit's padded buffer.
  ElemRange range_of(int unit, int rank) const;
  // The part of range_of that holds parameters (no padding); may be empty.
  ElemRange valid_range_of(int unit, int rank) const;
  // Rank `rank`'s shard of `unit`, split into runs by weight decay.
  std::vector<DecaySpan> decay_spans(int unit, int rank) const;
  // Where the parameters of `dst_rank`'s shard (this plan) live in the shards of
  // `src` (another plan over the same layout): pieces in increasing dst_offset,
  // covering valid_range_of(unit, dst_rank) exactly.
  std::vector<ShardPiece> pieces_from(const ShardPlan& src, int unit, int dst_rank) const;

  // Σ over units of shard_numel: the elements of one rank's shard of everything.
  size_t total_shard_numel() const;
  // The gathered-buffer peak of a step (see GatheredMemory), for the model's schedule:
  // forward gathers unit u and prefetches u+1; backward holds unit u, prefetches
  // u-1, accumulates u's fp32 gradient and still reduces u+1's (retired at the next
  // unit); with reshard_after_forward false every unit stays gathered from its
  // forward to its backward. A reduction in flight holds the unit and its shard in the
  // reduce dtype; one in bf16 starts from its fp32 gradient and a bf16 copy at once.
  GatheredMemory gathered_peak(size_t compute_dtype_bytes, bool reshard_after_forward,
                               size_t reduce_dtype_bytes = 4) const;

 private:
  const ParamLayout& layout_;
  int world_;
};

}  // namespace st

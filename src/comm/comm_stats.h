// What a rank's collectives move: a Comm that counts, around any other. Every
// collective of the shard, replicate and world groups adds the bytes this rank sends
// to one CommStats, by kind, and how many of them go to a rank on another node, and
// the wall time the calling thread spent inside collectives.
//
// Bytes are what the rings move (Gloo's and NCCL's ring algorithms; comm_gloo.cpp,
// comm_nccl.cpp): in a group of N ranks, an all-gather or a reduce-scatter of `count`
// elements per rank sends (N-1) x count elements from each rank to its successor on
// the ring, an all-reduce of `count` elements 2(N-1)/N x count, a broadcast (N-1) x
// count from its root, an all-gather of unequal parts (all_gather_v) every part but its
// successor's, counted as an all-gather. A ring rank receives as much as it sends. A rank's successor
// is the next member of its group in rank order, so its bytes cross between nodes
// when that member lives on another node (ranks are placed node by node,
// ranks_per_node to a node, as every launch contract does). The scalar all-reduces
// (loss, token counts) count as 8-byte all-reduces.
//
// blocked_s: on the CPU backend every collective runs to its end inside the call, so
// it is the communication that compute waited for; on CUDA collectives run on their
// own streams and it is only the host's time to enqueue them.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/comm.h"
#include "core/collective.h"

namespace st {


struct CommCounts {
  uint64_t bytes[kCollectiveKinds] = {};  // sent by this rank, by CollectiveKind
  uint64_t inter_node_bytes = 0;           // of all of them, sent to a rank on another node
  uint64_t calls = 0;
  double blocked_s = 0;

  uint64_t total_bytes() const;
  CommCounts operator-(const CommCounts& earlier) const;
};

// Shared by the counting comms of one rank (they may be called from more than one
// thread).
class CommStats {
 public:
  void add(CollectiveKind kind, uint64_t bytes, bool inter_node, double seconds);
  void add_time(double seconds);
  CommCounts snapshot() const;

 private:
  mutable std::mutex mu_;
  CommCounts counts_;
};

// `inner` counted into `stats`. `members`: the world ranks of inner's group, in group
// rank order (inner's rank r is members[r]); `ranks_per_node` places world rank w on
// node w / ranks_per_node.
std::unique_ptr<Comm> make_counting_comm(std::unique_ptr<Comm> inner, std::shared_ptr<CommStats> stats,
                                         std::vector<int> members, int ranks_per_node);

}  // namespace st

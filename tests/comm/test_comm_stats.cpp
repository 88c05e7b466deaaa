// The byte counts of the counting comm (comm/comm_stats.h): what the rings send, by
// kind, and which part crosses between nodes, on Gloo process groups of forked ranks.
#include "comm/comm_stats.h"

#include <gtest/gtest.h>

#include <vector>

#include "backend/factory.h"
#include "comm/process_groups.h"
#include "core/error.h"
#include "support/fork_ranks.h"

namespace st {
namespace {

Tensor view(std::vector<float>& v) { return Tensor{v.data(), DType::F32, v.size()}; }

// Four ranks in shard groups of two (HSDP), `per_node` ranks to a node. Each rank runs
// one all-gather and one reduce-scatter of 1000 floats per rank on its shard group, and
// one all-reduce of 1000 floats on its replicate group, then checks its counts.
void four_ranks_hsdp(int per_node) {
  const int port = test::free_port();
  const auto errors = test::run_ranks(4, [&](int r) {
    auto be = make_backend("cpu", 0);
    Rendezvous where{.rank = r, .world = 4, .master_port = port};
    where.ranks_per_node = per_node;
    ProcessGroups g = init_process_groups(where, *be, 2, 30);
    const CommCounts before = g.stats->snapshot();
    std::vector<float> shard(1000, 1.0f), full(2000), grads(2000, 1.0f), out(1000), sum(1000, 1.0f);
    g.shard->all_gather(view(full), view(shard), 1000);
    g.shard->reduce_scatter(view(out), view(grads), 1000);
    g.replicate->all_reduce(view(sum), 1000);
    const CommCounts c = g.stats->snapshot() - before;
    auto bytes = [&](CollectiveKind k) { return c.bytes[static_cast<int>(k)]; };
    // Groups of two: (2-1) x 1000 floats to the ring successor; all-reduce 2(2-1)/2 x 1000.
    ST_CHECK(bytes(CollectiveKind::AllGather) == 4000, "rank ", r, ": all_gather ", bytes(CollectiveKind::AllGather));
    ST_CHECK(bytes(CollectiveKind::ReduceScatter) == 4000, "rank ", r, ": reduce_scatter ",
             bytes(CollectiveKind::ReduceScatter));
    ST_CHECK(bytes(CollectiveKind::AllReduce) == 4000, "rank ", r, ": all_reduce ", bytes(CollectiveKind::AllReduce));
    ST_CHECK(c.calls == 3, "rank ", r, ": ", c.calls, " calls");
    // Shard groups {0,1}, {2,3}; replicate groups {0,2}, {1,3}. Two ranks to a node:
    // shards stay on their node, replicas cross; one rank to a node: everything crosses.
    const uint64_t inter = per_node == 2 ? 4000 : 12000;
    ST_CHECK(c.inter_node_bytes == inter, "rank ", r, ": inter-node ", c.inter_node_bytes, ", expected ", inter);
    ST_CHECK(c.blocked_s > 0, "rank ", r, ": no time inside collectives");
    g.world->barrier();
  });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(CommStats, HsdpShardGroupsOnTheirNodeReplicasAcross) { four_ranks_hsdp(2); }
TEST(CommStats, OneRankPerNodeEverythingCrosses) { four_ranks_hsdp(1); }

// An all-gather of unequal parts (FSDP's FP8 gathers): each rank passes on every part
// but its ring successor's, counted as an all-gather.
TEST(CommStats, UnequalPartsCountWhatTheRingSends) {
  const int port = test::free_port();
  const auto errors = test::run_ranks(3, [&](int r) {
    auto be = make_backend("cpu", 0);
    Rendezvous where{.rank = r, .world = 3, .master_port = port};
    ProcessGroups g = init_process_groups(where, *be, 0, 30);
    const std::vector<size_t> counts = {5, 0, 7};
    std::vector<float> v(12, -1.0f);
    const size_t at[] = {0, 5, 5};
    for (size_t i = 0; i < counts[r]; ++i) v[at[r] + i] = float(r);
    const CommCounts before = g.stats->snapshot();
    g.shard->wait(g.shard->all_gather_v_async(view(v), counts));
    const CommCounts c = g.stats->snapshot() - before;
    for (size_t i = 0; i < 12; ++i) ST_CHECK(v[i] == (i < 5 ? 0.0f : 2.0f), "rank ", r, ": v[", i, "] = ", v[i]);
    const uint64_t want = 4 * (12 - counts[(r + 1) % 3]);  // 48, 20, 28
    const uint64_t got = c.bytes[static_cast<int>(CollectiveKind::AllGather)];
    ST_CHECK(got == want, "rank ", r, ": all_gather_v counted ", got, " bytes, expected ", want);
    g.world->barrier();
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(CommStats, AWorldOfOneMovesNothing) {
  auto be = make_backend("cpu", 0);
  ProcessGroups g = init_process_groups(Rendezvous{}, *be, 0, 5);
  std::vector<float> a(10, 1.0f), b(10);
  g.shard->all_gather(view(b), view(a), 10);
  g.world->all_reduce(view(a), 10);
  EXPECT_DOUBLE_EQ(g.world->all_reduce_sum(2.5), 2.5);
  const CommCounts c = g.stats->snapshot();
  EXPECT_EQ(c.total_bytes(), 0u);
  EXPECT_EQ(c.inter_node_bytes, 0u);
  EXPECT_EQ(c.calls, 3u);
}

}  // namespace
}  // namespace st

// Process groups: rendezvous once, then one communicator per group.
//   world      all ranks                                   prefix "world"
//   shard      ranks [g*G, (g+1)*G) for g = rank / G       prefix "shard<g>"
//   replicate  ranks with the same rank % G (when G < W)   prefix "replicate<rank % G>"
// G = 1 with W > 1 is plain data parallelism: no sharding, and the replicate group
// (all ranks) all-reduces the gradients, so it is built then too.
//
// Transport: Gloo for the CPU backend, NCCL for CUDA. A world of 1 needs none, except
// on CUDA under a launcher (`shardtrain launch --nproc-per-node 1`, torchrun, ...):
// then world and shard are NCCL communicators of one rank, so a one-GPU launch runs
// the same path as a multi-GPU job does.
#include "comm/process_groups.h"

#include <string>

#include "comm/comm_gloo.h"
#include "comm/comm_nccl.h"
#include "comm/tcp_store.h"
#include "core/error.h"
#include "core/log.h"

namespace st {

bool uses_nccl(const Rendezvous& where, const Backend& backend) {
  return backend.device() == Device::CUDA && (where.world > 1 || where.launched);
}

// The world ranks of the members of this rank's groups, in group rank order: shard
// group g holds ranks [g*G, (g+1)*G), replica group `pos` ranks pos, pos + G, ...
struct GroupMembers {
  std::vector<int> world, shard, replicate;
};
static GroupMembers group_members(int W, int G, int rank) {
  const int g = rank / G, pos = rank % G;
  GroupMembers m{std::vector<int>(W), std::vector<int>(G), std::vector<int>(W / G)};
  for (int r = 0; r < W; ++r) m.world[r] = r;
  for (int i = 0; i < G; ++i) m.shard[i] = g * G + i;
  for (int j = 0; j < W / G; ++j) m.replicate[j] = pos + j * G;
  return m;
}

static ProcessGroups init_uncounted_groups(const Rendezvous& where, Backend& backend, int shard_group_size,
                                           double timeout_s, bool overlap) {
  const int W = where.world;
  ST_CHECK_DIST(W >= 1 && where.rank >= 0 && where.rank < W, "rank ", where.rank, " outside a world of ", W);
  ST_CHECK_CONFIG(shard_group_size >= 0, "dist.shard_group_size must be 0 (all ranks) or positive, got ",
           shard_group_size);
  const int G = shard_group_size == 0 ? W : shard_group_size;
  ST_CHECK_CONFIG(G <= W && W % G == 0, "dist.shard_group_size ", G, " does not divide the world of ", W,
           " ranks: use a divisor of ", W, " (or 0 for all ranks)");

  ProcessGroups groups;
  const bool cuda = backend.device() == Device::CUDA;
  if (W == 1 && !uses_nccl(where, backend)) {
    groups.world = make_single_comm(backend);
    groups.shard = make_single_comm(backend);
    return groups;
  }

  const int rank = where.rank;
  auto store =
      std::make_shared<TcpStore>(where.master_addr, where.master_port, rank, W, timeout_s, where.job_id, where.secret,
                                 StoreBind{where.bind, where.ranks_per_node < W});
  if (rank == 0 && where.secret.empty())
    log_warn("rendezvous: no job secret (SHARDTRAIN_JOB_SECRET): any process that reaches port " +
             std::to_string(where.master_port) + " and knows the job id can join this job or read its keys " +
             "(docs/operations.md, \"Rendezvous security\")");
  groups.store = store;
  // Everyone present before any group connects, so a missing rank is named here
  // rather than surfacing as a Gloo key that never appeared.
  store->barrier("join", W, timeout_s);
  const int g = rank / G, pos = rank % G;

  if (cuda) {
    groups.nccl = true;
    // Each communicator is set up collectively, in the same order on every rank
    // (world, then shard, then replicate), so no rank waits on a group another rank
    // has not reached.
    groups.world = make_nccl_comm(*store, "world", rank, W, timeout_s, backend, rank);
    // G = 1 with W > 1 shards nothing; with W = 1 it is the launched single rank,
    // whose gathers and reduce-scatters go through NCCL too.
    groups.shard = G == 1 && W > 1
                       ? make_single_comm(backend)
                       : make_nccl_comm(*store, "shard" + std::to_string(g), pos, G, timeout_s, backend, rank);
    if (G < W)
      groups.replicate = make_nccl_comm(*store, "replicate" + std::to_string(pos), g, W / G, timeout_s, backend, rank);
    // The other shard or replicate groups may still be fetching their ids from the
    // store when this rank is done with its own.
    store->barrier("nccl_groups", W, timeout_s);
    if (rank == 0)
      log_info("comm: NCCL over " + std::to_string(W) + " rank(s), shard groups of " + std::to_string(G) +
               (groups.replicate ? ", " + std::to_string(W / G) + " replicas" : std::string()));
    return groups;
  }

  // Listen for Gloo peers on the address this host reaches rank 0 from: on one
  // machine that is loopback, across machines the interface facing the others.
  auto device = make_gloo_device(store->local_ip());

  // Each group knows its members' world ranks, so a timeout names the rank and node.
  const int rpn = where.ranks_per_node;
  const GroupMembers members = group_members(W, G, rank);
  groups.world = make_gloo_comm(store, "world", rank, W, timeout_s, device, rank, GlooPeers{{}, rpn}, overlap);
  groups.shard = G == 1 ? make_single_comm(backend)
                        : make_gloo_comm(store, "shard" + std::to_string(g), pos, G, timeout_s, device, rank,
                                         GlooPeers{members.shard, rpn}, overlap);
  if (G < W)
    groups.replicate = make_gloo_comm(store, "replicate" + std::to_string(pos), g, W / G, timeout_s, device, rank,
                                      GlooPeers{members.replicate, rpn}, overlap);
  return groups;
}

ProcessGroups init_process_groups(const Rendezvous& where, Backend& backend, int shard_group_size, double timeout_s,
                                  bool overlap) {
  ProcessGroups groups = init_uncounted_groups(where, backend, shard_group_size, timeout_s, overlap);
  // Each group counted, knowing the world ranks of its members.
  const int W = where.world, G = shard_group_size == 0 ? W : shard_group_size;
  const GroupMembers members = group_members(W, G, where.rank);
  auto count = [&](std::unique_ptr<Comm>& c, std::vector<int> members) {
    // A group of one (G = 1 shards nothing) is a single comm whatever the members.
    if (!c) return;
    if (c->world() == 1) members = {where.rank};
    c = make_counting_comm(std::move(c), groups.stats, std::move(members), where.ranks_per_node);
  };
  count(groups.world, members.world);
  count(groups.shard, members.shard);
  count(groups.replicate, members.replicate);
  return groups;
}

}  // namespace st

// Process groups: rendezvous once, then one communicator per group.
//   world      all ranks                                   prefix "world"
//   shard      ranks [g*G, (g+1)*G) for g = rank / G       prefix "shard<g>"
//   replicate  ranks with the same rank % G (when G < W)   prefix "replicate<rank % G>"
// G = 1 with W > 1 is plain data parallelism: no sharding, and the replicate group
// (all ranks) all-reduces the gradients, so it is built then too.
#include "dist/process_groups.h"

#include <string>

#include "core/error.h"
#include "dist/comm_gloo.h"
#include "dist/tcp_store.h"

namespace st {

ProcessGroups init_process_groups(const DistEnv& env, Backend& backend, int shard_group_size, double timeout_s) {
  const int W = env.world;
  ST_CHECK(W >= 1 && env.rank >= 0 && env.rank < W, "rank ", env.rank, " outside a world of ", W);
  ST_CHECK(shard_group_size >= 0, "dist.shard_group_size must be 0 (all ranks) or positive, got ",
           shard_group_size);
  const int G = shard_group_size == 0 ? W : shard_group_size;
  ST_CHECK(G <= W && W % G == 0, "dist.shard_group_size ", G, " does not divide the world of ", W,
           " ranks: use a divisor of ", W, " (or 0 for all ranks)");

  ProcessGroups groups;
  if (W == 1) {
    groups.world = make_single_comm(backend);
    groups.shard = make_single_comm(backend);
    return groups;
  }
  if (backend.device() == Device::CUDA) fail("multi-rank runs on CUDA need the NCCL comm, not built yet");

  auto store = std::make_shared<TcpStore>(env.master_addr, env.master_port, env.rank, W, timeout_s);
  // Everyone present before any group connects, so a missing rank is named here
  // rather than surfacing as a Gloo key that never appeared.
  store->barrier("join", W, timeout_s);
  // Listen for Gloo peers on the address this host reaches rank 0 from: on one
  // machine that is loopback, across machines the interface facing the others.
  auto device = make_gloo_device(store->local_ip());

  const int g = env.rank / G, pos = env.rank % G;
  groups.world = make_gloo_comm(store, "world", env.rank, W, timeout_s, device, env.rank);
  groups.shard = G == 1 ? make_single_comm(backend)
                        : make_gloo_comm(store, "shard" + std::to_string(g), pos, G, timeout_s, device, env.rank);
  if (G < W)
    groups.replicate =
        make_gloo_comm(store, "replicate" + std::to_string(pos), g, W / G, timeout_s, device, env.rank);
  return groups;
}

}  // namespace st

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
#include "dist/process_groups.h"

#include <unistd.h>

#include <string>

#include "core/error.h"
#include "core/log.h"
#include "dist/comm_gloo.h"
#include "dist/comm_nccl.h"
#include "dist/tcp_store.h"
#include "fabric/nccl_log.h"
#include "fabric/report.h"

namespace st {
namespace {

// The host name as NCCL expands %h in NCCL_DEBUG_FILE: up to the first '.'.
std::string short_host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  std::string h(buf);
  return h.substr(0, h.find('.'));
}

}  // namespace

ProcessGroups init_process_groups(const DistEnv& env, Backend& backend, int shard_group_size, double timeout_s,
                                  const FabricOptions* fabric) {
  const int W = env.world;
  ST_CHECK(W >= 1 && env.rank >= 0 && env.rank < W, "rank ", env.rank, " outside a world of ", W);
  ST_CHECK(shard_group_size >= 0, "dist.shard_group_size must be 0 (all ranks) or positive, got ",
           shard_group_size);
  const int G = shard_group_size == 0 ? W : shard_group_size;
  ST_CHECK(G <= W && W % G == 0, "dist.shard_group_size ", G, " does not divide the world of ", W,
           " ranks: use a divisor of ", W, " (or 0 for all ranks)");

  ProcessGroups groups;
  const bool cuda = backend.device() == Device::CUDA;
  const bool launched = env.source != DistEnv{}.source;
  if (W == 1 && !(cuda && launched)) {
    groups.world = make_single_comm(backend);
    groups.shard = make_single_comm(backend);
    return groups;
  }

  auto store = std::make_shared<TcpStore>(env.master_addr, env.master_port, env.rank, W, timeout_s);
  // Everyone present before any group connects, so a missing rank is named here
  // rather than surfacing as a Gloo key that never appeared.
  store->barrier("join", W, timeout_s);
  const int g = env.rank / G, pos = env.rank % G;

  if (cuda) {
    // NCCL reads its variables once, at its first call: the profile goes first.
    FabricEnvPlan plan;
    if (fabric) plan = apply_fabric_env(*fabric, env.rank, "");
    // Each communicator is set up collectively, in the same order on every rank
    // (world, then shard, then replicate), so no rank waits on a group another rank
    // has not reached. The store is needed only for that; the comms do not keep it.
    groups.world = make_nccl_comm(*store, "world", env.rank, W, timeout_s, backend, env.rank);
    // G = 1 with W > 1 shards nothing; with W = 1 it is the launched single rank,
    // whose gathers and reduce-scatters go through NCCL too.
    groups.shard = G == 1 && W > 1
                       ? make_single_comm(backend)
                       : make_nccl_comm(*store, "shard" + std::to_string(g), pos, G, timeout_s, backend, env.rank);
    if (G < W)
      groups.replicate =
          make_nccl_comm(*store, "replicate" + std::to_string(pos), g, W / G, timeout_s, backend, env.rank);
    if (fabric) {
      // NCCL connects peers at the first collective, and only then logs the paths.
      groups.world->barrier();
      groups.shard->barrier();
      if (groups.replicate) groups.replicate->barrier();
      TransportSummary mine;
      if (plan.debug_file.empty()) {
        mine.log_file = "(NCCL_DEBUG_FILE is empty: NCCL logs to stdout)";
      } else {
        mine = parse_nccl_log_file(expand_debug_file(plan.debug_file, short_host_name(), static_cast<long>(::getpid())));
      }
      groups.fabric = std::make_shared<const FabricReport>(
          gather_fabric_report(*store, env.rank, W, mine, plan, fabric->transport, timeout_s));
    }
    // Rank 0 serves the store only while it exists, and the other shard or replicate
    // groups may still be fetching their ids when rank 0 is done with its own.
    store->barrier("nccl_groups", W, timeout_s);
    if (env.rank == 0)
      log_info("comm: NCCL over " + std::to_string(W) + " rank(s), shard groups of " + std::to_string(G) +
               (groups.replicate ? ", " + std::to_string(W / G) + " replicas" : std::string()));
    return groups;
  }

  // Listen for Gloo peers on the address this host reaches rank 0 from: on one
  // machine that is loopback, across machines the interface facing the others.
  auto device = make_gloo_device(store->local_ip());

  groups.world = make_gloo_comm(store, "world", env.rank, W, timeout_s, device, env.rank);
  groups.shard = G == 1 ? make_single_comm(backend)
                        : make_gloo_comm(store, "shard" + std::to_string(g), pos, G, timeout_s, device, env.rank);
  if (G < W)
    groups.replicate =
        make_gloo_comm(store, "replicate" + std::to_string(pos), g, W / G, timeout_s, device, env.rank);
  return groups;
}

}  // namespace st

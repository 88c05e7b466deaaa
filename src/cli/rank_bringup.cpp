#include "cli/rank_bringup.h"

#include "backend/factory.h"
#include "core/log.h"
#include "netcheck/probe.h"

namespace st {

int rank_device_index(const std::string& device, const DistEnv& env) {
  const int n = device == "cpu" ? 0 : visible_devices(device);
  return n > 0 ? env.local_rank % n : 0;
}

RankContext bring_up_rank(const DistEnv& env, const std::string& device, const DistOptions& dist,
                          const FabricOptions* fabric, const std::string& out_dir) {
  RankContext ctx;
  ctx.env = env;
  set_log_rank(env.rank, env.world);
  ctx.backend = make_backend(device, rank_device_index(device, env));
  Rendezvous where;
  where.rank = env.rank;
  where.world = env.world;
  where.master_addr = env.master_addr;
  where.master_port = env.master_port;
  where.launched = env.launched;
  where.job_id = env.job_id;
  where.secret = env.job_secret;
  where.bind = dist.bind;
  where.ranks_per_node = env.local_world;
  // NCCL reads its variables once, at its first call (inside init_process_groups).
  FabricEnvPlan plan;
  if (fabric && uses_nccl(where, *ctx.backend)) plan = apply_fabric_env(*fabric, env.rank, out_dir);
  ctx.groups = init_process_groups(where, *ctx.backend, dist.shard_group_size, dist.timeout_s, dist.overlap);
  if (fabric && ctx.groups.nccl)
    ctx.fabric = probe_transport(ctx.groups, env.rank, env.world, plan, fabric->transport, dist.timeout_s);
  return ctx;
}

RankContext bring_up_rank(const std::string& device, const DistOptions& dist, const FabricOptions* fabric,
                          const std::string& out_dir) {
  return bring_up_rank(detect_dist_env(environ_map()), device, dist, fabric, out_dir);
}

}  // namespace st

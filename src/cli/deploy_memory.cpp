#include "cli/deploy_memory.h"

#include "train/memory_plan.h"

namespace st {
namespace {

struct Where {
  Device device;
  int shard_world;
  size_t workspace;
};

Where where(const RunConfig& cfg, int world) {
  const Device device = cfg.train.device == "cuda" ? Device::CUDA : Device::CPU;
  return {device, cfg.dist.shard_group_size > 0 ? cfg.dist.shard_group_size : world,
          device == Device::CUDA ? kCudaPlannedWorkspaceBytes : 0};
}

}  // namespace

MemoryPlanner trainer_memory_planner() {
  MemoryPlanner p;
  p.plan = [](const RunConfig& cfg, int world) {
    const Where w = where(cfg, world);
    const MemoryPlan m = plan_rank_memory(cfg, w.device, w.shard_world, world == 1, w.workspace);
    return RankMemory{m.device_total(), m.host_total()};
  };
  p.largest_micro_batch = [](const RunConfig& cfg, int world, size_t limit) {
    const Where w = where(cfg, world);
    return largest_fitting_micro_batch(cfg, w.device, w.shard_world, world == 1, w.workspace, limit);
  };
  return p;
}

}  // namespace st

// One rank's bring-up, the same for every command that trains or talks over the
// network (`train`, `nccl-check`, and a deployed pod's entry):
//   launch contract (env)  ->  device (LOCAL_RANK over the visible GPUs)  ->  backend
//   -> fabric profile (NCCL's environment, before its first call)  ->  process groups
//   -> transport probe (which network NCCL chose, gathered from every rank)
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"
#include "comm/process_groups.h"
#include "fabric/profile.h"
#include "fabric/transport_report.h"
#include "launch/env.h"

namespace st {

struct RankContext {
  DistEnv env;
  std::unique_ptr<Backend> backend;
  ProcessGroups groups;                          // uses backend: declared after it
  std::shared_ptr<const FabricReport> fabric;    // NCCL runs given fabric options; null otherwise
};

// `device`: cpu | cuda. `fabric` (may be null): the NCCL profile to apply and the
// transport to report; on the CPU (Gloo) it is ignored. `out_dir`: where the NCCL
// logs go when fabric->log_dir is empty (<out_dir>/nccl).
RankContext bring_up_rank(const std::string& device, const DistOptions& dist, const FabricOptions* fabric,
                          const std::string& out_dir);

// The same, from an explicit launch contract (tests; a pod's entry).
RankContext bring_up_rank(const DistEnv& env, const std::string& device, const DistOptions& dist,
                          const FabricOptions* fabric, const std::string& out_dir);

// The GPU of a rank: LOCAL_RANK wrapped around the devices it can see, so N ranks on
// a host with N GPUs get one each, and a rank given a single GPU (per-rank
// CUDA_VISIBLE_DEVICES) takes that one. 0 on the CPU or where nothing is visible
// (make_backend then says why).
int rank_device_index(const std::string& device, const DistEnv& env);

}  // namespace st

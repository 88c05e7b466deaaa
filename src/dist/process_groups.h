// The communicators a run needs: the whole world (data positions, loss and token
// counts), the shard group FSDP all-gathers and reduce-scatters over, and, for HSDP,
// the replicate group (same position in every shard group) whose gradient shards are
// all-reduced. With shard_group_size 0 or == world, replicate is null (plain FSDP).
#pragma once
#include <memory>

#include "backend/backend.h"
#include "dist/comm.h"
#include "dist/env.h"
#include "fabric/profile.h"

namespace st {

struct FabricReport;

struct ProcessGroups {
  std::unique_ptr<Comm> world, shard, replicate;
  // NCCL runs only (given fabric options): what every rank's NCCL log says about the
  // transport it chose, the same on every rank (src/fabric/report.h). Null otherwise.
  std::shared_ptr<const FabricReport> fabric;
};

// Rendezvous through a TCP store served by rank 0 at env.master_addr:master_port,
// then one communicator per group: Gloo for the CPU backend, NCCL for CUDA. Every
// wait is bounded by timeout_s; a rank that never arrives is named in the error.
// A world of 1 started by hand needs no network and gets single-process comms; on
// CUDA, a world of 1 started by a launcher gets NCCL comms (the same path as many).
//
// With `fabric` (CUDA only): the NCCL environment profile is applied before the
// first NCCL call, one barrier runs on every NCCL communicator (NCCL connects its
// channels at the first collective), and each rank's NCCL log is parsed and
// gathered into ProcessGroups::fabric. fabric->log_dir must be resolved (not "").
ProcessGroups init_process_groups(const DistEnv& env, Backend& backend, int shard_group_size, double timeout_s,
                                  const FabricOptions* fabric = nullptr);

// A world of one process (defined with the single-process comm).
ProcessGroups make_single_process_groups(Backend& backend);

}  // namespace st

// The transport probe: which network NCCL really chose. NCCL connects its channels
// at a communicator's first collective and only then logs the paths, so the probe
// runs one barrier on every NCCL communicator of the run, parses this rank's NCCL
// log, and gathers every rank's summary into one report through the rendezvous
// store (the same report on every rank).
#pragma once
#include <memory>
#include <string>

#include "comm/process_groups.h"
#include "fabric/profile.h"
#include "fabric/transport_report.h"

namespace st {

class TcpStore;

// Rank `rank` of `world` publishes `mine` under "fabric/summary/<rank>"; rank 0
// collects all of them (each wait bounded by timeout_s), builds the report with
// its own `env`, and publishes it under "fabric/report"; every rank returns it.
FabricReport gather_fabric_report(TcpStore& store, int rank, int world, const TransportSummary& mine,
                                  const FabricEnvPlan& plan, const std::string& transport, double timeout_s);

// After init_process_groups on NCCL communicators (groups.nccl and groups.store
// set); `plan` is what apply_fabric_env decided before them. Collective: every
// rank calls it. Each wait is bounded by timeout_s.
std::shared_ptr<const FabricReport> probe_transport(ProcessGroups& groups, int rank, int world,
                                                    const FabricEnvPlan& plan, const std::string& transport,
                                                    double timeout_s);

}  // namespace st

#include "fabric/probe.h"

#include <unistd.h>

#include "comm/tcp_store.h"
#include "core/error.h"
#include "fabric/nccl_log.h"

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

std::shared_ptr<const FabricReport> probe_transport(ProcessGroups& groups, int rank, int world,
                                                    const FabricEnvPlan& plan, const std::string& transport,
                                                    double timeout_s) {
  ST_CHECK(groups.nccl && groups.store, "the transport probe needs NCCL communicators and the rendezvous store");
  groups.world->barrier();
  groups.shard->barrier();
  if (groups.replicate) groups.replicate->barrier();
  TransportSummary mine;
  if (plan.debug_file.empty()) {
    mine.log_file = "(NCCL_DEBUG_FILE is empty: NCCL logs to stdout)";
  } else {
    mine = parse_nccl_log_file(expand_debug_file(plan.debug_file, short_host_name(), static_cast<long>(::getpid())));
  }
  return std::make_shared<const FabricReport>(
      gather_fabric_report(*groups.store, rank, world, mine, plan, transport, timeout_s));
}

}  // namespace st

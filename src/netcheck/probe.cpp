#include "netcheck/probe.h"

#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>

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

FabricReport gather_fabric_report(TcpStore& store, int rank, int world, const TransportSummary& mine,
                                  const FabricEnvPlan& plan, const std::string& transport, double timeout_s) {
  auto bytes = [](const std::string& s) { return std::vector<char>(s.begin(), s.end()); };
  const auto timeout = std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
  TransportSummary me = mine;
  me.rank = rank;
  store.set("fabric/summary/" + std::to_string(rank), bytes(to_json(me).dump()));
  if (rank == 0) {
    FabricReport r;
    r.transport = transport;
    r.env = plan.vars;
    r.log_dir = plan.log_dir;
    std::vector<std::string> keys;
    for (int q = 0; q < world; ++q) keys.push_back("fabric/summary/" + std::to_string(q));
    try {
      store.wait(keys, timeout);
    } catch (const Error& e) {
      fail("fabric: transport summaries missing from the store: ", e.what());
    }
    for (int q = 0; q < world; ++q) {
      const std::vector<char> v = store.get(keys[q]);
      r.ranks.push_back(transport_summary_from_json(nlohmann::json::parse(std::string(v.begin(), v.end()))));
    }
    store.set("fabric/report", bytes(to_json(r).dump()));
    return r;
  }
  try {
    store.wait({"fabric/report"}, timeout);
  } catch (const Error& e) {
    fail("rank ", rank, ": fabric: no transport report from rank 0: ", e.what());
  }
  const std::vector<char> v = store.get("fabric/report");
  return fabric_report_from_json(nlohmann::json::parse(std::string(v.begin(), v.end())));
}


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

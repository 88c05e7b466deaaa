// The transport report: every rank's TransportSummary (what its NCCL log says),
// gathered on rank 0 through the rendezvous store and handed back to every rank
// (netcheck/probe.h does the gathering), plus the NCCL variables the profile set or
// kept. This file is the report as data: JSON both ways, the log lines, and the
// fabric.expect_transport check; it runs nothing, so the HTML report reads it too. Printed at start, written to
// metrics.jsonl as {"transport_report": {...}}, and checked against
// fabric.expect_transport before the first step.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fabric/nccl_log.h"
#include "fabric/profile.h"

namespace st {

struct FabricReport {
  std::string transport = "auto";        // fabric.transport asked for
  std::vector<EnvDecision> env;          // rank 0's decisions
  std::string log_dir;
  std::vector<TransportSummary> ranks;   // index = world rank
};

nlohmann::json to_json(const TransportSummary& s);
TransportSummary transport_summary_from_json(const nlohmann::json& j);
nlohmann::json to_json(const FabricReport& r);
FabricReport fabric_report_from_json(const nlohmann::json& j);

// The report as lines for the log (no trailing newlines).
std::vector<std::string> format_transport_report(const FabricReport& r);

struct ExpectCheck {
  bool ok = true;
  std::string message;             // the failure ("" when ok)
  std::vector<std::string> notes;  // e.g. "no peer paths exist (world of 1)"
};

// fabric.expect_transport against the report:
//   efa | ib | socket  every inter-node path is NET over that network; with no
//                      inter-node path (one node, one GPU) the network NCCL
//                      initialised ("Using network X") is checked instead
//   nvlink             every intra-node path is P2P
//   shm                every intra-node path is SHM
// A rank whose log holds no transport line at all fails the check. "" passes.
ExpectCheck check_expected_transport(const FabricReport& r, const std::string& expect);

// check_expected_transport, throwing st::Error with its message on failure.
void require_expected_transport(const FabricReport& r, const std::string& expect);

}  // namespace st

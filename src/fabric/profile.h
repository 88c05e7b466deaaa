// NCCL environment profiles: which network NCCL may use, where it logs, and what it
// logs, decided before NCCL's first call (it reads its variables once, then).
//
//   transport  what is forced                                  why
//   efa        FI_PROVIDER=efa, NCCL_NET_PLUGIN=ofi,            the AWS OFI plugin (libnccl-net-ofi.so) on
//              NCCL_NET="AWS Libfabric"                         the EFA provider; NCCL_NET makes NCCL fail
//                                                               rather than fall back to sockets
//   ib         NCCL_NET=IB                                      NCCL's verbs transport, or fail
//   socket     NCCL_NET=Socket                                  TCP sockets (the fallback, asked for)
//   auto       nothing                                          NCCL's own choice (reported, not forced)
// Always: NCCL_SOCKET_IFNAME (when fabric.socket_ifname is set), NCCL_DEBUG=INFO,
// NCCL_DEBUG_SUBSYS=INIT,NET (every "Channel .. via .." line is logged under INIT,
// so INIT covers P2P and SHM paths too) and NCCL_DEBUG_FILE=<log_dir>/rank<R>.log.
//
// NCCL_NET is matched case-insensitively against the plugin's name. aws-ofi-nccl
// called itself "AWS Libfabric" up to 1.11 and "Libfabric" since, but renames
// itself back to "AWS Libfabric" when NCCL_NET says so, so that value selects the
// plugin with every version.
//
// A variable the user already set is never overwritten: it is kept and reported
// as such.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "config/options.h"  // FabricOptions, fabric_transports()

namespace st {

struct EnvDecision {
  std::string name, value;
  bool from_profile = true;  // false: the user's own value, kept
  std::string source() const { return from_profile ? "set by profile" : "kept from environment"; }
};

struct FabricEnvPlan {
  std::vector<EnvDecision> vars;  // in the order they were decided
  std::string log_dir;            // where the NCCL logs go (created by apply_fabric_env)
  // The NCCL_DEBUG_FILE value in effect (the profile's or the user's; it may hold
  // %h and %p), empty when NCCL logs to stdout.
  std::string debug_file;
  const EnvDecision* find(const std::string& name) const;
};

// The pure part: what the profile sets, given the environment `env`. `rank` names
// the per-rank log file; `out_dir` is run.out_dir (log_dir defaults under it).
// st::Error for an unknown transport.
FabricEnvPlan plan_fabric_env(const FabricOptions& opts, int rank, const std::map<std::string, std::string>& env,
                              const std::string& out_dir);

// plan_fabric_env on the process environment, then setenv of every variable the
// profile sets, and the log directory created. Call before NCCL's first call.
FabricEnvPlan apply_fabric_env(const FabricOptions& opts, int rank, const std::string& out_dir);

// NCCL's expansion of NCCL_DEBUG_FILE: %h the host name, %p the pid, %% a percent.
std::string expand_debug_file(const std::string& pattern, const std::string& host, long pid);

}  // namespace st

#include "fabric/profile.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "core/environ.h"

namespace st {

const EnvDecision* FabricEnvPlan::find(const std::string& name) const {
  for (const EnvDecision& d : vars)
    if (d.name == name) return &d;
  return nullptr;
}

FabricEnvPlan plan_fabric_env(const FabricOptions& opts, int rank, const std::map<std::string, std::string>& env,
                              const std::string& out_dir) {
  const auto& ts = fabric_transports();
  ST_CHECK(std::find(ts.begin(), ts.end(), opts.transport) != ts.end(), "fabric.transport must be one of auto, efa, ib, socket, got '",
           opts.transport, "'");
  FabricEnvPlan plan;
  plan.log_dir = opts.log_dir.empty() ? (out_dir.empty() ? std::string("nccl") : out_dir + "/nccl") : opts.log_dir;

  // The user's value wins; an empty one counts as set (NCCL treats it as unset, and
  // so does the user who exported it on purpose).
  auto decide = [&](const std::string& name, const std::string& value) {
    auto it = env.find(name);
    if (it != env.end())
      plan.vars.push_back({name, it->second, false});
    else
      plan.vars.push_back({name, value, true});
  };

  if (opts.transport == "efa") {
    decide("FI_PROVIDER", "efa");
    decide("NCCL_NET_PLUGIN", "ofi");  // NCCL 2.28 opens "ofi" as libnccl-net-ofi.so
    decide("NCCL_NET", "AWS Libfabric");
  } else if (opts.transport == "ib") {
    decide("NCCL_NET", "IB");
  } else if (opts.transport == "socket") {
    decide("NCCL_NET", "Socket");
  }
  if (!opts.socket_ifname.empty()) decide("NCCL_SOCKET_IFNAME", opts.socket_ifname);
  decide("NCCL_DEBUG", "INFO");
  decide("NCCL_DEBUG_SUBSYS", "INIT,NET");
  decide("NCCL_DEBUG_FILE", plan.log_dir + "/rank" + std::to_string(rank) + ".log");
  plan.debug_file = plan.find("NCCL_DEBUG_FILE")->value;
  return plan;
}

FabricEnvPlan apply_fabric_env(const FabricOptions& opts, int rank, const std::string& out_dir) {
  FabricEnvPlan plan = plan_fabric_env(opts, rank, environ_map(), out_dir);
  for (const EnvDecision& d : plan.vars)
    if (d.from_profile) ::setenv(d.name.c_str(), d.value.c_str(), 0);
  // NCCL opens the file itself and silently logs to stdout when it cannot, so the
  // directory (the profile's, or that of the user's file) must exist first.
  const std::filesystem::path dir =
      plan.find("NCCL_DEBUG_FILE")->from_profile ? std::filesystem::path(plan.log_dir)
                                                 : std::filesystem::path(plan.debug_file).parent_path();
  if (!dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    ST_CHECK(!ec, "fabric.log_dir: cannot create '", dir.string(), "' for the NCCL logs: ", ec.message());
  }
  return plan;
}

std::string expand_debug_file(const std::string& pattern, const std::string& host, long pid) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    const char c = pattern[++i];
    if (c == '%')
      out += '%';
    else if (c == 'h')
      out += host;
    else if (c == 'p')
      out += std::to_string(pid);
    else
      out += std::string("%") + c;  // NCCL echoes what it does not know
  }
  return out;
}

}  // namespace st

// `deploy verify` (the recipe's step 7): what the cluster reports, against what the
// cluster file asks for. From `kubectl get nodes|pods|daemonsets -o json`:
//   per node        the Ready condition and no unreachable / not-ready taint
//   per GPU node    the GPU label, the zone, allocatable nvidia.com/gpu and
//                   vpc.amazonaws.com/efa against the instance facts, and the device
//                   plugins' pods Ready on it
//   per plugin      exactly one DaemonSet runs it (eksctl's and a Helm release's
//                   would both advertise the same devices)
//   per worker pod  requests == limits, the requested nvidia.com/gpu and
//                   vpc.amazonaws.com/efa as planned, status.qosClass Guaranteed, one per node,
//                   all in the GPU zone (only once the workload runs)
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "deploy/cluster_file.h"

namespace st {

struct Check {
  std::string subject;  // "node ip-10-0-1-2...", "pod shardtrain/qwen-train-0-abcde", "plugin nvidia"
  std::string what;     // "allocatable vpc.amazonaws.com/efa"
  bool ok = true;
  std::string detail;   // "1", or "0, want 1"
};

struct ClusterState {
  nlohmann::json nodes, pods, daemonsets;  // the List objects kubectl prints with -o json
};

std::vector<Check> verify_cluster(const ClusterSpec& spec, const ClusterState& state);

// A worker pod of the workload (namespace and instance label; not the Ray head), and
// its own checks: requests == limits, the GPUs and EFA devices it asks for against
// the plan, its QoS class. Apply and submit run them as soon as the pods exist.
bool is_worker_pod(const ClusterSpec& spec, const nlohmann::json& pod);
std::vector<Check> worker_pod_checks(const ClusterSpec& spec, const nlohmann::json& pod);

// The checks as a table (one line each, failures marked), and as JSON.
std::string format_checks(const std::vector<Check>& checks);
nlohmann::json checks_json(const std::vector<Check>& checks);

}  // namespace st

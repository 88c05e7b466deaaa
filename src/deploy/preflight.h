// Offline checks of a cluster file before anything is created: each refusal names
// the key and says why (EFA does not cross zones or VPCs, Guaranteed pods need
// requests equal to limits, ...). Notes are things worth knowing that do not stop
// the plan (instance availability varies by region and zone).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "deploy/cluster_file.h"

namespace st {

struct Finding {
  bool refusal = true;    // false: a note
  std::string key;        // the cluster file key it is about ("" for the whole file)
  std::string message;
};

struct PreflightOptions {
  std::optional<long> vcpu_quota;  // --vcpu-quota: the on-demand vCPU quota of the GPU family
};

std::vector<Finding> preflight(const ClusterSpec& spec, const PreflightOptions& options);

// The EKS kubelet's allocatable on a node of this type (the AL2023 AMI's reservation
// formula: CPU by cores, memory 255 MiB + 11 MiB per pod + 100 MiB eviction).
struct Allocatable {
  double cpu = 0;          // cores
  double memory_gib = 0;
};
Allocatable eks_allocatable(const InstanceFacts& f);

}  // namespace st

// Facts about the EC2 instance types a cluster file may name, built in so that
// `deploy plan` works offline: sizes, GPUs, EFA interfaces, network, and the vCPU
// quota that on-demand capacity draws from. Sources: docs/instance_facts.md.
#pragma once
#include <string>
#include <vector>

namespace st {

struct InstanceFacts {
  std::string type;             // "g6.12xlarge"
  int vcpus = 0;
  double memory_gib = 0;
  int gpus = 0;                 // 0: a CPU instance
  std::string gpu_model;        // "NVIDIA L4"; "" without GPUs
  double gpu_memory_gib = 0;    // per GPU, as the EC2 API gives it (docs/instance_facts.md note 1)
  double gpu_usable_gib = 0;    // per GPU, what a process sees (nvidia-smi's memory.total, to 0.5 GiB):
                                // what `deploy plan` checks a rank's planned memory against
  int efa_interfaces = 0;       // EFA-capable network interfaces (0: no EFA)
  bool efa_rdma = false;        // GPUDirect RDMA over EFA (FI_EFA_USE_DEVICE_RDMA=1 applies)
  double network_gbps = 0;      // the instance's network bandwidth ("up to" figures as given)
  std::string quota_name;       // "Running On-Demand G and VT instances"
  std::string quota_code;       // Service Quotas code: L-DB2E81BA (G and VT), L-417A185B (P), L-1216C47A (Standard)
  int max_pods = 0;             // EKS max pods per node with the VPC CNI defaults
};

// The built-in table, in a stable order.
const std::vector<InstanceFacts>& instance_table();

// The facts for `type`, or null when it is not in the table.
const InstanceFacts* find_instance(const std::string& type);

}  // namespace st

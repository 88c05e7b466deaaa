// The built-in EC2 instance table behind `deploy plan`. Every figure, and where it comes from, is listed in
// docs/instance_facts.md; change the two together.
#include "deploy/instances.h"

namespace st {
namespace {

// The Service Quotas (service code "ec2") on-demand vCPU quota each family draws from.
constexpr const char* kQuotaGName = "Running On-Demand G and VT instances";
constexpr const char* kQuotaGCode = "L-DB2E81BA";
constexpr const char* kQuotaPName = "Running On-Demand P instances";
constexpr const char* kQuotaPCode = "L-417A185B";
constexpr const char* kQuotaStdName = "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances";
constexpr const char* kQuotaStdCode = "L-1216C47A";

std::vector<InstanceFacts> build_table() {
  return {
      // The rows `deploy plan` was written against, in their documented order.
      {.type = "g6.12xlarge", .vcpus = 48, .memory_gib = 192,
       .gpus = 4, .gpu_model = "NVIDIA L4", .gpu_memory_gib = 24, .gpu_usable_gib = 22.5,
       .efa_interfaces = 1, .efa_rdma = false, .network_gbps = 40,
       .quota_name = kQuotaGName, .quota_code = kQuotaGCode, .max_pods = 234},
      {.type = "g6e.12xlarge", .vcpus = 48, .memory_gib = 384,
       .gpus = 4, .gpu_model = "NVIDIA L40S", .gpu_memory_gib = 48, .gpu_usable_gib = 45,
       .efa_interfaces = 1, .efa_rdma = false, .network_gbps = 100,
       .quota_name = kQuotaGName, .quota_code = kQuotaGCode, .max_pods = 292},
      {.type = "g5.12xlarge", .vcpus = 48, .memory_gib = 192,
       .gpus = 4, .gpu_model = "NVIDIA A10G", .gpu_memory_gib = 24, .gpu_usable_gib = 22.5,
       .efa_interfaces = 1, .efa_rdma = false, .network_gbps = 40,
       .quota_name = kQuotaGName, .quota_code = kQuotaGCode, .max_pods = 737},
      {.type = "p4d.24xlarge", .vcpus = 96, .memory_gib = 1152,
       .gpus = 8, .gpu_model = "NVIDIA A100", .gpu_memory_gib = 40, .gpu_usable_gib = 40,
       .efa_interfaces = 4, .efa_rdma = true, .network_gbps = 400,
       .quota_name = kQuotaPName, .quota_code = kQuotaPCode, .max_pods = 737},
      {.type = "p5.48xlarge", .vcpus = 192, .memory_gib = 2048,
       .gpus = 8, .gpu_model = "NVIDIA H100", .gpu_memory_gib = 80, .gpu_usable_gib = 79.5,
       .efa_interfaces = 32, .efa_rdma = true, .network_gbps = 3200,
       .quota_name = kQuotaPName, .quota_code = kQuotaPCode, .max_pods = 100},
      {.type = "p5en.48xlarge", .vcpus = 192, .memory_gib = 2048,
       .gpus = 8, .gpu_model = "NVIDIA H200", .gpu_memory_gib = 141, .gpu_usable_gib = 139,
       .efa_interfaces = 16, .efa_rdma = true, .network_gbps = 3200,
       .quota_name = kQuotaPName, .quota_code = kQuotaPCode, .max_pods = 198},
      {.type = "m7i.xlarge", .vcpus = 4, .memory_gib = 16,
       .gpus = 0, .gpu_model = "", .gpu_memory_gib = 0, .gpu_usable_gib = 0,
       .efa_interfaces = 0, .efa_rdma = false, .network_gbps = 12.5,  // "up to"
       .quota_name = kQuotaStdName, .quota_code = kQuotaStdCode, .max_pods = 58},

      // Larger sizes of the same families.
      {.type = "g6.48xlarge", .vcpus = 192, .memory_gib = 768,
       .gpus = 8, .gpu_model = "NVIDIA L4", .gpu_memory_gib = 24, .gpu_usable_gib = 22.5,
       .efa_interfaces = 1, .efa_rdma = false, .network_gbps = 100,
       .quota_name = kQuotaGName, .quota_code = kQuotaGCode, .max_pods = 737},
      {.type = "g6e.48xlarge", .vcpus = 192, .memory_gib = 1536,
       .gpus = 8, .gpu_model = "NVIDIA L40S", .gpu_memory_gib = 48, .gpu_usable_gib = 45,
       .efa_interfaces = 4, .efa_rdma = false, .network_gbps = 400,
       .quota_name = kQuotaGName, .quota_code = kQuotaGCode, .max_pods = 492},
      {.type = "p5e.48xlarge", .vcpus = 192, .memory_gib = 2048,
       .gpus = 8, .gpu_model = "NVIDIA H200", .gpu_memory_gib = 141, .gpu_usable_gib = 139,
       .efa_interfaces = 32, .efa_rdma = true, .network_gbps = 3200,
       .quota_name = kQuotaPName, .quota_code = kQuotaPCode, .max_pods = 100},
      {.type = "m7i.2xlarge", .vcpus = 8, .memory_gib = 32,
       .gpus = 0, .gpu_model = "", .gpu_memory_gib = 0, .gpu_usable_gib = 0,
       .efa_interfaces = 0, .efa_rdma = false, .network_gbps = 12.5,  // "up to"
       .quota_name = kQuotaStdName, .quota_code = kQuotaStdCode, .max_pods = 58},
  };
}

}  // namespace

const std::vector<InstanceFacts>& instance_table() {
  static const std::vector<InstanceFacts> table = build_table();
  return table;
}

const InstanceFacts* find_instance(const std::string& type) {
  for (const InstanceFacts& f : instance_table())
    if (f.type == type) return &f;
  return nullptr;
}

}  // namespace st

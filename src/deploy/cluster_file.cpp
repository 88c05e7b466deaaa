#include "deploy/cluster_file.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <toml++/toml.h>

#include "config/schema.h"
#include "core/error.h"
#include "config/toml_text.h"

namespace st {
namespace {

namespace fs = std::filesystem;

// The file's keys, bound to `spec`: one schema (config/schema.h) as the run
// configuration has, so both files are read and refused alike.
void node_group_keys(std::vector<Key>& keys, const std::string& sec, NodeGroupSpec& g) {
  keys.push_back({sec + ".name", &g.name, "eksctl node group name"});
  keys.push_back({sec + ".instance_type", &g.instance_type, "EC2 instance type"});
  keys.push_back({sec + ".count", &g.count, "nodes", closed(1, 1000)});
  keys.push_back({sec + ".zones", &g.zones, "availability zones (empty: the cluster's)"});
  keys.push_back({sec + ".efa", &g.efa, "attach EFA interfaces"});
  keys.push_back({sec + ".capacity", &g.capacity, "on-demand or a capacity reservation", {}, {"on-demand", "reservation"}});
  keys.push_back({sec + ".capacity_reservation_id", &g.capacity_reservation_id, "cr-... (capacity = reservation)"});
  keys.push_back({sec + ".volume_gib", &g.volume_gib, "root volume size", closed(20, 16384)});
  keys.push_back({sec + ".labels", &g.labels, "extra node labels"});
  if (sec == "nodes.gpu") keys.push_back({sec + ".placement_group", &g.placement_group, "cluster placement group"});
}

// [nodes.gpu.facts]: a type the built-in table does not have, described by the file.
void facts_keys(std::vector<Key>& keys, InstanceFacts& f) {
  const std::string sec = "nodes.gpu.facts";
  keys.push_back({sec + ".vcpus", &f.vcpus, "vCPUs of the instance type", closed(1, 4096)});
  keys.push_back({sec + ".memory_gib", &f.memory_gib, "memory (GiB)", closed(1, 1 << 20)});
  keys.push_back({sec + ".gpus", &f.gpus, "GPUs", closed(1, 64)});
  keys.push_back({sec + ".gpu_model", &f.gpu_model, "GPU model"});
  keys.push_back({sec + ".gpu_memory_gib", &f.gpu_memory_gib, "memory per GPU (GiB)", closed(0, 4096)});
  keys.push_back({sec + ".gpu_usable_gib", &f.gpu_usable_gib,
                  "memory per GPU a process sees (nvidia-smi memory.total, GiB); 0 = 15/16 of gpu_memory_gib",
                  closed(0, 4096)});
  keys.push_back({sec + ".efa_interfaces", &f.efa_interfaces, "EFA interfaces (0: none)", closed(0, 64)});
  keys.push_back({sec + ".efa_rdma", &f.efa_rdma, "GPUDirect RDMA over EFA"});
  keys.push_back({sec + ".network_gbps", &f.network_gbps, "network bandwidth (Gbps)", closed(0, 100000)});
  keys.push_back({sec + ".max_pods", &f.max_pods, "EKS max pods per node (VPC CNI defaults)", closed(1, 1000)});
  keys.push_back({sec + ".quota_code", &f.quota_code, "Service Quotas code of its on-demand vCPU quota"});
  keys.push_back({sec + ".quota_name", &f.quota_name, "that quota's name"});
}

std::vector<Key> cluster_file_keys(ClusterSpec& spec, InstanceFacts& gpu_facts) {
  std::vector<Key> k = {
      {"cluster.name", &spec.name, "EKS cluster name"},
      {"cluster.region", &spec.region, "AWS region"},
      {"cluster.kubernetes_version", &spec.kubernetes_version, "EKS Kubernetes version"},
      {"cluster.zones", &spec.zones, "the control plane's zones"},
      {"cluster.vpc.create", &spec.create_vpc, "create a VPC (false: use vpc.id)"},
      {"cluster.vpc.id", &spec.vpc_id, "an existing VPC"},
      {"cluster.vpc.private_subnets", &spec.private_subnets, "zone -> subnet id (existing VPC)"},
      {"cluster.vpc.cidr", &spec.vpc_cidr, "the new VPC's CIDR"},
      {"cluster.vpc.nat", &spec.nat, "NAT gateways", {}, {"Single", "HighlyAvailable"}},
  };
  node_group_keys(k, "nodes.system", spec.system);
  node_group_keys(k, "nodes.gpu", spec.gpu);
  facts_keys(k, gpu_facts);
  const std::vector<Key> rest = {
      {"image.repository", &spec.image_repository, "container image repository"},
      {"image.digest", &spec.image_digest, "sha256:... the image is pinned to"},
      {"image.tag", &spec.image_tag, "tag (unpinned images only)"},
      {"image.base", &spec.base_image, "the Dockerfile's FROM"},
      {"image.allow_unpinned", &spec.allow_unpinned, "allow an image without a digest"},
      {"image.efa_installer_sha256", &spec.efa_installer_sha256, "SHA-256 of the EFA installer tarball"},
      {"workload.engine", &spec.engine, "Kubernetes workload", {}, {"job", "kuberay", "pytorchjob"}},
      {"workload.namespace", &spec.namespace_, "namespace"},
      {"workload.name", &spec.job_name, "job name"},
      {"workload.master_port", &spec.master_port, "rendezvous port", closed(1, 65535)},
      {"workload.ray_version", &spec.ray_version, "Ray version (kuberay)"},
      {"workload.backoff_limit", &spec.backoff_limit, "Job restarts of a failed pod", closed(0, 100)},
      {"workload.checkpoint_claim", &spec.checkpoint_claim, "PersistentVolumeClaim for checkpoints"},
      {"workload.resources.gpus", &spec.pod_gpus, "GPUs per worker pod", closed(1, 64)},
      {"workload.resources.efa", &spec.pod_efa, "EFA devices per worker pod", closed(0, 64)},
      {"workload.resources.cpu", &spec.pod_cpu, "CPUs per worker pod", closed(1, 1024)},
      {"workload.resources.memory_gib", &spec.pod_memory_gib, "memory per worker pod", closed(1, 65536)},
      {"workload.resources.shm_gib", &spec.shm_gib, "/dev/shm per worker pod", closed(1, 4096)},
      {"helm.charts_dir", &spec.charts_dir, "install charts from local .tgz files"},
      {"train.config", &spec.train_config, "run config TOML"},
      {"train.set", &spec.train_set, "run-config keys and values"},
      {"train.expect_transport", &spec.expect_transport, "transport every rank must see", {},
       fabric_expect_transports()},
      {"fabric.transport", &spec.transport, "fabric.transport of every rank", {}, fabric_transports()},
      {"fabric.socket_ifname", &spec.socket_ifname, "NCCL_SOCKET_IFNAME"},
      {"fabric.env", &spec.env, "more variables for every worker"},
  };
  k.insert(k.end(), rest.begin(), rest.end());
  return k;
}

std::string instance_list() {
  std::vector<std::string> types;
  for (const InstanceFacts& f : instance_table()) types.push_back(f.type);
  return join(types, ", ");
}

}  // namespace

std::string ClusterSpec::image() const {
  if (!image_digest.empty()) return image_repository + "@" + image_digest;
  return image_repository + ":" + (image_tag.empty() ? std::string("latest") : image_tag);
}

void derive_pod_resources(ClusterSpec& spec) {
  const InstanceFacts* f = spec.gpu.facts;
  if (!f) return;
  if (spec.pod_gpus == 0) spec.pod_gpus = f->gpus;
  if (spec.pod_efa < 0) spec.pod_efa = spec.gpu.efa ? f->efa_interfaces : 0;
  if (spec.pod_cpu == 0) spec.pod_cpu = f->vcpus - std::max(4, f->vcpus / 6);
  if (spec.pod_memory_gib == 0) {
    const int mem = static_cast<int>(std::floor(f->memory_gib));
    spec.pod_memory_gib = mem - std::max(8, mem / 6);
  }
  // NCCL's shared-memory transport and the data loader live in /dev/shm: a quarter of
  // the pod's memory, at most 64 GiB (the 64 MiB container default breaks NCCL).
  if (spec.shm_gib == 0) spec.shm_gib = std::clamp(spec.pod_memory_gib / 4, 1, 64);
}

static ClusterSpec load_cluster_file_unclassified(const std::string& path);

ClusterSpec load_cluster_file(const std::string& path) {
  // Everything wrong with the cluster file or the run config it names is a
  // configuration error (exit 2).
  return classify_errors(ErrorKind::Usage, [&] { return load_cluster_file_unclassified(path); });
}

static ClusterSpec load_cluster_file_unclassified(const std::string& path) {
  ClusterSpec spec;
  spec.path = path;
  spec.dir = fs::path(path).parent_path().string();
  spec.system.name = "system";
  spec.system.instance_type = "m7i.xlarge";
  spec.gpu.name = "gpu";

  toml::table root = parse_toml_file(path, "the cluster file");

  InstanceFacts gpu_facts;
  Schema schema(cluster_file_keys(spec, gpu_facts));
  schema.read_toml(root, path);
  schema.check();
  bool facts_given = false;
  for (const Key& k : schema.keys()) facts_given |= k.name.rfind("nodes.gpu.facts.", 0) == 0 && schema.was_set(k.name);

  // What must be there, and names Kubernetes and AWS accept.
  auto need = [&](const std::string& v, const char* key) {
    if (v.empty()) fail(path, ": ", key, " must be set");
  };
  need(spec.name, "cluster.name");
  need(spec.region, "cluster.region");
  need(spec.gpu.instance_type, "nodes.gpu.instance_type");
  need(spec.image_repository, "image.repository");
  auto dns_label = [&](const std::string& v, const char* key, size_t max) {
    const bool ok = !v.empty() && v.size() <= max && std::isalnum(static_cast<unsigned char>(v.front())) &&
                    std::isalnum(static_cast<unsigned char>(v.back())) &&
                    std::all_of(v.begin(), v.end(), [](char c) {
                      return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
                    });
    if (!ok)
      fail(path, ": ", key, " = '", v, "' must be lower-case letters, digits and '-', starting and ending with a ",
           "letter or digit, at most ", max, " characters (a Kubernetes name)");
  };
  dns_label(spec.name, "cluster.name", 100);
  dns_label(spec.namespace_, "workload.namespace", 63);
  // The Job's pods are "<name>-<index>" and their hostnames must stay DNS labels.
  dns_label(spec.job_name, "workload.name", 50);
  for (NodeGroupSpec* g : {&spec.system, &spec.gpu}) {
    const std::string sec = g == &spec.system ? "nodes.system" : "nodes.gpu";
    g->facts = find_instance(g->instance_type);
    if (g == &spec.gpu && facts_given) {
      if (g->facts)
        fail(path, ": [nodes.gpu.facts] is for a type outside the built-in instance table, but '", g->instance_type,
             "' is in it: remove the table (docs/instance_facts.md lists the built-in facts)");
      for (const char* key : {"vcpus", "memory_gib", "gpus", "max_pods"})
        if (!schema.was_set(std::string("nodes.gpu.facts.") + key))
          fail(path, ": nodes.gpu.facts.", key, " must be set (", g->instance_type, " is not in the built-in table)");
      gpu_facts.type = g->instance_type;
      // The on-demand vCPU quota the family draws from, where it is one of these.
      const char family = g->instance_type.empty() ? ' ' : g->instance_type.front();
      if (gpu_facts.quota_code.empty() && (family == 'g' || family == 'p')) {
        gpu_facts.quota_code = family == 'g' ? "L-DB2E81BA" : "L-417A185B";
        gpu_facts.quota_name = family == 'g' ? "Running On-Demand G and VT instances" : "Running On-Demand P instances";
      }
      if (gpu_facts.quota_code.empty())
        fail(path, ": nodes.gpu.facts.quota_code must be set for ", g->instance_type,
             " (the Service Quotas code of the on-demand vCPU quota it draws from)");
      if (gpu_facts.quota_name.empty()) gpu_facts.quota_name = gpu_facts.quota_code;
      if (gpu_facts.gpu_model.empty()) gpu_facts.gpu_model = "GPU";
      // A card's usable memory is below its label: 15/16 is an L4's or an A10G's
      // (24 GB, 22.5 GiB), the lowest ratio of the built-in rows.
      if (gpu_facts.gpu_usable_gib == 0) {
        gpu_facts.gpu_usable_gib = gpu_facts.gpu_memory_gib * 15 / 16;
        g->gpu_usable_derived = true;
      }
      g->own_facts = std::make_shared<const InstanceFacts>(gpu_facts);
      g->facts = g->own_facts.get();
    }
    if (!g->facts)
      fail(path, ": ", sec, ".instance_type = '", g->instance_type, "' is not in the built-in instance table (",
           instance_list(), "); describe it in [nodes.gpu.facts] (docs/deploy.md) or add it to the table "
           "(docs/instance_facts.md)");
    dns_label(g->name, (sec + ".name").c_str(), 63);
  }
  if (spec.gpu.placement_group.empty()) spec.gpu.placement_group = spec.name + "-gpu";
  if (spec.gpu.facts->gpus == 0)
    fail(path, ": nodes.gpu.instance_type = '", spec.gpu.instance_type, "' has no GPUs");

  // The run configuration the ranks will train with, checked now: its errors name
  // the cluster file's keys.
  std::string run_toml;
  if (!spec.train_config.empty()) {
    const fs::path p = fs::path(spec.train_config).is_absolute() ? fs::path(spec.train_config)
                                                                   : fs::path(spec.dir) / spec.train_config;
    run_toml = p.lexically_normal().string();
    if (!fs::exists(run_toml)) fail(path, ": train.config = '", spec.train_config, "': ", run_toml, " does not exist");
  }
  try {
    spec.run = load_run_config(run_toml, spec.train_set);
  } catch (const Error& e) {
    fail(path, ": [train] (train.config and train.set): ", e.what());
  }
  // The pods train on their GPUs, unless [train.set] says otherwise (a CPU test cluster).
  bool device_set = false;
  for (const auto& [k, v] : spec.train_set) device_set |= k == "train.device" || k == "--train.device";
  if (!device_set) spec.run.train.device = "cuda";
  spec.run.fabric.transport = spec.transport;
  spec.run.fabric.socket_ifname = spec.socket_ifname;
  spec.run.fabric.expect_transport = spec.expect_transport;
  if (!spec.charts_dir.empty() && fs::path(spec.charts_dir).is_relative())
    spec.charts_dir = (fs::path(spec.dir) / spec.charts_dir).lexically_normal().string();
  // Checkpoints on a claim every pod mounts: a pod the Job starts again resumes there.
  if (!spec.checkpoint_claim.empty()) {
    spec.run.run.checkpoint_dir = "/checkpoints/" + spec.job_name;
    spec.run.run.resume = "auto";
  }
  derive_pod_resources(spec);
  return spec;
}

}  // namespace st

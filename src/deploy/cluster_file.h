// The cluster file: one TOML file that says where and how a training job runs on
// Amazon EKS (the recipe's env.sh): the cluster, its node groups, the container
// image, the Kubernetes workload, the shardtrain run configuration and the fabric.
// Every key is known; an unknown key, a wrong type or a bad value is an st::Error
// naming the file, the key and the line. configs/deploy/eks-g6-efa.toml is the
// recipe; docs/deploy.md explains every key.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "deploy/instances.h"
#include "config/run_config.h"

namespace st {

struct NodeGroupSpec {
  std::string name;                           // eksctl node group name
  std::string instance_type;
  int count = 1;
  std::vector<std::string> zones;             // empty: the cluster's zones
  bool efa = false;                           // EFA interfaces attached (GPU group)
  std::string capacity = "on-demand";         // on-demand | reservation
  std::string capacity_reservation_id;        // cr-...: with capacity = "reservation"
  int volume_gib = 100;
  std::string placement_group;                // cluster placement group (GPU group; "" = "<cluster>-gpu")
  std::map<std::string, std::string> labels;  // extra node labels
  const InstanceFacts* facts = nullptr;       // from the built-in table, or `own_facts`
  // [nodes.gpu.facts]: the facts of a type outside the built-in table, as the file
  // gives them (shared, so that `facts` stays valid when the spec is copied).
  std::shared_ptr<const InstanceFacts> own_facts;
  bool gpu_usable_derived = false;            // own_facts without gpu_usable_gib: 15/16 of gpu_memory_gib
};

struct ClusterSpec {
  std::string path;         // the cluster file, as given
  std::string dir;          // its directory: relative paths inside it start here

  // [cluster]
  std::string name, region, kubernetes_version = "1.35";
  std::vector<std::string> zones;             // the control plane's zones (EKS needs two)
  // [cluster.vpc]
  bool create_vpc = true;                     // false: an existing VPC
  std::string vpc_id;
  std::map<std::string, std::string> private_subnets;  // zone -> subnet id (existing VPC)
  std::string vpc_cidr = "10.42.0.0/16";
  std::string nat = "Single";                 // eksctl NAT gateway: Single | HighlyAvailable

  NodeGroupSpec system, gpu;                  // [nodes.system], [nodes.gpu]

  // [image]
  std::string image_repository, image_digest, image_tag;
  std::string base_image;                     // the Dockerfile's FROM (repository[:tag]@sha256:...)
  bool allow_unpinned = false;
  std::string efa_installer_sha256;           // the EFA installer tarball's SHA-256 (64 hex digits)

  // [workload]
  std::string engine = "job";                 // job | kuberay | pytorchjob
  std::string namespace_ = "shardtrain";
  std::string job_name = "shardtrain";
  int master_port = 29500;
  std::string ray_version = "2.49.0";
  int backoff_limit = 0;                      // Job restarts of a failed pod
  std::string checkpoint_claim;               // a PersistentVolumeClaim for checkpoints ("" = none)
  // Worker pod resources; 0 = derived from the instance (see derive_pod_resources).
  int pod_gpus = 0, pod_efa = -1, pod_cpu = 0, pod_memory_gib = 0;
  int shm_gib = 0;                            // memory-backed /dev/shm; 0 = derived

  // [helm]
  std::string charts_dir;                     // install charts from <dir>/<chart>-<version>.tgz, not their repos

  // [train]
  std::string train_config;                   // run config TOML ("" = the defaults), relative to dir
  ConfigOverrides train_set;                  // [train.set]: "section.key" = value
  std::string expect_transport = "efa";       // every rank refuses any other ("" = report only)
  RunConfig run;                              // resolved: defaults <- train_config <- train_set

  // [fabric]
  std::string transport = "efa";              // fabric.transport of every rank
  std::string socket_ifname = "eth0";
  std::map<std::string, std::string> env;     // more variables for every worker (FI_*, NCCL_*)

  // Derived.
  int world() const { return gpu.count * pod_gpus; }
  std::string image() const;                  // repository@digest, or repository:tag when unpinned
};

// Reads and checks a cluster file (types, choices, the instance types it names,
// and the run configuration it points to); semantic refusals (EFA across zones, too
// little quota, ...) are preflight's (deploy/preflight.h), so that `plan` can list
// all of them at once.
ClusterSpec load_cluster_file(const std::string& path);

// The worker pod's resources from the instance, where the file does not set them:
// every GPU, every EFA interface, and CPU and memory with a sixth (at least 4 vCPU
// and 8 GiB) left to the kubelet, the system daemons and the device plugins:
// g6.12xlarge (48 vCPU, 192 GiB) -> 40 CPU, 160 GiB, as the recipe asks.
void derive_pod_resources(ClusterSpec& spec);

}  // namespace st

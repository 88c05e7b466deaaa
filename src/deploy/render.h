// Everything `deploy plan` writes: the eksctl ClusterConfig, Helm values for the
// device plugins (and the KubeRay operator), the workload (Namespace,
// ServiceAccount, ConfigMap holding the resolved run config, headless Service; the
// Job, RayCluster + RayJob or PyTorchJob), a Dockerfile pinned by digest, and the
// recipe's eight steps with the exact commands `deploy apply` runs.
#pragma once
#include <string>
#include <vector>

#include "deploy/cluster_file.h"
#include "deploy/yaml.h"

namespace st {

struct Artifact {
  std::string file;          // relative to the output directory, e.g. "workload.yaml"
  std::string what;          // one line for the listing
  std::vector<ojson> docs;   // YAML documents (empty for text files)
  std::string text;          // the file's content (YAML already rendered from docs)
};

struct PlanStep {
  int number = 0;
  std::string title;
  std::vector<std::vector<std::string>> commands;  // argv of each command, in order (shell_line prints one)
  std::vector<std::string> notes;
};

// Versions of what the plan installs (their charts are in docs/deploy.md).
struct Versions {
  std::string nvidia_device_plugin = "0.20.0";
  std::string efa_device_plugin = "v0.5.30";
  std::string kuberay_operator = "1.7.0";
};

std::vector<Artifact> render_artifacts(const ClusterSpec& spec);

// The steps, with artifact paths under `out_dir` as the commands will name them.
std::vector<PlanStep> plan_steps(const ClusterSpec& spec, const std::string& out_dir);

// The run's job secret (the rendezvous' SHARDTRAIN_JOB_SECRET): the Secret's name,
// "<workload.name>-job-secret", and its key. Every worker pod reads it through
// secretKeyRef; `deploy apply` / `submit` create it (deploy/submit.h).
std::string job_secret_name(const ClusterSpec& spec);
inline constexpr const char* kJobSecretKey = "SHARDTRAIN_JOB_SECRET";

// Whether the GPU node group gets a cluster placement group of ours: with EFA, unless
// the nodes come from a capacity reservation (which already has its placement).
bool uses_placement_group(const ClusterSpec& spec);

// The region's registry of EKS add-on images ("<account>.dkr.ecr.<region>.amazonaws.com"),
// or "" for a region this build does not know (the chart's default image is used).
std::string eks_registry(const std::string& region);

// The worker pod template (the one every engine uses), for checks and tests.
ojson worker_pod_spec(const ClusterSpec& spec, const std::vector<std::string>& command);

// Every container of a pod spec whose requests differ from its limits (Guaranteed
// QoS needs them equal for cpu and memory, and extended resources must be equal).
std::vector<std::string> non_guaranteed_containers(const nlohmann::json& pod_spec);

}  // namespace st

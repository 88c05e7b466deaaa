#include "deploy/render.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "deploy/tools.h"

namespace st {
namespace {

const char* kConfigDir = "/etc/shardtrain";
const char* kDriver = "/opt/shardtrain/ray_driver.py";
const char* kGpuLabel = "nvidia.com/gpu.present";
const char* kNodeGroupLabel = "eks.amazonaws.com/nodegroup";
const char* kEfaRelease = "aws-efa-k8s-device-plugin";          // our Helm release, its namespace and DaemonSet
const char* kEksctlEfaDaemonSet = "aws-efa-k8s-device-plugin";  // eksctl's copy, in kube-system

ojson labels(const ClusterSpec& s) {
  return {{"app.kubernetes.io/name", "shardtrain"}, {"app.kubernetes.io/instance", s.job_name}};
}
ojson metadata(const ClusterSpec& s, const std::string& name) {
  return {{"name", name}, {"namespace", s.namespace_}, {"labels", labels(s)}};
}

ojson gpu_tolerations() {
  return ojson::array({{{"key", "nvidia.com/gpu"}, {"operator", "Exists"}, {"effect", "NoSchedule"}},
                       {{"key", "aws.amazon.com/efa"}, {"operator", "Exists"}, {"effect", "NoSchedule"}}});
}

ojson gpu_node_selector(const ClusterSpec& s) {
  return {{kGpuLabel, "true"}, {kNodeGroupLabel, s.gpu.name}};
}

// The fabric's variables on every worker: the recipe's four, what EFA needs, then
// the file's own (they win).
ojson worker_env(const ClusterSpec& s) {
  std::vector<std::pair<std::string, std::string>> env;
  auto set = [&](const std::string& k, const std::string& v) {
    for (auto& e : env)
      if (e.first == k) {
        e.second = v;
        return;
      }
    env.emplace_back(k, v);
  };
  if (s.gpu.efa) {
    set("FI_PROVIDER", "efa");
    set("NCCL_NET_PLUGIN", "ofi");
    if (s.gpu.facts->efa_rdma) set("FI_EFA_USE_DEVICE_RDMA", "1");
  }
  if (!s.socket_ifname.empty()) set("NCCL_SOCKET_IFNAME", s.socket_ifname);
  set("NCCL_DEBUG", "INFO");
  for (const auto& [k, v] : s.env) set(k, v);
  ojson out = ojson::array();
  for (const auto& [k, v] : env) out.push_back({{"name", k}, {"value", v}});
  // The rendezvous admits only ranks that hold the run's secret: from its Secret,
  // which `deploy apply` / `submit` create with a random value (never in the plan).
  out.push_back({{"name", kJobSecretKey},
                 {"valueFrom", {{"secretKeyRef", {{"name", job_secret_name(s)}, {"key", kJobSecretKey}}}}}});
  return out;
}

std::string quantity_gi(int gib) { return std::to_string(gib) + "Gi"; }

ojson worker_resources(const ClusterSpec& s) {
  ojson r = {{"cpu", std::to_string(s.pod_cpu)}, {"memory", quantity_gi(s.pod_memory_gib)},
             {"nvidia.com/gpu", std::to_string(s.pod_gpus)}};
  if (s.pod_efa > 0) r["vpc.amazonaws.com/efa"] = std::to_string(s.pod_efa);
  return {{"requests", r}, {"limits", r}};  // equal: Guaranteed QoS
}

// The shardtrain arguments every rank runs with.
std::vector<std::string> train_args(const ClusterSpec& s) {
  std::vector<std::string> a = {"train", "--config", std::string(kConfigDir) + "/config.toml"};
  if (!s.expect_transport.empty()) a.insert(a.end(), {"--expect-transport", s.expect_transport});
  return a;
}

std::string config_map_name(const ClusterSpec& s) { return s.job_name + "-config"; }

}  // namespace

std::string job_secret_name(const ClusterSpec& s) { return s.job_name + "-job-secret"; }

bool uses_placement_group(const ClusterSpec& s) { return s.gpu.efa && s.gpu.capacity != "reservation"; }

std::string eks_registry(const std::string& region) {
  // "View Amazon container image registries for Amazon EKS add-ons" (EKS User Guide):
  // most regions share account 602401143452; these have their own.
  static const std::map<std::string, std::string> own = {
      {"af-south-1", "877085696533"},     {"ap-east-1", "800184023465"},    {"ap-southeast-3", "296578399912"},
      {"ap-south-2", "900889452093"},     {"ap-southeast-4", "491585149902"}, {"ap-southeast-6", "333609536671"},
      {"ap-southeast-7", "121268973566"}, {"cn-north-1", "918309763551"},   {"cn-northwest-1", "961992271922"},
      {"eu-south-1", "590381155156"},     {"eu-south-2", "455263428931"},   {"eu-central-2", "900612956339"},
      {"il-central-1", "066635153087"},   {"mx-central-1", "730335286997"}, {"me-south-1", "558608220178"},
      {"me-central-1", "759879836304"},   {"ca-west-1", "761377655185"},    {"us-gov-east-1", "151742754352"},
      {"us-gov-west-1", "013241004608"}};
  static const std::set<std::string> shared = {
      "ap-south-1",   "ap-northeast-1", "ap-northeast-2", "ap-northeast-3", "ap-southeast-1", "ap-southeast-2",
      "eu-central-1", "eu-west-1",      "eu-west-2",      "eu-west-3",      "eu-north-1",     "us-east-1",
      "us-east-2",    "us-west-1",      "us-west-2",      "ca-central-1",   "sa-east-1"};
  std::string account;
  if (const auto it = own.find(region); it != own.end()) account = it->second;
  else if (shared.count(region)) account = "602401143452";
  else return "";
  return account + ".dkr.ecr." + region + (region.rfind("cn-", 0) == 0 ? ".amazonaws.com.cn" : ".amazonaws.com");
}

ojson worker_pod_spec(const ClusterSpec& s, const std::vector<std::string>& command) {
  ojson container = {
      {"name", "shardtrain"},
      {"image", s.image()},
      {"imagePullPolicy", "IfNotPresent"},
      {"command", command},
      {"workingDir", "/workspace"},
      {"env", worker_env(s)},
      {"ports", ojson::array({{{"name", "rendezvous"}, {"containerPort", s.master_port}, {"protocol", "TCP"}}})},
      {"resources", worker_resources(s)},
      {"volumeMounts", ojson::array({{{"name", "config"}, {"mountPath", kConfigDir}, {"readOnly", true}},
                                     {{"name", "dshm"}, {"mountPath", "/dev/shm"}},
                                     {{"name", "workspace"}, {"mountPath", "/workspace"}}})},
  };
  ojson volumes =
      ojson::array({{{"name", "config"}, {"configMap", {{"name", config_map_name(s)}}}},
                    {{"name", "dshm"}, {"emptyDir", {{"medium", "Memory"}, {"sizeLimit", quantity_gi(s.shm_gib)}}}},
                    {{"name", "workspace"}, {"emptyDir", ojson::object()}}});
  if (!s.checkpoint_claim.empty()) {
    volumes.push_back({{"name", "checkpoints"}, {"persistentVolumeClaim", {{"claimName", s.checkpoint_claim}}}});
    container["volumeMounts"].push_back({{"name", "checkpoints"}, {"mountPath", "/checkpoints"}});
  }
  return {
      {"serviceAccountName", s.job_name},
      {"nodeSelector", gpu_node_selector(s)},
      {"tolerations", gpu_tolerations()},
      // One pod per node: it asks for every GPU anyway; this says so to the scheduler.
      {"affinity",
       {{"podAntiAffinity",
         {{"requiredDuringSchedulingIgnoredDuringExecution",
           ojson::array({{{"labelSelector", {{"matchLabels", labels(s)}}},
                          {"topologyKey", "kubernetes.io/hostname"}}})}}}}},
      {"containers", ojson::array({container})},
      {"volumes", volumes},
      // SIGTERM first: the run saves a checkpoint within run.term_grace_s; the
      // kubelet's SIGKILL comes 15 s after that.
      {"terminationGracePeriodSeconds", static_cast<int64_t>(std::ceil(s.run.run.term_grace_s)) + 15},
  };
}

std::vector<std::string> non_guaranteed_containers(const nlohmann::json& pod_spec) {
  std::vector<std::string> bad;
  for (const auto& c : pod_spec.value("containers", nlohmann::json::array())) {
    const auto r = c.value("resources", nlohmann::json::object());
    const auto req = r.value("requests", nlohmann::json::object()), lim = r.value("limits", nlohmann::json::object());
    const bool ok = lim.contains("cpu") && lim.contains("memory") && (req.empty() || req == lim);
    if (!ok) bad.push_back(c.value("name", "?"));
  }
  return bad;
}

namespace {

ojson eksctl_config(const ClusterSpec& s) {
  ojson vpc = {{"clusterEndpoints", {{"privateAccess", true}, {"publicAccess", true}}}};
  if (s.create_vpc) {
    vpc["cidr"] = s.vpc_cidr;
    vpc["nat"] = {{"gateway", s.nat}};
  } else {
    vpc["id"] = s.vpc_id;
    ojson priv = ojson::object();
    for (const auto& [zone, id] : s.private_subnets) priv[zone] = {{"id", id}};
    vpc["subnets"] = {{"private", priv}};
  }
  ojson system_labels = {{"shardtrain.io/role", "system"}};
  for (const auto& [k, v] : s.system.labels) system_labels[k] = v;
  ojson gpu_labels = {{kGpuLabel, "true"}, {"shardtrain.io/role", "gpu"}};
  for (const auto& [k, v] : s.gpu.labels) gpu_labels[k] = v;
  ojson system = {{"name", s.system.name},
                  {"instanceType", s.system.instance_type},
                  {"minSize", s.system.count},
                  {"maxSize", s.system.count},
                  {"desiredCapacity", s.system.count},
                  {"privateNetworking", true},
                  {"volumeSize", s.system.volume_gib},
                  {"labels", system_labels}};
  if (!s.system.zones.empty()) system["availabilityZones"] = s.system.zones;
  ojson gpu = {{"name", s.gpu.name},
               {"instanceType", s.gpu.instance_type},
               {"amiFamily", "AmazonLinux2023"},
               {"availabilityZones", s.gpu.zones.empty() ? s.zones : s.gpu.zones},
               {"minSize", s.gpu.count},
               {"maxSize", s.gpu.count},
               {"desiredCapacity", s.gpu.count},
               {"privateNetworking", true},
               {"efaEnabled", s.gpu.efa},
               {"volumeSize", s.gpu.volume_gib},
               {"labels", gpu_labels},
               {"taints", ojson::array({{{"key", "nvidia.com/gpu"}, {"value", "true"}, {"effect", "NoSchedule"}}})}};
  // A capacity reservation already fixes where its instances are (eksctl adds no
  // placement group of its own with one): a second group could only make the
  // reservation's instances fail to launch (InsufficientInstanceCapacity).
  if (uses_placement_group(s)) gpu["placement"] = {{"groupName", s.gpu.placement_group}};
  if (s.gpu.capacity == "reservation")
    gpu["capacityReservation"] = {
        {"capacityReservationTarget", {{"capacityReservationID", s.gpu.capacity_reservation_id}}}};
  return {{"apiVersion", "eksctl.io/v1alpha5"},
          {"kind", "ClusterConfig"},
          {"metadata", {{"name", s.name}, {"region", s.region}, {"version", s.kubernetes_version}}},
          {"availabilityZones", s.zones},
          {"vpc", vpc},
          {"iam", {{"withOIDC", true}}},
          {"addons", ojson::array({{{"name", "vpc-cni"}}, {{"name", "coredns"}}, {{"name", "kube-proxy"}}})},
          {"managedNodeGroups", ojson::array({system, gpu})}};
}

ojson nvidia_values(const ClusterSpec& s) {
  return {{"nodeSelector", {{kGpuLabel, "true"}}}, {"tolerations", gpu_tolerations()}};
}
ojson efa_values(const ClusterSpec& s) {
  ojson v = {{"nodeSelector", {{kGpuLabel, "true"}}}, {"tolerations", gpu_tolerations()}};
  // The chart's default image is in us-west-2's registry: a node elsewhere would pull
  // it across regions (or, in a region with its own EKS registry account, not at all).
  const std::string registry = eks_registry(s.region);
  if (!registry.empty()) v["image"] = {{"repository", registry + "/eks/aws-efa-k8s-device-plugin"}};
  return v;
}
ojson kuberay_values(const ClusterSpec& s) { return {{"nodeSelector", {{kNodeGroupLabel, s.system.name}}}}; }

std::vector<ojson> base_workload(const ClusterSpec& s) {
  std::vector<ojson> docs;
  docs.push_back({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", s.namespace_}, {"labels", labels(s)}}}});
  docs.push_back({{"apiVersion", "v1"}, {"kind", "ServiceAccount"}, {"metadata", metadata(s, s.job_name)}});
  docs.push_back({{"apiVersion", "v1"},
                  {"kind", "ConfigMap"},
                  {"metadata", metadata(s, config_map_name(s))},
                  {"data", {{"config.toml", run_config_toml(s.run)}}}});
  if (s.engine == "job") {
    // Headless: DNS gives each pod of the Indexed Job a name, "<job>-<i>.<service>".
    docs.push_back({{"apiVersion", "v1"},
                    {"kind", "Service"},
                    {"metadata", metadata(s, s.job_name)},
                    {"spec",
                     {{"clusterIP", "None"},
                      {"publishNotReadyAddresses", true},
                      {"selector", labels(s)},
                      {"ports", ojson::array({{{"name", "rendezvous"}, {"port", s.master_port},
                                               {"targetPort", s.master_port}, {"protocol", "TCP"}}})}}}});
  }
  return docs;
}

ojson indexed_job(const ClusterSpec& s) {
  std::vector<std::string> command = {"shardtrain", "launch", "--nproc-per-node", std::to_string(s.pod_gpus), "--"};
  for (const std::string& a : train_args(s)) command.push_back(a);
  ojson pod = worker_pod_spec(s, command);
  pod["subdomain"] = s.job_name;
  pod["restartPolicy"] = "Never";
  ojson& env = pod["containers"][0]["env"];
  ojson place = ojson::array({{{"name", "SHARDTRAIN_NNODES"}, {"value", std::to_string(s.gpu.count)}},
                              {{"name", "SHARDTRAIN_NPROC_PER_NODE"}, {"value", std::to_string(s.pod_gpus)}},
                              {{"name", "SHARDTRAIN_SERVICE"}, {"value", s.job_name}},
                              {{"name", "SHARDTRAIN_JOB_NAME"}, {"value", s.job_name}},
                              {{"name", "MASTER_PORT"}, {"value", std::to_string(s.master_port)}},
                              // The Job's UID (a label Kubernetes puts on its pods): the
                              // rendezvous refuses a pod of another Job (one deleted and
                              // submitted again) that reaches this one's rank 0.
                              {{"name", "SHARDTRAIN_JOB_ID"},
                               {"valueFrom",
                                {{"fieldRef", {{"fieldPath", "metadata.labels['batch.kubernetes.io/controller-uid']"}}}}}}});
  for (auto& e : env) place.push_back(e);
  env = place;
  return {{"apiVersion", "batch/v1"},
          {"kind", "Job"},
          {"metadata", metadata(s, s.job_name)},
          {"spec",
           {{"completionMode", "Indexed"},
            {"completions", s.gpu.count},
            {"parallelism", s.gpu.count},
            {"backoffLimit", s.backoff_limit},
            {"template", {{"metadata", {{"labels", labels(s)}}}, {"spec", pod}}}}}};
}

std::string ray_image(const ClusterSpec& s) { return s.image(); }

ojson ray_cluster(const ClusterSpec& s) {
  ojson head_container = {
      {"name", "ray-head"},
      {"image", ray_image(s)},
      // CPU only: no GPU is visible to the head, and Ray is told it has none.
      {"env", ojson::array({{{"name", "NVIDIA_VISIBLE_DEVICES"}, {"value", "void"}}})},
      {"ports", ojson::array({{{"name", "gcs"}, {"containerPort", 6379}},
                              {{"name", "dashboard"}, {"containerPort", 8265}},
                              {{"name", "client"}, {"containerPort", 10001}}})},
      {"resources", {{"requests", {{"cpu", "2"}, {"memory", "8Gi"}}}, {"limits", {{"cpu", "2"}, {"memory", "8Gi"}}}}},
  };
  ojson worker = worker_pod_spec(s, {"/bin/sh", "-c", "exec ray start --block"});
  worker["containers"][0]["name"] = "ray-worker";
  worker["containers"][0].erase("command");  // KubeRay writes the ray start command itself
  return {
      {"apiVersion", "ray.io/v1"},
      {"kind", "RayCluster"},
      {"metadata", metadata(s, s.job_name)},
      {"spec",
       {{"rayVersion", s.ray_version},
        {"headGroupSpec",
         {// The dashboard answers inside the cluster only (a ClusterIP Service).
          {"serviceType", "ClusterIP"},
          {"rayStartParams", {{"dashboard-host", "0.0.0.0"}, {"num-gpus", "0"}}},
          {"template",
           {{"spec",
             {{"serviceAccountName", s.job_name},
              {"nodeSelector", {{kNodeGroupLabel, s.system.name}}},
              {"containers", ojson::array({head_container})}}}}}}},
        {"workerGroupSpecs",
         ojson::array({{{"groupName", "gpu"},
                        {"replicas", s.gpu.count},
                        {"minReplicas", s.gpu.count},
                        {"maxReplicas", s.gpu.count},
                        // Ray's GPUs are the Kubernetes limit, as a string (a map of strings).
                        {"rayStartParams", {{"num-gpus", std::to_string(s.pod_gpus)}}},
                        {"template", {{"metadata", {{"labels", labels(s)}}}, {"spec", worker}}}}})}}}};
}

ojson ray_job(const ClusterSpec& s) {
  std::vector<std::string> entry = {"python3", kDriver, "--nnodes", std::to_string(s.gpu.count), "--nproc-per-node",
                                    std::to_string(s.pod_gpus), "--master-port", std::to_string(s.master_port),
                                    "--workdir", "/workspace", "--"};
  for (const std::string& a : train_args(s)) entry.push_back(a);
  return {{"apiVersion", "ray.io/v1"},
          {"kind", "RayJob"},
          {"metadata", metadata(s, s.job_name)},
          {"spec",
           {{"entrypoint", shell_line(entry)},
            {"clusterSelector", {{"ray.io/cluster", s.job_name}}},
            // Ray folds lines that look alike across nodes ("[repeated 2x across
            // cluster]"), numbers ignored: "[node 0] ..." and "[node 1] ..." would fold.
            {"runtimeEnvYAML", "env_vars:\n  RAY_DEDUP_LOGS: \"0\"\n"},
            {"submissionMode", "K8sJobMode"},
            {"backoffLimit", s.backoff_limit}}}};
}

ojson pytorch_job(const ClusterSpec& s) {
  // The operator sets PET_NNODES, PET_NODE_RANK, MASTER_ADDR and MASTER_PORT in each
  // pod; Kubernetes expands $(VAR) from the container's environment.
  std::vector<std::string> command = {"shardtrain",  "launch",           "--nproc-per-node", std::to_string(s.pod_gpus),
                                      "--nnodes",    "$(PET_NNODES)",    "--node-rank",      "$(PET_NODE_RANK)",
                                      "--master-addr", "$(MASTER_ADDR)", "--master-port",    "$(MASTER_PORT)",
                                      "--"};
  for (const std::string& a : train_args(s)) command.push_back(a);
  ojson pod = worker_pod_spec(s, command);
  pod["containers"][0]["name"] = "pytorch";  // the operator finds its container by this name
  // ... and its port by this one: without it the operator adds pytorchjob-port 23456
  // and takes MASTER_PORT from that, not from workload.master_port.
  pod["containers"][0]["ports"][0]["name"] = "pytorchjob-port";
  auto replica = [&](int n) {
    return ojson{{"replicas", n}, {"restartPolicy", "Never"},
                 {"template", {{"metadata", {{"labels", labels(s)}}}, {"spec", pod}}}};
  };
  ojson specs = {{"Master", replica(1)}};
  if (s.gpu.count > 1) specs["Worker"] = replica(s.gpu.count - 1);
  return {{"apiVersion", "kubeflow.org/v1"},
          {"kind", "PyTorchJob"},
          {"metadata", metadata(s, s.job_name)},
          {"spec", {{"nprocPerNode", std::to_string(s.pod_gpus)}, {"pytorchReplicaSpecs", specs}}}};
}

std::string dockerfile(const ClusterSpec& s) {
  std::string d;
  d += "# syntax=docker/dockerfile:1\n";
  d += "# The shardtrain image for cluster " + s.name + ", rendered by `shardtrain deploy plan` from " + s.path +
       ".\n";
  d += "# Build from the root of the shardtrain source tree, push, then pin the pushed digest in the cluster\n";
  d += "# file (image.digest):\n";
  d += "#   docker build -f <this file> -t " + s.image_repository + ":" +
       (s.image_tag.empty() ? std::string("<tag>") : s.image_tag) + " .\n";
  d += "# The base is pinned by digest, so a rebuild starts from the same bytes. It must be a CUDA *devel*\n";
  d += "# image (nvcc, cuBLAS, NCCL) on Debian or Ubuntu.\n";
  d += "FROM " + s.base_image + "\n\n";
  d += "ARG EFA_INSTALLER_VERSION=1.43.1\n";
  d += "ENV DEBIAN_FRONTEND=noninteractive\n";
  d += "RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl python3 python3-pip \\\n"
       "    && rm -rf /var/lib/apt/lists/*\n\n";
  if (s.gpu.efa) {
    d += "# EFA in user space: libfabric and the aws-ofi-nccl plugin that NCCL_NET_PLUGIN=ofi loads (the host\n";
    d += "# AMI has the kernel driver).\n";
    if (!s.efa_installer_sha256.empty())
      d += "# The tarball must match image.efa_installer_sha256, or the build stops.\n"
           "ARG EFA_INSTALLER_SHA256=" + s.efa_installer_sha256 + "\n";
    else
      d += "# Unverified: image.efa_installer_sha256 is not set (image.allow_unpinned).\n";
    d += "RUN cd /tmp && curl -fsSLO https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz "
         "\\\n";
    if (!s.efa_installer_sha256.empty())
      d += "    && echo \"${EFA_INSTALLER_SHA256}  aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz\" | sha256sum -c - "
           "\\\n";
    d += "    && tar -xzf aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz && cd aws-efa-installer \\\n"
         "    && ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify \\\n"
         "    && cd / && rm -rf /tmp/aws-efa-installer* /var/lib/apt/lists/*\n";
    d += "ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu:"
         "/opt/amazon/efa/lib:${LD_LIBRARY_PATH}\n\n";
  }
  d += "# shardtrain itself, built by its own setup script (Debian/Ubuntu packages by name), without tests.\n";
  d += "COPY . /opt/shardtrain/src\n";
  d += "RUN cd /opt/shardtrain/src && SHARDTRAIN_TESTS=OFF scripts/setup.sh \\\n"
       "    && install -m 0755 build/shardtrain /usr/local/bin/shardtrain \\\n"
       "    && install -m 0644 src/deploy/ray_driver.py " + std::string(kDriver) + " \\\n"
       "    && rm -rf /opt/shardtrain/src/build /var/lib/apt/lists/*\n";
  if (s.engine == "kuberay")
    d += "\n# Ray, at the version the RayCluster names (workload.ray_version).\n"
         "RUN python3 -m pip install --no-cache-dir --break-system-packages \"ray[default]==" + s.ray_version + "\"\n";
  d += "\nWORKDIR /workspace\n";
  return d;
}

}  // namespace

std::vector<Artifact> render_artifacts(const ClusterSpec& s) {
  std::vector<Artifact> out;
  auto yaml = [&](std::string file, std::string what, std::vector<ojson> docs) {
    Artifact a{std::move(file), std::move(what), std::move(docs), ""};
    a.text = a.docs.size() == 1 ? to_yaml(a.docs[0]) : to_yaml_stream(a.docs);
    out.push_back(std::move(a));
  };
  yaml("eksctl-cluster.yaml", "eksctl ClusterConfig: the cluster, a system node group and the GPU node group",
       {eksctl_config(s)});
  yaml("helm/nvidia-device-plugin.values.yaml", "Helm values: NVIDIA device plugin on the GPU nodes",
       {nvidia_values(s)});
  yaml("helm/aws-efa-k8s-device-plugin.values.yaml", "Helm values: EFA device plugin on the GPU nodes",
       {efa_values(s)});
  if (s.engine == "kuberay")
    yaml("helm/kuberay-operator.values.yaml", "Helm values: KubeRay operator on the system node", {kuberay_values(s)});
  std::vector<ojson> base = base_workload(s);
  if (s.engine == "kuberay") base.push_back(ray_cluster(s));
  yaml("workload.yaml",
       s.engine == "kuberay" ? "Namespace, ServiceAccount, ConfigMap (run config), RayCluster"
                             : "Namespace, ServiceAccount, ConfigMap (run config)" +
                                   std::string(s.engine == "job" ? ", headless Service" : ""),
       base);
  if (s.engine == "job") yaml("job.yaml", "the training: an Indexed Job, one pod per GPU node", {indexed_job(s)});
  if (s.engine == "kuberay") yaml("job.yaml", "the training: a RayJob running the shardtrain driver", {ray_job(s)});
  if (s.engine == "pytorchjob") yaml("job.yaml", "the training: a PyTorchJob, one pod per GPU node", {pytorch_job(s)});
  out.push_back({"config.toml", "the resolved shardtrain run config (also in the ConfigMap)", {}, run_config_toml(s.run)});
  out.push_back({"Dockerfile", "the image: base pinned by digest, EFA user space, shardtrain", {}, dockerfile(s)});
  return out;
}

std::vector<PlanStep> plan_steps(const ClusterSpec& s, const std::string& dir) {
  namespace fs = std::filesystem;
  auto at = [&](const std::string& f) { return (fs::path(dir) / f).string(); };
  const InstanceFacts& g = *s.gpu.facts;
  const std::string zone = s.gpu.zones.empty() ? (s.zones.empty() ? "" : s.zones[0]) : s.gpu.zones[0];
  const std::string ns = s.namespace_;
  const Versions v;
  std::vector<PlanStep> steps;

  steps.push_back({1, "Cluster file", {}, {"read " + s.path + " (cluster " + s.name + ", " + s.region + ", " +
                                           std::to_string(s.gpu.count) + " x " + s.gpu.instance_type + ", engine " +
                                           s.engine + ")"}});
  steps.push_back({2, "Preview (this plan)",
                   {{"shardtrain", "deploy", "plan", "--cluster", s.path, "--out", dir}},
                   {"every artifact below is written to " + dir + "; nothing is created"}});

  PlanStep cap{3, "Capacity, then the cluster and its node groups", {}, {}};
  if (s.gpu.capacity == "on-demand")
    cap.commands.push_back({"aws", "service-quotas", "get-service-quota", "--service-code", "ec2",
                                    "--quota-code", g.quota_code, "--region", s.region, "--output", "json"});
  else
    cap.commands.push_back({"aws", "ec2", "describe-capacity-reservations", "--capacity-reservation-ids",
                                    s.gpu.capacity_reservation_id, "--region", s.region, "--output", "json"});
  cap.commands.push_back({"aws", "ec2", "describe-instance-type-offerings", "--location-type",
                                  "availability-zone", "--filters", "Name=instance-type,Values=" + s.gpu.instance_type,
                                  "Name=location,Values=" + zone, "--region", s.region, "--output", "json"});
  if (uses_placement_group(s))
    cap.commands.push_back({"aws", "ec2", "create-placement-group", "--group-name", s.gpu.placement_group,
                                    "--strategy", "cluster", "--region", s.region});
  cap.commands.push_back({"eksctl", "create", "cluster", "-f", at("eksctl-cluster.yaml"), "--install-nvidia-plugin=false"});
  cap.notes.push_back(std::to_string(s.gpu.count) + " x " + s.gpu.instance_type + " = " +
                      std::to_string(s.gpu.count * g.vcpus) + " vCPU of \"" + g.quota_name + "\" (" + g.quota_code +
                      ")");
  if (s.gpu.efa && !uses_placement_group(s))
    cap.notes.push_back("no placement group of ours: capacity reservation " + s.gpu.capacity_reservation_id +
                        " already decides where its instances run, and a second group could keep them from "
                        "launching");
  cap.notes.push_back("the NVIDIA device plugin comes from its Helm chart in step 4 (one owner), so eksctl is told "
                      "not to install its own");
  steps.push_back(cap);

  PlanStep plugins{4, "Device plugins", {}, {}};
  // A chart from its repository, or from helm.charts_dir (an offline mirror).
  auto chart = [&](const std::string& name, const std::string& repo, const std::string& version) {
    std::vector<std::string> a = {"helm", "upgrade", "--install", name};
    if (s.charts_dir.empty())
      a.insert(a.end(), {name, "--repo", repo});
    else
      a.push_back((fs::path(s.charts_dir) / (name + "-" + version + ".tgz")).string());
    a.insert(a.end(), {"--version", version});
    return a;
  };
  std::vector<std::string> nv = chart("nvidia-device-plugin", "https://nvidia.github.io/k8s-device-plugin",
                                      v.nvidia_device_plugin);
  nv.insert(nv.end(), {"--namespace", "nvidia-device-plugin", "--create-namespace", "--values",
                       at("helm/nvidia-device-plugin.values.yaml"), "--wait"});
  plugins.commands.push_back(nv);
  plugins.commands.push_back({"kubectl", "-n", "nvidia-device-plugin", "rollout", "status",
                              "daemonset/nvidia-device-plugin", "--timeout=300s"});
  if (s.gpu.efa) {
    // eksctl installs its own copy of the EFA plugin with every efaEnabled node group
    // (no option turns that off) and it tolerates no GPU taint, so it never runs on
    // the GPU nodes: it goes, and the chart (whose values tolerate the taint) is the
    // one owner. Both of eksctl's names: aws-efa-k8s-device-plugin since 0.204.
    plugins.commands.push_back({"kubectl", "-n", "kube-system", "delete", "daemonset", kEksctlEfaDaemonSet,
                                "aws-efa-k8s-device-plugin-daemonset", "--ignore-not-found"});
    std::vector<std::string> efa = chart(kEfaRelease, "https://aws.github.io/eks-charts", v.efa_device_plugin);
    efa.insert(efa.end(), {"--namespace", kEfaRelease, "--create-namespace", "--values",
                           at("helm/aws-efa-k8s-device-plugin.values.yaml"), "--wait"});
    plugins.commands.push_back(efa);
    plugins.commands.push_back({"kubectl", "-n", kEfaRelease, "rollout", "status",
                                std::string("daemonset/") + kEfaRelease, "--timeout=300s"});
    plugins.notes.push_back("eksctl's own EFA device plugin (kube-system/" + std::string(kEksctlEfaDaemonSet) +
                            ") tolerates only CriticalAddonsOnly and aws.amazon.com/efa, not the GPU nodes' taint "
                            "nvidia.com/gpu: it is deleted and the chart aws-efa-k8s-device-plugin " +
                            v.efa_device_plugin + " installed in its place");
  }
  plugins.notes.push_back("a DaemonSet that selects no node rolls out too: `deploy apply` also waits until each "
                          "plugin's DaemonSet has " + std::to_string(s.gpu.count) +
                          " pods desired and ready, one per GPU node");
  steps.push_back(plugins);

  PlanStep op{5, "KubeRay operator", {}, {}};
  if (s.engine == "kuberay") {
    std::vector<std::string> kr = chart("kuberay-operator", "https://ray-project.github.io/kuberay-helm/",
                                        v.kuberay_operator);
    kr.insert(kr.end(), {"--namespace", "kuberay-operator", "--create-namespace", "--values",
                         at("helm/kuberay-operator.values.yaml"), "--wait"});
    op.commands.push_back(kr);
  } else if (s.engine == "pytorchjob") {
    op.notes.push_back("engine pytorchjob: the Kubeflow training operator (PyTorchJob v1) must already run in the "
                       "cluster");
  } else {
    op.notes.push_back("not needed: engine \"job\" is a plain Kubernetes Indexed Job");
  }
  steps.push_back(op);

  PlanStep work{6, "Workload", {{"kubectl", "apply", "--server-side", "-f", at("workload.yaml")}}, {}};
  if (s.engine == "kuberay")
    work.commands.push_back({"kubectl", "-n", ns, "wait", "--for=condition=RayClusterProvisioned",
                                     "raycluster/" + s.job_name, "--timeout=900s"});
  steps.push_back(work);

  PlanStep verify{7, "Verify the GPU nodes advertise their GPUs and EFA", {}, {}};
  verify.commands.push_back({"shardtrain", "deploy", "verify", "--cluster", s.path});
  verify.notes.push_back("each of the " + std::to_string(s.gpu.count) + " nodes must show allocatable nvidia.com/gpu " +
                         std::to_string(g.gpus) +
                         (s.gpu.efa ? " and vpc.amazonaws.com/efa " + std::to_string(g.efa_interfaces) : "") +
                         ", in zone " + zone + ", with its device-plugin pods Ready (kubectl get nodes, pods, "
                         "daemonsets -o json)");
  steps.push_back(verify);

  PlanStep submit{8, "Submit and follow", {{"kubectl", "apply", "--server-side", "-f", at("job.yaml")}}, {}};
  if (s.engine == "job")
    submit.commands.push_back({"kubectl", "-n", ns, "logs", "-f", "job/" + s.job_name});
  else if (s.engine == "kuberay")
    submit.commands.push_back({"kubectl", "-n", ns, "logs", "-f", "job/" + s.job_name});
  else
    submit.commands.push_back({"kubectl", "-n", ns, "logs", "-f", s.job_name + "-master-0"});
  if (!s.expect_transport.empty())
    submit.notes.push_back("every rank runs with --expect-transport " + s.expect_transport +
                           ": a fallback to another transport ends the job before step 1");
  steps.push_back(submit);
  return steps;
}

}  // namespace st

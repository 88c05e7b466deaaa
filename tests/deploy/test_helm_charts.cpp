// The real Helm charts (../shared/deploy/charts) rendered by the real helm with the
// values `deploy plan` writes: the device plugins' DaemonSets must land on the GPU
// nodes the plan's eksctl config makes (labels and taints read from it), not on the
// system node, and the KubeRay operator on the system node.
#include <gtest/gtest.h>

#include <filesystem>

#include "deploy/cluster_file.h"
#include "deploy/render.h"
#include "support/schema_check.h"
#include "support/shell.h"

namespace st {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kRoot = SHARDTRAIN_SOURCE_DIR;
const fs::path kHelm = fs::path(SHARDTRAIN_TOOLS_DIR) / "helm";

struct Node {
  std::map<std::string, std::string> labels;
  json taints = json::array();
};

// A node of each managed node group, as EKS labels it.
std::map<std::string, Node> nodes_of(const json& eksctl) {
  std::map<std::string, Node> out;
  for (const auto& g : eksctl["managedNodeGroups"]) {
    Node n;
    const json labels = g.value("labels", json::object());
    for (const auto& [k, v] : labels.items()) n.labels[k] = v;
    n.labels["eks.amazonaws.com/nodegroup"] = g["name"];
    n.labels["kubernetes.io/os"] = "linux";
    n.labels["kubernetes.io/arch"] = "amd64";
    n.labels["node.kubernetes.io/instance-type"] = g["instanceType"];
    n.taints = g.value("taints", json::array());
    out[g["name"]] = n;
  }
  return out;
}

bool expression_holds(const json& e, const Node& n) {
  const std::string key = e["key"], op = e["operator"];
  const auto it = n.labels.find(key);
  const bool has = it != n.labels.end();
  std::vector<std::string> values;
  for (const auto& v : e.value("values", json::array())) values.push_back(v);
  const bool in = has && std::find(values.begin(), values.end(), it->second) != values.end();
  if (op == "In") return in;
  if (op == "NotIn") return !in;
  if (op == "Exists") return has;
  if (op == "DoesNotExist") return !has;
  if (op == "Gt" || op == "Lt") {
    if (!has) return false;
    const long a = std::stol(it->second), b = std::stol(values.at(0));
    return op == "Gt" ? a > b : a < b;
  }
  ADD_FAILURE() << "operator " << op;
  return false;
}

// Whether a pod with this spec may be scheduled on the node (selectors and taints).
bool schedulable(const json& pod, const Node& n) {
  const json selector = pod.value("nodeSelector", json::object());
  for (const auto& [k, v] : selector.items())
    if (!n.labels.count(k) || n.labels.at(k) != v.get<std::string>()) return false;
  const json terms = pod.value("/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms"_json_pointer,
                               json::array());
  if (!terms.empty()) {
    bool any = false;
    for (const auto& t : terms) {
      bool all = true;
      for (const auto& e : t.value("matchExpressions", json::array())) all = all && expression_holds(e, n);
      any = any || all;
    }
    if (!any) return false;
  }
  for (const auto& taint : n.taints) {
    if (taint.value("effect", "") != "NoSchedule" && taint.value("effect", "") != "NoExecute") continue;
    bool tolerated = false;
    for (const auto& tol : pod.value("tolerations", json::array())) {
      const std::string op = tol.value("operator", "Equal");
      const bool key_ok = tol.value("key", "") == "" ? op == "Exists" : tol.value("key", "") == taint.value("key", "");
      const bool value_ok = op == "Exists" || tol.value("value", "") == taint.value("value", "");
      const bool effect_ok = tol.value("effect", "") == "" || tol.value("effect", "") == taint.value("effect", "");
      tolerated = tolerated || (key_ok && value_ok && effect_ok);
    }
    if (!tolerated) return false;
  }
  return true;
}

std::vector<json> helm_template(const std::string& release, const std::string& chart, const fs::path& values,
                                const std::string& ns) {
  const auto r = st::testing::run_shell(kHelm.string() + " template " + release + " " +
                                        (st::testing::shared_deploy_dir() / "charts" / chart).string() + " -n " + ns +
                                        " -f " + values.string());
  EXPECT_EQ(r.code, 0) << r.out;
  return yaml_documents(r.out, "helm template " + chart);
}

fs::path write_values(const std::vector<Artifact>& arts, const std::string& file, const std::string& tag) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("st_helm_" + tag + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const Artifact& a : arts)
    if (a.file == file) {
      std::ofstream(dir / "values.yaml") << a.text;
      return dir / "values.yaml";
    }
  ADD_FAILURE() << file << " not rendered";
  return {};
}

class HelmCharts : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!st::testing::have_shared_deploy()) GTEST_SKIP() << "../shared/deploy is absent: no charts to render";
    if (!fs::exists(kHelm)) GTEST_SKIP() << kHelm << " is absent: run scripts/get_kube_tools.sh (setup does)";
    arts_ = render_artifacts(load_cluster_file((kRoot / "configs/deploy/eks-g6-efa-kuberay.toml").string()));
    for (const Artifact& a : arts_)
      if (a.file == "eksctl-cluster.yaml") nodes_ = nodes_of(json::parse(a.docs.at(0).dump()));
    ASSERT_EQ(nodes_.size(), 2u);
  }
  std::vector<Artifact> arts_;
  std::map<std::string, Node> nodes_;
};

// Every DaemonSet of the chart stays off the system node, and the plugin's own
// (named after the release) runs on the GPU nodes. Others may wait for labels our
// nodes do not carry (the NVIDIA chart's MPS daemon: nvidia.com/mps.capable).
void expect_plugin_on_gpu_nodes_only(const std::vector<json>& docs, const std::map<std::string, Node>& nodes,
                                     const std::string& release) {
  bool plugin = false;
  for (const auto& d : docs) {
    if (d.value("kind", "") != "DaemonSet") continue;
    const json pod = d["spec"]["template"]["spec"];
    const std::string name = d["metadata"]["name"];
    EXPECT_FALSE(schedulable(pod, nodes.at("system"))) << name << ": on the system node";
    if (name != release && name != release + "-daemonset") continue;
    plugin = true;
    EXPECT_TRUE(schedulable(pod, nodes.at("gpu"))) << name << ": not on the GPU node";
  }
  EXPECT_TRUE(plugin) << release << ": no DaemonSet of that name rendered";
}

TEST_F(HelmCharts, NvidiaDevicePluginRunsOnTheGpuNodes) {
  const auto docs = helm_template("nvidia-device-plugin", "nvidia-device-plugin-0.20.0.tgz",
                                  write_values(arts_, "helm/nvidia-device-plugin.values.yaml", "nv"), "nvidia-device-plugin");
  expect_plugin_on_gpu_nodes_only(docs, nodes_, "nvidia-device-plugin");
  // The matcher tells the nodes apart: the GPU taint keeps out a pod without a toleration.
  EXPECT_FALSE(schedulable(json::object({{"nodeSelector", {{"nvidia.com/gpu.present", "true"}}}}), nodes_.at("gpu")))
      << "the GPU taint must keep pods without a toleration away";
}

TEST_F(HelmCharts, EfaDevicePluginRunsOnTheGpuNodes) {
  const auto docs = helm_template("aws-efa-k8s-device-plugin", "aws-efa-k8s-device-plugin-v0.5.30.tgz",
                                  write_values(arts_, "helm/aws-efa-k8s-device-plugin.values.yaml", "efa"), "kube-system");
  expect_plugin_on_gpu_nodes_only(docs, nodes_, "aws-efa-k8s-device-plugin");
}

TEST_F(HelmCharts, KubeRayOperatorRunsOnTheSystemNode) {
  const auto docs = helm_template("kuberay-operator", "kuberay-operator-1.7.0.tgz",
                                  write_values(arts_, "helm/kuberay-operator.values.yaml", "kr"), "kuberay-operator");
  int deployments = 0;
  for (const auto& d : docs) {
    if (d.value("kind", "") != "Deployment") continue;
    ++deployments;
    const json pod = d["spec"]["template"]["spec"];
    EXPECT_TRUE(schedulable(pod, nodes_.at("system"))) << d["metadata"]["name"];
    EXPECT_FALSE(schedulable(pod, nodes_.at("gpu"))) << d["metadata"]["name"];
  }
  EXPECT_EQ(deployments, 1);
}

}  // namespace
}  // namespace st

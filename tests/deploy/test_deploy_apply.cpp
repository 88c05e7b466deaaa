// `deploy verify` and `deploy apply`: the checks on the real JSON of nodes, pods and
// DaemonSets (fixtures of two g6.12xlarge nodes and variants), the real kubectl
// against the Kubernetes API test server (tests/support/kube_test_server.py), and
// apply's steps with eksctl, aws and helm as recording fakes on PATH.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "deploy/cluster_file.h"
#include "deploy/verify.h"
#include "support/files.h"
#include "support/fork_ranks.h"
#include "support/shell.h"
#include "support/temp_dir.h"

namespace st {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::read_file;
using testing::temp_dir;

const fs::path kRoot = SHARDTRAIN_SOURCE_DIR;
const fs::path kRecipe = kRoot / "configs/deploy/eks-g6-efa.toml";
const fs::path kFixtures = fs::path(SHARDTRAIN_TEST_DATA) / "k8s/two-g6";
const fs::path kKubectl = fs::path(SHARDTRAIN_TOOLS_DIR) / "kubectl";
// The EFA device plugin's DaemonSet as eksctl applies it with an efaEnabled node group:
// named aws-efa-k8s-device-plugin (since eksctl 0.204), in kube-system, tolerating
// CriticalAddonsOnly and aws.amazon.com/efa only (eksctl adds none for the node
// groups' taints), node affinity on EFA instance types.
const fs::path kEksctlEfa = fs::path(SHARDTRAIN_TEST_DATA) / "k8s/eksctl-efa-device-plugin.json";

json load(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

ClusterState base_state() { return {load(kFixtures / "nodes.json"), load(kFixtures / "pods.json"),
                                    load(kFixtures / "daemonsets.json")}; }

std::vector<std::string> failures(const std::vector<Check>& checks) {
  std::vector<std::string> out;
  for (const Check& c : checks)
    if (!c.ok) out.push_back(c.subject + ": " + c.what + ": " + c.detail);
  return out;
}

bool any_has(const std::vector<std::string>& v, const std::string& a, const std::string& b = "") {
  for (const std::string& s : v)
    if (s.find(a) != std::string::npos && s.find(b) != std::string::npos) return true;
  return false;
}

const std::string kNode1 = "ip-10-42-1-11.us-west-2.compute.internal";

// ---- the checks on fixtures ---------------------------------------------------------

TEST(DeployVerify, TwoG6NodesPass) {
  const auto checks = verify_cluster(load_cluster_file(kRecipe.string()), base_state());
  EXPECT_TRUE(failures(checks).empty()) << format_checks(checks);
  EXPECT_GE(checks.size(), 20u);
}

TEST(DeployVerify, EachProblemIsNamed) {
  const ClusterSpec spec = load_cluster_file(kRecipe.string());
  struct Case {
    std::string name;
    std::function<void(ClusterState&)> edit;
    std::string subject, expect;
  };
  auto node1 = [](ClusterState& s) -> json& { return s.nodes["items"][1]; };
  const std::vector<Case> cases = {
      {"no EFA", [&](ClusterState& s) { node1(s)["status"]["allocatable"]["vpc.amazonaws.com/efa"] = "0"; },
       "node " + kNode1, "allocatable vpc.amazonaws.com/efa: 0, want 1"},
      {"EFA not advertised", [&](ClusterState& s) { node1(s)["status"]["allocatable"].erase("vpc.amazonaws.com/efa"); },
       "node " + kNode1, "allocatable vpc.amazonaws.com/efa: 0, want 1"},
      {"other zone", [&](ClusterState& s) { node1(s)["metadata"]["labels"]["topology.kubernetes.io/zone"] = "us-west-2b"; },
       "node " + kNode1, "zone: us-west-2b, want us-west-2a"},
      {"no GPU label", [&](ClusterState& s) { node1(s)["metadata"]["labels"].erase("nvidia.com/gpu.present"); },
       "node " + kNode1, "label nvidia.com/gpu.present: missing"},
      {"three GPUs", [&](ClusterState& s) { node1(s)["status"]["allocatable"]["nvidia.com/gpu"] = "3"; },
       "node " + kNode1, "allocatable nvidia.com/gpu: 3, want 4"},
      {"one node", [&](ClusterState& s) { s.nodes["items"].erase(1); }, "node group gpu", "GPU nodes: 1, want 2"},
      {"two EFA plugins",
       [&](ClusterState& s) {
         json d = s.daemonsets["items"][1];  // eksctl's copy left beside the chart's
         d["metadata"]["namespace"] = "kube-system";
         s.daemonsets["items"].push_back(d);
       },
       "plugin efa", "two owners"},
      {"plugin pod not Ready",
       [&](ClusterState& s) { s.pods["items"][3]["status"]["conditions"][0]["status"] = "False"; },
       "node " + kNode1, "nvidia device plugin pod Ready: not Ready"},
      {"requests below limits",
       [&](ClusterState& s) {
         s.pods["items"][5]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "20";
         s.pods["items"][5]["status"]["qosClass"] = "Burstable";
       },
       "pod shardtrain/qwen-train-1", "requests == limits: no"},
      {"two pods on one node",
       [&](ClusterState& s) { s.pods["items"][5]["spec"]["nodeName"] = s.pods["items"][2]["spec"]["nodeName"]; },
       "pod shardtrain/qwen-train-1", "one pod per node"},
      {"node NotReady",
       [&](ClusterState& s) {
         node1(s)["status"]["conditions"][0]["status"] = "False";
         node1(s)["status"]["conditions"][0]["reason"] = "KubeletNotReady";
       },
       "node " + kNode1, "Ready: Ready=False (KubeletNotReady)"},
      {"node unreachable",
       [&](ClusterState& s) {
         node1(s)["status"]["conditions"][0]["status"] = "Unknown";
         node1(s)["spec"]["taints"].push_back({{"key", "node.kubernetes.io/unreachable"}, {"effect", "NoExecute"}});
       },
       "node " + kNode1, "taint node.kubernetes.io/unreachable:NoExecute"},
      {"system node unreachable",
       [&](ClusterState& s) {
         s.nodes["items"][2]["spec"]["taints"].push_back({{"key", "node.kubernetes.io/unreachable"}, {"effect", "NoSchedule"}});
       },
       "node ip-10-42-2-20.us-west-2.compute.internal", "taint node.kubernetes.io/unreachable:NoSchedule"},
      // Guaranteed (requests == limits) but not the plan's pod: 2 GPUs and no EFA.
      {"two GPUs and no EFA",
       [&](ClusterState& s) {
         json& r = s.pods["items"][5]["spec"]["containers"][0]["resources"];
         for (const char* k : {"requests", "limits"}) {
           r[k]["nvidia.com/gpu"] = "2";
           r[k].erase("vpc.amazonaws.com/efa");
         }
       },
       "pod shardtrain/qwen-train-1", "requested nvidia.com/gpu: 2, want 4"},
      {"no EFA asked for",
       [&](ClusterState& s) {
         json& r = s.pods["items"][5]["spec"]["containers"][0]["resources"];
         for (const char* k : {"requests", "limits"}) r[k].erase("vpc.amazonaws.com/efa");
       },
       "pod shardtrain/qwen-train-1", "requested vpc.amazonaws.com/efa: 0, want 1"},
  };
  for (const Case& c : cases) {
    ClusterState s = base_state();
    c.edit(s);
    const auto f = failures(verify_cluster(spec, s));
    EXPECT_TRUE(any_has(f, c.subject, c.expect)) << c.name << ": expected a failure of '" << c.subject << "' with '"
                                                 << c.expect << "', got:\n"
                                                 << ::testing::PrintToString(f);
  }
}

// ---- the real kubectl against the test server --------------------------------------------

class KubeServer {
 public:
  // Serves `fixtures` (a directory of List JSON files); writes a kubeconfig.
  // With `kubelet`, applied Indexed Jobs run their pods as processes (files under
  // dir/kubelet), with shardtrain and kubectl on their PATH.
  explicit KubeServer(const fs::path& fixtures, const fs::path& dir, bool kubelet = false) {
    kubeconfig_ = dir / "kubeconfig";
    const fs::path ready = dir / "server.out";
    fs::remove(ready);
    fs::remove(kubeconfig_);
    pid_ = ::fork();
    if (pid_ == 0) {
      const int fd = ::open(ready.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      const std::string script = (kRoot / "tests/support/kube_test_server.py").string();
      const std::string schemas = (fs::path(SHARDTRAIN_SHARED_DIR) / "deploy/schemas").string();
      const std::string pods = (dir / "kubelet").string();
      std::vector<std::string> args = {"python3", script, "--fixtures", fixtures.string(), "--kubeconfig",
                                       kubeconfig_.string()};
      if (fs::exists(schemas)) args.insert(args.end(), {"--schemas", schemas});
      if (kubelet) {
        args.insert(args.end(), {"--kubelet", pods});
        const std::string path = fs::path(SHARDTRAIN_BINARY).parent_path().string() + ":" +
                                 kKubectl.parent_path().string() + ":" + std::getenv("PATH");
        ::setenv("PATH", path.c_str(), 1);
      }
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execvp("python3", argv.data());
      ::_exit(127);
    }
    for (int i = 0; i < 200; ++i) {
      std::ifstream in(ready);
      std::string word;
      if (in >> word && word == "ready") return;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    ADD_FAILURE() << "the test server did not start";
  }
  ~KubeServer() {
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
  }
  // Environment for a command: kubectl from the tools directory, this server.
  std::string env() const {
    return "PATH=" + kKubectl.parent_path().string() + ":$PATH KUBECONFIG=" + kubeconfig_.string() + " ";
  }

 private:
  pid_t pid_ = -1;
  fs::path kubeconfig_;
};

bool have_tools() { return fs::exists(kKubectl) && st::testing::run_shell("python3 -c 'import yaml'").code == 0; }

TEST(DeployVerifyCli, RealKubectlAgainstTheTestServer) {
  if (!have_tools()) GTEST_SKIP() << "kubectl (scripts/get_kube_tools.sh) or python3-yaml is missing";
  const fs::path dir = temp_dir("verify");
  const std::string bin = std::string(SHARDTRAIN_BINARY) + " deploy verify --cluster " + kRecipe.string();
  {
    KubeServer server(kFixtures, dir);
    const auto r = st::testing::run_shell(server.env() + bin);
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("allocatable vpc.amazonaws.com/efa  ok"), std::string::npos) << r.out;
    const auto j = st::testing::run_shell(server.env() + bin + " --json 2>/dev/null");
    EXPECT_TRUE(json::parse(j.out)["ok"].get<bool>()) << j.out;
  }
  // One node advertises no EFA: a non-zero exit naming the node and the resource.
  const fs::path variant = dir / "no-efa";
  fs::create_directories(variant);
  for (const char* f : {"pods.json", "daemonsets.json"}) fs::copy_file(kFixtures / f, variant / f);
  json nodes = load(kFixtures / "nodes.json");
  nodes["items"][1]["status"]["allocatable"].erase("vpc.amazonaws.com/efa");
  nodes["items"][1]["status"]["capacity"].erase("vpc.amazonaws.com/efa");
  std::ofstream(variant / "nodes.json") << nodes.dump(1);
  KubeServer server(variant, dir);
  const auto r = st::testing::run_shell(server.env() + bin);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("deploy verify: 1 check failed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(kNode1 + ": allocatable vpc.amazonaws.com/efa: 0, want 1"), std::string::npos) << r.out;
}

// ---- apply ----------------------------------------------------------------------------------

// eksctl, aws and helm as fakes on PATH: each appends its arguments to calls.log and
// answers from the environment (FAKE_QUOTA, FAKE_OFFERED, FAKE_EXISTS).
fs::path fake_tools(const fs::path& dir, bool fake_helm = true) {
  const fs::path bin = dir / "fakebin";
  fs::create_directories(bin);
  auto script = [&](const std::string& name, const std::string& body) {
    std::ofstream(bin / name) << "#!/bin/sh\necho \"" << name << " $*\" >> \"" << (dir / "calls.log").string()
                              << "\"\n" << body;
    fs::permissions(bin / name, fs::perms::owner_all);
  };
  script("aws",
         "case \"$1 $2\" in\n"
         "  'service-quotas get-service-quota') echo \"{\\\"Quota\\\": {\\\"QuotaCode\\\": \\\"L-DB2E81BA\\\", "
         "\\\"Value\\\": ${FAKE_QUOTA:-96}.0}}\" ;;\n"
         "  'ec2 describe-instance-type-offerings') if [ \"${FAKE_OFFERED:-1}\" = 1 ]; then echo "
         "'{\"InstanceTypeOfferings\": [{\"InstanceType\": \"g6.12xlarge\", \"LocationType\": \"availability-zone\", "
         "\"Location\": \"us-west-2a\"}]}'; else echo '{\"InstanceTypeOfferings\": []}'; fi ;;\n"
         "  'ec2 describe-placement-groups') [ \"${FAKE_EXISTS:-0}\" = 1 ] || { echo 'An error occurred "
         "(InvalidPlacementGroup.Unknown)' >&2; exit 254; }; echo '{\"PlacementGroups\": []}' ;;\n"
         "  *) echo '{}' ;;\n"
         "esac\n");
  script("eksctl",
         "case \"$1 $2\" in\n"
         "  'get cluster') [ \"${FAKE_EXISTS:-0}\" = 1 ] || { echo 'Error: unable to describe cluster control "
         "plane: ResourceNotFoundException' >&2; exit 1; }; echo '[{\"Name\": \"shardtrain-g6\"}]' ;;\n"
         "  'get nodegroup') echo '[{\"Name\": \"system\"}, {\"Name\": \"gpu\"}]' ;;\n"
         "  *) echo \"created\" ;;\n"
         "esac\n");
  if (fake_helm) script("helm",
         "case \"$1\" in\n"
         "  list) if [ \"${FAKE_EXISTS:-0}\" = 1 ]; then case \"$*\" in\n"
         "      *nvidia-device-plugin*) echo '[{\"name\": \"nvidia-device-plugin\", \"namespace\": "
         "\"nvidia-device-plugin\", \"revision\": \"1\", \"status\": \"deployed\", \"chart\": "
         "\"nvidia-device-plugin-0.20.0\", \"app_version\": \"0.20.0\"}]' ;;\n"
         "      *) echo '[{\"name\": \"aws-efa-k8s-device-plugin\", \"namespace\": \"aws-efa-k8s-device-plugin\", "
         "\"revision\": \"1\", \"status\": \"deployed\", \"chart\": \"aws-efa-k8s-device-plugin-v0.5.30\", "
         "\"app_version\": \"v0.5.20\"}]' ;;\n"
         "    esac; else echo '[]'; fi ;;\n"
         "  *) echo 'Release has been upgraded' ;;\n"
         "esac\n");
  return bin;
}

TEST(DeployApply, DryRunPrintsTheCommandSequence) {
  const auto r = st::testing::run_shell(std::string(SHARDTRAIN_BINARY) + " deploy apply --dry-run --cluster " +
                                        kRecipe.string() + " --out " + temp_dir("dry").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const char* in_order[] = {"aws service-quotas get-service-quota --service-code ec2 --quota-code L-DB2E81BA",
                            "aws ec2 describe-instance-type-offerings",
                            "aws ec2 create-placement-group --group-name shardtrain-g6-gpu --strategy cluster",
                            "eksctl create cluster -f", "helm upgrade --install nvidia-device-plugin",
                            "kubectl -n nvidia-device-plugin rollout status daemonset/nvidia-device-plugin",
                            // eksctl's EFA plugin (either name) goes; the chart's takes its place.
                            "kubectl -n kube-system delete daemonset aws-efa-k8s-device-plugin "
                            "aws-efa-k8s-device-plugin-daemonset --ignore-not-found",
                            "helm upgrade --install aws-efa-k8s-device-plugin",
                            "--namespace aws-efa-k8s-device-plugin --create-namespace --values",
                            "kubectl -n aws-efa-k8s-device-plugin rollout status daemonset/aws-efa-k8s-device-plugin",
                            "kubectl apply --server-side -f", "shardtrain deploy verify --cluster"};
  size_t at = 0;
  for (const char* c : in_order) {
    const size_t p = r.out.find(c, at);
    EXPECT_NE(p, std::string::npos) << "'" << c << "' missing or out of order in:\n" << r.out;
    if (p != std::string::npos) at = p;
  }
  EXPECT_EQ(r.out.find("job.yaml"), std::string::npos) << "step 8 only with --train";
}

TEST(DeployApply, RunsTheStepsThenSkipsWhatIsDone) {
  if (!have_tools()) GTEST_SKIP() << "kubectl (scripts/get_kube_tools.sh) or python3-yaml is missing";
  const fs::path dir = temp_dir("run");
  const fs::path bin = fake_tools(dir);
  KubeServer server(kFixtures, dir);
  // The fakes first on PATH (before the real helm of the tools directory).
  const std::string cmd = server.env() + "PATH=" + bin.string() + ":$PATH " + SHARDTRAIN_BINARY +
                          " deploy apply --cluster " + kRecipe.string() + " --out " + (dir / "out").string();
  auto r = st::testing::run_shell(cmd);
  ASSERT_EQ(r.code, 0) << r.out;
  std::string calls = read_file(dir / "calls.log");
  EXPECT_NE(calls.find("eksctl create cluster -f " + (dir / "out/eksctl-cluster.yaml").string() +
                       " --install-nvidia-plugin=false"), std::string::npos) << calls;
  EXPECT_NE(calls.find("aws ec2 create-placement-group"), std::string::npos) << calls;
  EXPECT_NE(calls.find("helm upgrade --install nvidia-device-plugin"), std::string::npos) << calls;
  EXPECT_NE(r.out.find("96 vCPU, 96 needed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[step 7/7]"), std::string::npos) << r.out;
  const std::string log = read_file(dir / "out/deploy.log");
  EXPECT_NE(log.find("$ kubectl apply --server-side -f"), std::string::npos) << log;
  EXPECT_NE(log.find("serverside-applied"), std::string::npos) << log;
  // Again, with everything in place: nothing is created twice.
  fs::remove(dir / "calls.log");
  r = st::testing::run_shell("FAKE_EXISTS=1 " + cmd);
  ASSERT_EQ(r.code, 0) << r.out;
  calls = read_file(dir / "calls.log");
  EXPECT_EQ(calls.find("create cluster"), std::string::npos) << calls;
  EXPECT_EQ(calls.find("create-placement-group"), std::string::npos) << calls;
  EXPECT_EQ(calls.find("helm upgrade"), std::string::npos) << calls;
  EXPECT_NE(r.out.find("skipped: cluster shardtrain-g6 and its node groups exist"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("skipped: release nvidia-device-plugin 0.20.0 is deployed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("skipped: release aws-efa-k8s-device-plugin v0.5.30 is deployed"), std::string::npos) << r.out;
}

// A DaemonSet that selects no node "rolls out": step 4 waits for one pod desired and
// ready per GPU node, and stops naming the DaemonSet and the counts.
TEST(DeployApply, APluginOnNoGpuNodeStopsStep4) {
  if (!have_tools()) GTEST_SKIP() << "kubectl (scripts/get_kube_tools.sh) or python3-yaml is missing";
  const fs::path dir = temp_dir("ds0");
  const fs::path bin = fake_tools(dir);
  const fs::path fx = dir / "fixtures";
  fs::create_directories(fx);
  fs::copy_file(kFixtures / "nodes.json", fx / "nodes.json");
  json ds = load(kFixtures / "daemonsets.json");
  ASSERT_EQ(ds["items"][1]["metadata"]["name"], "aws-efa-k8s-device-plugin");
  ds["items"][1]["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.present"] = "yes";  // no node has it
  std::ofstream(fx / "daemonsets.json") << ds.dump(1);
  KubeServer server(fx, dir);
  const std::string cmd = server.env() + "PATH=" + bin.string() + ":$PATH SHARDTRAIN_DEPLOY_WAIT_S=1 " +
                          "SHARDTRAIN_DEPLOY_POLL_S=0.2 " + SHARDTRAIN_BINARY + " deploy apply --cluster " +
                          kRecipe.string() + " --out " + (dir / "out").string();
  const auto r = st::testing::run_shell(cmd);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("2 of 2 GPU nodes have its pod ready"), std::string::npos) << "the NVIDIA plugin's:\n" << r.out;
  EXPECT_NE(r.out.find("step 4 (Device plugins) failed: daemonset aws-efa-k8s-device-plugin/aws-efa-k8s-device-plugin "
                       "has 0 pods desired and 0 ready, but the node group gpu has 2 GPU nodes"),
            std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("[step 6/7]"), std::string::npos) << r.out;
}

TEST(DeployApply, ShortCapacityStopsBeforeAnythingIsCreated) {
  const fs::path dir = temp_dir("short");
  const fs::path bin = fake_tools(dir);
  const std::string cmd = "PATH=" + bin.string() + ":" + kKubectl.parent_path().string() + ":$PATH " +
                          SHARDTRAIN_BINARY + " deploy apply --cluster " + kRecipe.string() + " --out " +
                          (dir / "out").string();
  auto r = st::testing::run_shell("FAKE_QUOTA=64 " + cmd);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step 3 (Capacity, then the cluster and its node groups) failed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("is 64 vCPU but 2 x g6.12xlarge need 96"), std::string::npos) << r.out;
  EXPECT_EQ(read_file(dir / "calls.log").find("eksctl"), std::string::npos);
  fs::remove(dir / "calls.log");
  r = st::testing::run_shell("FAKE_OFFERED=0 " + cmd);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("does not offer g6.12xlarge"), std::string::npos) << r.out;
  EXPECT_EQ(read_file(dir / "calls.log").find("create"), std::string::npos);
}

TEST(DeployApply, AMissingToolIsNamedWithHowToGetIt) {
  const auto r = st::testing::run_shell("PATH=/usr/bin:/bin " + std::string(SHARDTRAIN_BINARY) +
                                        " deploy apply --cluster " + kRecipe.string() + " --out " +
                                        temp_dir("missing").string());
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("tools missing from PATH"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("eksctl: install eksctl"), std::string::npos) << r.out;
}

// The real helm too: the NVIDIA and EFA device plugins' charts (from helm.charts_dir,
// the published packages) installed into the test server with --wait in place of
// eksctl's EFA plugin, their DaemonSets' pods Ready on both GPU nodes for verify; the
// second run finds the releases deployed.
TEST(DeployApply, RealHelmInstallsTheDevicePlugin) {
  if (!have_tools() || !fs::exists(kKubectl.parent_path() / "helm")) GTEST_SKIP() << "kubectl or helm is missing";
  const fs::path charts = fs::path(SHARDTRAIN_SHARED_DIR) / "deploy/charts";
  if (!fs::exists(charts)) GTEST_SKIP() << "../shared/deploy/charts is absent";
  const fs::path dir = temp_dir("helm");
  const fs::path bin = fake_tools(dir, /*fake_helm=*/false);
  // The cluster as eksctl leaves it: the nodes (GPU nodes tainted nvidia.com/gpu) and
  // eksctl's EFA plugin, whose DaemonSet the test server runs where it would: nowhere
  // (the GPU taint is not tolerated, the system node's type is not an EFA type).
  const fs::path fx = dir / "fixtures";
  fs::create_directories(fx);
  fs::copy_file(kFixtures / "nodes.json", fx / "nodes.json");
  fs::copy_file(kEksctlEfa, fx / "eksctl-efa.json");
  std::string text = read_file(kRecipe);
  text.replace(text.find("[train]"), 7, "[helm]\ncharts_dir = \"" + charts.string() + "\"\n\n[train]");
  text.replace(text.find("\"../qwen2.5-1.5b.toml\""), 22, "\"" + (kRoot / "configs/qwen2.5-1.5b.toml").string() + "\"");
  const fs::path cluster = dir / "cluster.toml";
  std::ofstream(cluster) << text;
  KubeServer server(fx, dir);
  const std::string cmd = server.env() + "PATH=" + bin.string() + ":$PATH " + SHARDTRAIN_BINARY +
                          " deploy apply --cluster " + cluster.string() + " --out " + (dir / "out").string();
  // Before: eksctl's EFA plugin is on no GPU node, so they would advertise no EFA.
  auto r = st::testing::run_shell(server.env() + "kubectl get daemonset -n kube-system aws-efa-k8s-device-plugin "
                                  "-o jsonpath='{.status.desiredNumberScheduled}'");
  EXPECT_EQ(r.out, "0") << r.out;
  r = st::testing::run_shell(cmd);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("nvidia-device-plugin-0.20.0.tgz --version 0.20.0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("aws-efa-k8s-device-plugin-v0.5.30.tgz --version v0.5.30"), std::string::npos) << r.out;
  EXPECT_NE(read_file(dir / "out/deploy.log").find("STATUS: deployed"), std::string::npos);
  // eksctl's copy is gone; the chart's runs on both GPU nodes and nowhere else.
  r = st::testing::run_shell(server.env() + "kubectl get daemonsets --all-namespaces -o json");
  ASSERT_EQ(r.code, 0) << r.out;
  std::map<std::string, long> desired;
  const json listed = json::parse(r.out);
  for (const auto& d : listed["items"])
    desired[d["metadata"]["namespace"].get<std::string>() + "/" + d["metadata"]["name"].get<std::string>()] =
        d["status"]["desiredNumberScheduled"];
  EXPECT_EQ(desired.count("kube-system/aws-efa-k8s-device-plugin"), 0u) << r.out;
  EXPECT_EQ(desired["aws-efa-k8s-device-plugin/aws-efa-k8s-device-plugin"], 2) << r.out;
  EXPECT_EQ(desired["nvidia-device-plugin/nvidia-device-plugin"], 2) << r.out;
  r = st::testing::run_shell(server.env() + SHARDTRAIN_BINARY + " deploy verify --cluster " + cluster.string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("nvidia device plugin pod Ready     ok"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("efa device plugin pod Ready        ok"), std::string::npos) << r.out;
  r = st::testing::run_shell(cmd);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("skipped: release nvidia-device-plugin 0.20.0 is deployed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("skipped: release aws-efa-k8s-device-plugin v0.5.30 is deployed"), std::string::npos) << r.out;
}

TEST(DeployDestroy, AsksFirstUnlessYes) {
  const fs::path dir = temp_dir("destroy");
  const fs::path bin = fake_tools(dir);
  const std::string cmd = "PATH=" + bin.string() + ":$PATH " + SHARDTRAIN_BINARY + " deploy destroy --cluster " +
                          kRecipe.string() + " --out " + (dir / "out").string();
  auto r = st::testing::run_shell("echo no | " + cmd);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("not deleted"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "calls.log"));
  r = st::testing::run_shell("echo shardtrain-g6 | " + cmd);
  EXPECT_EQ(r.code, 0) << r.out;
  r = st::testing::run_shell(cmd + " --yes");
  EXPECT_EQ(r.code, 0) << r.out;
  const std::string calls = read_file(dir / "calls.log");
  EXPECT_NE(calls.find("eksctl delete cluster -f " + (dir / "out/eksctl-cluster.yaml").string() + " --wait"),
            std::string::npos) << calls;
  EXPECT_NE(calls.find("aws ec2 delete-placement-group --group-name shardtrain-g6-gpu"), std::string::npos) << calls;
}

// ---- submit: a two-pod tiny job on the test server's kubelet ---------------------------------

// The recipe turned into a CPU test job: the tiny model, a few steps, 4 ranks per pod
// over Gloo, a free rendezvous port; `expect` is train.expect_transport.
fs::path tiny_cluster(const fs::path& dir, const std::string& expect, int port, const std::string& engine = "job") {
  fs::create_directories(dir / "configs/deploy");
  fs::copy_file(kRoot / "configs/tiny.toml", dir / "configs/tiny.toml", fs::copy_options::overwrite_existing);
  std::string s = read_file(kRecipe);
  auto sub = [&](const std::string& a, const std::string& b) {
    const size_t at = s.find(a);
    ASSERT_NE(at, std::string::npos) << a;
    s.replace(at, a.size(), b);
  };
  sub("config = \"../qwen2.5-1.5b.toml\"", "config = \"../tiny.toml\"");
  sub("expect_transport = \"efa\"          # every rank refuses to train on anything else",
      "expect_transport = \"" + expect + "\"");
  sub("master_port = 29500", "master_port = " + std::to_string(port));
  sub("\"train.micro_batch\" = 4\n\"train.steps\" = 100\n\"train.log_every\" = 10",
      "\"train.device\" = \"cpu\"\n\"train.micro_batch\" = 2\n\"train.seq_len\" = 32\n\"train.steps\" = 3\n"
      "\"train.log_every\" = 1\n\"model.layers\" = 2\n\"data.source\" = \"random\"\n\"run.progress\" = \"off\"\n"
      "\"dist.timeout_s\" = 60");
  sub("# env = { FI_EFA_FORK_SAFE = \"1\" }", "env = { OPENBLAS_NUM_THREADS = \"1\" }");
  sub("engine = \"job\"", "engine = \"" + engine + "\"");
  const fs::path p = dir / "configs/deploy/tiny.toml";
  std::ofstream(p) << s;
  return p;
}

// The base fixtures without the worker pods (the job makes its own).
fs::path empty_cluster(const fs::path& dir, const std::function<void(json&)>& edit_nodes = {}) {
  const fs::path fx = dir / "fixtures";
  fs::create_directories(fx);
  json nodes = load(kFixtures / "nodes.json"), pods = load(kFixtures / "pods.json");
  if (edit_nodes) edit_nodes(nodes);
  json keep = json::array();
  for (const auto& p : pods["items"])
    if (p["metadata"]["namespace"] != "shardtrain") keep.push_back(p);
  pods["items"] = keep;
  std::ofstream(fx / "nodes.json") << nodes.dump(1);
  std::ofstream(fx / "pods.json") << pods.dump(1);
  fs::copy_file(kFixtures / "daemonsets.json", fx / "daemonsets.json");
  return fx;
}


// Steps 6 and 8's groundwork: the artifacts, and the workload (its ConfigMap holds the
// run config) applied to the test server.
st::testing::ShellResult apply_workload(const KubeServer& server, const fs::path& cluster, const fs::path& out) {
  return st::testing::run_shell(server.env() + SHARDTRAIN_BINARY + " deploy plan --cluster " + cluster.string() +
                                " --out " + out.string() + " && " + server.env() + "kubectl apply --server-side -f " +
                                (out / "workload.yaml").string());
}

std::string submit_cmd(const KubeServer& server, const fs::path& cluster, const fs::path& out, int timeout_s) {
  return server.env() + "SHARDTRAIN_DEPLOY_POLL_S=0.3 " + SHARDTRAIN_BINARY + " deploy submit --cluster " +
         cluster.string() + " --out " + out.string() + " --timeout-s " + std::to_string(timeout_s);
}

TEST(DeploySubmit, TwoPodTinyJobRunsToCompletion) {
  if (!have_tools()) GTEST_SKIP() << "kubectl (scripts/get_kube_tools.sh) or python3-yaml is missing";
  const fs::path dir = temp_dir("submit");
  const fs::path cluster = tiny_cluster(dir, "", test::free_port());
  KubeServer server(empty_cluster(dir), dir, true);
  const fs::path out = dir / "out";
  auto r = apply_workload(server, cluster, out);
  ASSERT_EQ(r.code, 0) << r.out;
  r = st::testing::run_shell(submit_cmd(server, cluster, out, 120));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("[pod 0] [rank 0] step 3/3"), std::string::npos) << r.out;  // rank 0's log, shown
  EXPECT_NE(r.out.find("world 8"), std::string::npos) << r.out;                     // 2 pods x 4 ranks
  EXPECT_NE(r.out.find("qwen-train completed: 2 of 2 pods succeeded"), std::string::npos) << r.out;
  r = st::testing::run_shell(server.env() + SHARDTRAIN_BINARY + " deploy status --cluster " + cluster.string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Succeeded  ip-10-42-1-11"), std::string::npos) << r.out;
  r = st::testing::run_shell(server.env() + SHARDTRAIN_BINARY + " deploy logs --rank 0 --cluster " + cluster.string());
  EXPECT_NE(r.out.find("[rank 0] done: 3 steps"), std::string::npos) << r.out;
  r = st::testing::run_shell(server.env() + SHARDTRAIN_BINARY + " deploy down --cluster " + cluster.string() +
                             " --out " + out.string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("deleted"), std::string::npos) << r.out;
}

// Pods of an earlier Job of the same name that outlived it (deleted with
// --cascade=orphan, or not yet collected): Succeeded, with that Job's UID.
void add_leftover_pods(const fs::path& fx) {
  json pods = load(fx / "pods.json");
  const std::string old_uid = "5e1d0c2b-0000-4000-8000-0000000000aa";
  for (int i = 0; i < 2; ++i) {
    json p = load(kFixtures / "pods.json")["items"][2 + 3 * i];  // qwen-train-0-..., qwen-train-1-...
    p["metadata"]["name"] = "qwen-train-" + std::to_string(i) + "-old" + std::to_string(i);
    p["metadata"]["labels"]["batch.kubernetes.io/controller-uid"] = old_uid;
    p["metadata"]["labels"]["controller-uid"] = old_uid;
    p["metadata"]["ownerReferences"][0]["uid"] = old_uid;
    p["status"]["phase"] = "Succeeded";
    pods["items"].push_back(p);
  }
  std::ofstream(fx / "pods.json") << pods.dump(1);
}

TEST(DeploySubmit, ARankThatCannotMeetItsTransportIsNamed) {
  if (!have_tools()) GTEST_SKIP() << "kubectl (scripts/get_kube_tools.sh) or python3-yaml is missing";
  const fs::path dir = temp_dir("gate");
  const fs::path cluster = tiny_cluster(dir, "efa", test::free_port());
  // Succeeded pods of an earlier qwen-train are there too: only this Job's pods count.
  const fs::path fx = empty_cluster(dir);
  add_leftover_pods(fx);
  KubeServer server(fx, dir, true);
  const fs::path out = dir / "out";
  auto r = apply_workload(server, cluster, out);
  ASSERT_EQ(r.code, 0) << r.out;
  r = st::testing::run_shell(submit_cmd(server, cluster, out, 120));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("qwen-train failed:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fabric.expect_transport=efa checks NCCL's transport"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step 1/3"), std::string::npos) << "no step may run: " << r.out;
  EXPECT_EQ(r.out.find("-old"), std::string::npos) << "a pod of the earlier job was followed: " << r.out;
  EXPECT_EQ(r.out.find("completed"), std::string::npos) << r.out;
  r = st::testing::run_shell(server.env() + SHARDTRAIN_BINARY + " deploy status --cluster " + cluster.string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("-old"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Failed"), std::string::npos) << r.out;
}

TEST(DeploySubmit, PendingPodsSayWhy) {
  if (!have_tools()) GTEST_SKIP() << "kubectl (scripts/get_kube_tools.sh) or python3-yaml is missing";
  const fs::path dir = temp_dir("pending");
  const fs::path cluster = tiny_cluster(dir, "", test::free_port());
  // The second GPU node advertises no EFA: pod 1 fits nowhere.
  KubeServer server(empty_cluster(dir, [](json& nodes) {
                      nodes["items"][1]["status"]["allocatable"].erase("vpc.amazonaws.com/efa");
                    }),
                    dir, true);
  const fs::path out = dir / "out";
  auto r = apply_workload(server, cluster, out);
  ASSERT_EQ(r.code, 0) << r.out;
  r = st::testing::run_shell(submit_cmd(server, cluster, out, 3));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Pending (Unschedulable: 0/3 nodes are available:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 Insufficient vpc.amazonaws.com/efa"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("did not finish within 3 s"), std::string::npos) << r.out;
}


// ---- apply --train: each engine's run on the test cluster, its operator emulated -------------

// `deploy apply --train` on the recipe turned tiny, with aws, eksctl and helm as fakes
// and the real kubectl against the test server, whose kubelet and operators run the
// job (tests/support/README.md): every step, then the run followed to its end.
st::testing::ShellResult apply_train(const fs::path& dir, const std::string& engine, const std::string& expect,
                                     std::string* secret_env = nullptr) {
  const fs::path cluster = tiny_cluster(dir, expect, test::free_port(), engine);
  const fs::path bin = fake_tools(dir);
  KubeServer server(empty_cluster(dir), dir, true);
  const std::string cmd = server.env() + "PATH=" + bin.string() + ":$PATH SHARDTRAIN_DEPLOY_POLL_S=0.3 " +
                          "SHARDTRAIN_DEPLOY_WAIT_S=30 timeout 240 " + SHARDTRAIN_BINARY + " deploy apply --train --cluster " +
                          cluster.string() + " --out " + (dir / "out").string();
  auto r = st::testing::run_shell(cmd);
  if (secret_env) {  // what the secret looks like from the cluster: the Secret and a worker's env
    *secret_env = st::testing::run_shell(server.env() + "kubectl -n shardtrain get secret qwen-train-job-secret "
                                         "-o jsonpath='{.data.SHARDTRAIN_JOB_SECRET}' | base64 -d").out;
  }
  return r;
}

class ApplyTrain : public ::testing::TestWithParam<std::string> {};

TEST_P(ApplyTrain, ReachesACompletedRun) {
  if (!have_tools()) GTEST_SKIP() << "kubectl (scripts/get_kube_tools.sh) or python3-yaml is missing";
  const std::string engine = GetParam();
  const fs::path dir = temp_dir("train-" + engine);
  std::string secret;
  const auto r = apply_train(dir, engine, "", &secret);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("[step 8/8] Submit and follow"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("world 8"), std::string::npos) << r.out;  // 2 pods x 4 ranks, one rendezvous
  EXPECT_NE(r.out.find("done: 3 steps"), std::string::npos) << r.out;
  // The rendezvous ran with the run's secret from its Secret: rank 0 did not warn.
  EXPECT_EQ(r.out.find("no job secret"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("job secret shardtrain/qwen-train-job-secret created"), std::string::npos) << r.out;
  EXPECT_EQ(secret.size(), 64u) << secret;
  EXPECT_EQ(read_file(dir / "out/deploy.log").find(secret), std::string::npos) << "the secret was logged";
  if (engine == "job") {
    EXPECT_NE(r.out.find("[pod 0] [rank 0] step 3/3"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("qwen-train completed: 2 of 2 pods succeeded"), std::string::npos) << r.out;
  } else if (engine == "kuberay") {
    // The RayJob's transitions, then the driver's log (both nodes' launch through it).
    for (const char* s : {"rayjob qwen-train: Running",
                          "rayjob qwen-train: Complete (job SUCCEEDED)", "[driver] waiting for 2 nodes with 4 GPUs",
                          "[driver] [node 0] [rank 0] step 3/3", "[driver] ray_driver: all 2 nodes exited 0",
                          "qwen-train completed: rayjob Complete, job SUCCEEDED"})
      EXPECT_NE(r.out.find(s), std::string::npos) << s << " in:\n" << r.out;
    EXPECT_LT(r.out.find("rayjob qwen-train: Running"), r.out.find("Complete (job SUCCEEDED)")) << r.out;
  } else {
    // Created lasts only while the pods are Pending, which a poll may miss here;
    // Running lasts the whole run.
    for (const char* s : {"pytorchjob qwen-train: Running", "pytorchjob qwen-train: Succeeded",
                          "pod qwen-train-master-0: Running", "pod qwen-train-worker-0: Running",
                          "[master] [rank 0] step 3/3", "qwen-train completed: pytorchjob Succeeded"})
      EXPECT_NE(r.out.find(s), std::string::npos) << s << " in:\n" << r.out;
    EXPECT_LT(r.out.find("pytorchjob qwen-train: Running"), r.out.find("pytorchjob qwen-train: Succeeded")) << r.out;
  }
}

// The same run with a transport the CPU ranks cannot meet: every engine's submit
// exits non-zero, naming the cause as its controller reports it and the rank's line.
TEST_P(ApplyTrain, AFailedRunIsNamed) {
  if (!have_tools()) GTEST_SKIP() << "kubectl (scripts/get_kube_tools.sh) or python3-yaml is missing";
  const std::string engine = GetParam();
  const auto r = apply_train(temp_dir("train-fail-" + engine), engine, "efa");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("deploy submit: qwen-train failed: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fabric.expect_transport=efa checks NCCL's transport"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("completed"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step 1/3"), std::string::npos) << "no step may run: " << r.out;
  if (engine == "kuberay")
    EXPECT_NE(r.out.find("failed: rayjob Failed (job FAILED), reason AppFailed: Job entrypoint command failed with "
                         "exit code 1"),
              std::string::npos) << r.out;
  if (engine == "pytorchjob")
    EXPECT_NE(r.out.find("failed: pytorchjob Failed: PyTorchJob shardtrain/qwen-train has failed because 1 "),
              std::string::npos) << r.out;
  if (engine == "job") EXPECT_NE(r.out.find("failed: job "), std::string::npos) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Engines, ApplyTrain, ::testing::Values("job", "kuberay", "pytorchjob"));

}  // namespace
}  // namespace st

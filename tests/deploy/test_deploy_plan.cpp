// `deploy plan`: the cluster file, the rendered artifacts against the real published
// schemas (strict), the worker pod the recipe asks for, one test per preflight
// refusal, golden files for the recipe, and the CLI end to end.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "cli/deploy_memory.h"
#include "core/error.h"
#include "core/log.h"
#include "deploy/cluster_file.h"
#include "deploy/memory_fit.h"
#include "deploy/prediction.h"
#include "deploy/preflight.h"
#include "deploy/render.h"
#include "deploy/tools.h"
#include "train/memory_plan.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/schema_check.h"
#include "support/shell.h"
#include "support/temp_dir.h"

namespace st {
namespace {

namespace fs = std::filesystem;

const fs::path kRoot = SHARDTRAIN_SOURCE_DIR;
const fs::path kRecipe = kRoot / "configs/deploy/eks-g6-efa.toml";
const fs::path kRecipeRay = kRoot / "configs/deploy/eks-g6-efa-kuberay.toml";

using testing::error_of;
using testing::read_file;
using testing::temp_dir;

// The recipe with `edit` applied to its text (a line replaced or added), written
// next to a copy of the run config it points to.
fs::path variant(const std::string& name, const std::vector<std::pair<std::string, std::string>>& edits,
                 const fs::path& from = kRecipe) {
  std::string text = read_file(from);
  for (const auto& [old, repl] : edits) {
    if (old.empty()) {
      text += "\n" + repl + "\n";
      continue;
    }
    const size_t at = text.find(old);
    if (at == std::string::npos) throw std::runtime_error("variant " + name + ": '" + old + "' not in the recipe");
    text.replace(at, old.size(), repl);
  }
  const fs::path dir = temp_dir(name) / "deploy";
  fs::create_directories(dir);
  fs::copy_file(kRoot / "configs/qwen2.5-1.5b.toml", dir.parent_path() / "qwen2.5-1.5b.toml");
  const fs::path p = dir / "cluster.toml";
  std::ofstream(p) << text;
  return p;
}

std::vector<nlohmann::json> docs_of(const std::vector<Artifact>& arts, const std::string& file) {
  for (const Artifact& a : arts)
    if (a.file == file) return yaml_documents(a.text, file);
  return {};
}

const nlohmann::json* find_kind(const std::vector<nlohmann::json>& docs, const std::string& kind) {
  for (const auto& d : docs)
    if (d.value("kind", "") == kind) return &d;
  return nullptr;
}

std::string env_value(const nlohmann::json& container, const std::string& name) {
  for (const auto& e : container["env"])
    if (e["name"] == name) return e["value"];
  return "(unset)";
}

// ---- the cluster file --------------------------------------------------------------

TEST(ClusterFile, TheRecipeLoads) {
  const ClusterSpec s = load_cluster_file(kRecipe.string());
  EXPECT_EQ(s.name, "shardtrain-g6");
  EXPECT_EQ(s.gpu.instance_type, "g6.12xlarge");
  EXPECT_EQ(s.gpu.count, 2);
  EXPECT_TRUE(s.gpu.efa);
  // The recipe's pod: 4 GPU, 1 EFA, 40 CPU, 160Gi on a 48-vCPU, 192-GiB node.
  EXPECT_EQ(s.pod_gpus, 4);
  EXPECT_EQ(s.pod_efa, 1);
  EXPECT_EQ(s.pod_cpu, 40);
  EXPECT_EQ(s.pod_memory_gib, 160);
  EXPECT_EQ(s.world(), 8);
  // The run config: the file it names, then [train.set].
  EXPECT_EQ(s.run.model.num_params(), 1'543'714'304LL);
  EXPECT_EQ(s.run.train.micro_batch, 4);
  EXPECT_EQ(s.run.train.steps, 100);
  EXPECT_EQ(s.run.train.device, "cuda");
  EXPECT_EQ(s.run.fabric.expect_transport, "efa");
}

TEST(ClusterFile, BadInputNamesTheFileKeyAndLine) {
  struct Case {
    std::string old, repl, expect;
  };
  const std::vector<Case> cases = {
      {"count = 2", "count = 2\nzone = \"us-west-2a\"", "unknown key 'nodes.gpu.zone' at line"},
      {"count = 2", "count = \"two\"", "key 'nodes.gpu.count' must be an integer, got a string (line"},
      {"engine = \"job\"", "engine = \"slurm\"", "workload.engine must be one of job, kuberay, pytorchjob, got 'slurm'"},
      {"instance_type = \"g6.12xlarge\"", "instance_type = \"g7.mega\"", "nodes.gpu.instance_type = 'g7.mega' is not in"},
      {"\"train.steps\" = 100", "\"train.stepz\" = 100", "unknown key 'train.stepz'"},
      {"\"train.steps\" = 100", "\"train.steps\" = 0", "train.steps must be >= 1"},
      {"config = \"../qwen2.5-1.5b.toml\"", "config = \"../none.toml\"", "train.config = '../none.toml'"},
      {"name = \"qwen-train\"", "name = \"Qwen_Train\"", "workload.name = 'Qwen_Train' must be lower-case"},
      {"[cluster.vpc]", "[cluster.vpc\n", "TOML syntax error"},
      {"expect_transport = \"efa\"", "expect_transport = \"infiniband\"", "train.expect_transport must be one of"},
  };
  for (const Case& c : cases) {
    const fs::path p = variant("bad", {{c.old, c.repl}});
    std::string err;
    ErrorKind kind = ErrorKind::Runtime;
    try {
      load_cluster_file(p.string());
    } catch (const Error& e) {
      err = e.what();
      kind = e.kind();
    }
    EXPECT_NE(err.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in: " << err;
    EXPECT_NE(err.find(p.string()), std::string::npos) << err;
    EXPECT_EQ(kind, ErrorKind::Usage) << "a configuration error (exit 2): " << err;
  }
}

// ---- rendered artifacts against the real schemas -----------------------------------

void expect_all_valid(const std::vector<Artifact>& arts, testing::SchemaSet& schemas, const std::string& what) {
  int checked = 0;
  for (const Artifact& a : arts) {
    if (a.docs.empty() || a.file.rfind("helm/", 0) == 0) continue;
    for (const nlohmann::json& d : yaml_documents(a.text, a.file)) {
      EXPECT_EQ(schemas.validate(d), "") << what << " " << a.file;
      ++checked;
    }
  }
  EXPECT_GE(checked, 5) << what;
}

TEST(DeployPlan, EveryManifestPassesThePublishedSchemasStrictly) {
  if (!testing::have_shared_deploy()) GTEST_SKIP() << "../shared/deploy is absent: the published schemas are not here";
  testing::SchemaSet schemas;
  for (const fs::path& f : {kRecipe, kRecipeRay}) expect_all_valid(render_artifacts(load_cluster_file(f.string())), schemas, f.filename());
  const fs::path pt = variant("pytorchjob", {{"engine = \"job\"", "engine = \"pytorchjob\""}});
  expect_all_valid(render_artifacts(load_cluster_file(pt.string())), schemas, "pytorchjob");
  // The validator is strict: a misspelt field and a number where a string belongs fail.
  nlohmann::json job = docs_of(render_artifacts(load_cluster_file(kRecipe.string())), "job.yaml")[0];
  job["spec"]["template"]["spec"]["nodeSelecter"] = {{"a", "b"}};
  EXPECT_NE(schemas.validate(job), "");
  nlohmann::json ray = *find_kind(docs_of(render_artifacts(load_cluster_file(kRecipeRay.string())), "workload.yaml"),
                                  "RayCluster");
  ray["spec"]["workerGroupSpecs"][0]["rayStartParams"]["num-gpus"] = 4;  // map of strings
  EXPECT_NE(schemas.validate(ray), "");
}

// The training operator takes MASTER_PORT from the container port named
// pytorchjob-port (adding one at 23456 when there is none): it must be ours.
TEST(DeployPlan, PyTorchJobUsesTheMasterPort) {
  const fs::path pt = variant("pytorchjob_port", {{"engine = \"job\"", "engine = \"pytorchjob\""},
                                                  {"master_port = 29500", "master_port = 29611"}});
  const nlohmann::json job = docs_of(render_artifacts(load_cluster_file(pt.string())), "job.yaml").at(0);
  ASSERT_EQ(job["kind"], "PyTorchJob");
  for (const char* role : {"Master", "Worker"}) {
    const nlohmann::json c = job["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]["containers"][0];
    EXPECT_EQ(c["name"], "pytorch") << role;
    ASSERT_EQ(c["ports"].size(), 1u) << role;
    EXPECT_EQ(c["ports"][0]["name"], "pytorchjob-port") << role;
    EXPECT_EQ(c["ports"][0]["containerPort"], 29611) << role;
  }
}

TEST(DeployPlan, TheWorkerPodIsTheRecipes) {
  const ClusterSpec s = load_cluster_file(kRecipe.string());
  const auto arts = render_artifacts(s);
  const nlohmann::json job = docs_of(arts, "job.yaml").at(0);
  EXPECT_EQ(job["kind"], "Job");
  EXPECT_EQ(job["spec"]["completionMode"], "Indexed");
  EXPECT_EQ(job["spec"]["completions"], 2);
  const nlohmann::json pod = job["spec"]["template"]["spec"];
  EXPECT_EQ(pod["subdomain"], "qwen-train");  // the headless Service: pods get DNS names
  EXPECT_EQ(pod["nodeSelector"]["nvidia.com/gpu.present"], "true");
  EXPECT_TRUE(non_guaranteed_containers(pod).empty());
  const nlohmann::json c = pod["containers"][0];
  const nlohmann::json want = {{"cpu", "40"}, {"memory", "160Gi"}, {"nvidia.com/gpu", "4"}, {"vpc.amazonaws.com/efa", "1"}};
  EXPECT_EQ(c["resources"]["requests"], want);
  EXPECT_EQ(c["resources"]["limits"], want);
  EXPECT_EQ(env_value(c, "FI_PROVIDER"), "efa");
  EXPECT_EQ(env_value(c, "NCCL_NET_PLUGIN"), "ofi");
  EXPECT_EQ(env_value(c, "NCCL_SOCKET_IFNAME"), "eth0");
  EXPECT_EQ(env_value(c, "NCCL_DEBUG"), "INFO");
  EXPECT_EQ(env_value(c, "FI_EFA_USE_DEVICE_RDMA"), "(unset)");  // L4 nodes: no GPUDirect RDMA
  EXPECT_EQ(env_value(c, "SHARDTRAIN_NNODES"), "2");
  EXPECT_EQ(env_value(c, "SHARDTRAIN_SERVICE"), "qwen-train");
  // The Job's UID is the job identity the rendezvous checks.
  bool job_id = false;
  for (const auto& e : c["env"])
    job_id |= e["name"] == "SHARDTRAIN_JOB_ID" &&
              e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['batch.kubernetes.io/controller-uid']";
  EXPECT_TRUE(job_id) << c["env"].dump();
  const std::string cmd = c["command"].dump();
  EXPECT_NE(cmd.find("\"--expect-transport\",\"efa\""), std::string::npos) << cmd;
  EXPECT_NE(cmd.find("\"--nproc-per-node\",\"4\""), std::string::npos) << cmd;
  // A memory-backed /dev/shm (the container default of 64 MiB breaks NCCL).
  bool shm = false;
  for (const auto& v : pod["volumes"]) shm |= v["name"] == "dshm" && v["emptyDir"]["medium"] == "Memory";
  EXPECT_TRUE(shm);
  // The Service is headless and selects the Job's pods.
  const std::vector<nlohmann::json> workload = docs_of(arts, "workload.yaml");
  const nlohmann::json* svc = find_kind(workload, "Service");
  ASSERT_TRUE(svc);
  EXPECT_EQ((*svc)["spec"]["clusterIP"], "None");
  EXPECT_EQ((*svc)["spec"]["selector"], job["spec"]["template"]["metadata"]["labels"]);
  // The ConfigMap holds the resolved run config, which loads back to the same run.
  const nlohmann::json* cm = find_kind(workload, "ConfigMap");
  ASSERT_TRUE(cm);
  const fs::path back = temp_dir("cm") / "config.toml";
  std::ofstream(back) << (*cm)["data"]["config.toml"].get<std::string>();
  const RunConfig r = load_run_config(back.string(), {});
  EXPECT_EQ(run_config_toml(r), run_config_toml(s.run));
  // A p5 node would also get GPUDirect RDMA over EFA.
  const fs::path p5 = variant("p5", {{"instance_type = \"g6.12xlarge\"", "instance_type = \"p5.48xlarge\""}});
  const auto p5_job = docs_of(render_artifacts(load_cluster_file(p5.string())), "job.yaml").at(0);
  EXPECT_EQ(env_value(p5_job["spec"]["template"]["spec"]["containers"][0], "FI_EFA_USE_DEVICE_RDMA"), "1");
}

// With a checkpoint claim every worker mounts it, and the run checkpoints there and
// resumes from it: a pod the Job starts again continues.
TEST(DeployPlan, ACheckpointClaimIsMountedAndResumedFrom) {
  const fs::path p = variant("claim", {{"master_port = 29500", "master_port = 29500\ncheckpoint_claim = \"fsx\""},
                                       {"\"train.steps\" = 100", "\"train.steps\" = 100\n\"run.checkpoint_every\" = 50"}});
  const ClusterSpec s = load_cluster_file(p.string());
  EXPECT_EQ(s.run.run.checkpoint_dir, "/checkpoints/qwen-train");
  EXPECT_EQ(s.run.run.resume, "auto");
  const nlohmann::json pod = docs_of(render_artifacts(s), "job.yaml").at(0)["spec"]["template"]["spec"];
  bool volume = false, mount = false;
  for (const auto& v : pod["volumes"]) volume |= v.value("name", "") == "checkpoints" && v["persistentVolumeClaim"]["claimName"] == "fsx";
  for (const auto& m : pod["containers"][0]["volumeMounts"]) mount |= m["mountPath"] == "/checkpoints";
  EXPECT_TRUE(volume && mount) << pod.dump();
}

TEST(DeployPlan, KubeRayHeadIsCpuOnlyAndWorkersAdvertiseTheirGpus) {
  const auto arts = render_artifacts(load_cluster_file(kRecipeRay.string()));
  const std::vector<nlohmann::json> workload = docs_of(arts, "workload.yaml");
  const nlohmann::json* rc = find_kind(workload, "RayCluster");
  ASSERT_TRUE(rc);
  const auto& head = (*rc)["spec"]["headGroupSpec"];
  EXPECT_EQ(head["rayStartParams"]["num-gpus"], "0");
  EXPECT_EQ(head["serviceType"], "ClusterIP");
  EXPECT_EQ(env_value(head["template"]["spec"]["containers"][0], "NVIDIA_VISIBLE_DEVICES"), "void");
  EXPECT_FALSE(head["template"]["spec"]["containers"][0]["resources"]["limits"].contains("nvidia.com/gpu"));
  const auto& wg = (*rc)["spec"]["workerGroupSpecs"][0];
  EXPECT_EQ(wg["replicas"], 2);
  const auto& worker = wg["template"]["spec"]["containers"][0];
  EXPECT_EQ(wg["rayStartParams"]["num-gpus"], worker["resources"]["limits"]["nvidia.com/gpu"]);
  EXPECT_TRUE(non_guaranteed_containers(wg["template"]["spec"]).empty());
  EXPECT_EQ(env_value(worker, "FI_PROVIDER"), "efa");
  const nlohmann::json rj = docs_of(arts, "job.yaml").at(0);
  EXPECT_EQ(rj["kind"], "RayJob");
  const std::string entry = rj["spec"]["entrypoint"];
  EXPECT_NE(entry.find("ray_driver.py --nnodes 2 --nproc-per-node 4"), std::string::npos) << entry;
  EXPECT_NE(entry.find("--expect-transport efa"), std::string::npos) << entry;
  bool values = false;
  for (const Artifact& a : arts) values |= a.file == "helm/kuberay-operator.values.yaml";
  EXPECT_TRUE(values);
}

TEST(DeployPlan, NonGuaranteedPodsAreFound) {
  const ClusterSpec s = load_cluster_file(kRecipe.string());
  nlohmann::json pod = nlohmann::json::parse(worker_pod_spec(s, {"x"}).dump());
  EXPECT_TRUE(non_guaranteed_containers(pod).empty());
  pod["containers"][0]["resources"]["requests"]["cpu"] = "20";
  EXPECT_EQ(non_guaranteed_containers(pod), std::vector<std::string>{"shardtrain"});
  pod["containers"][0]["resources"].erase("limits");
  EXPECT_EQ(non_guaranteed_containers(pod).size(), 1u);
}

// ---- preflight: one refusal each -----------------------------------------------------

TEST(Preflight, TheRecipePassesWithNotes) {
  const auto f = preflight(load_cluster_file(kRecipe.string()), {});
  for (const Finding& x : f) EXPECT_FALSE(x.refusal) << x.key << ": " << x.message;
  bool region_note = false;
  for (const Finding& x : f) region_note |= x.message.find("availability varies by region") != std::string::npos;
  EXPECT_TRUE(region_note);
}

TEST(Preflight, EachRefusalNamesItsKey) {
  struct Case {
    std::vector<std::pair<std::string, std::string>> edits;
    std::string key, expect;
    std::optional<long> quota = std::nullopt;
  };
  const std::vector<Case> cases = {
      {{{"zones = [\"us-west-2a\"]", "zones = [\"us-west-2a\", \"us-west-2b\"]"}}, "nodes.gpu.zones",
       "EFA traffic does not cross availability zones"},
      {{{"zones = [\"us-west-2a\"]", "zones = [\"us-west-2c\"]"}}, "nodes.gpu.zones", "not one of cluster.zones"},
      {{{"zones = [\"us-west-2a\", \"us-west-2b\"]", "zones = [\"us-west-2a\"]"}}, "cluster.zones", "at least two"},
      {{{"create = true", "create = true\nid = \"vpc-123\""}}, "cluster.vpc.create", "existing one"},
      {{{"create = true", "create = false\nid = \"vpc-1\"\nprivate_subnets = { \"us-west-2a\" = \"subnet-a\" }"}},
       "cluster.vpc.private_subnets", "no private subnet for zone 'us-west-2b'"},
      {{{"", "[workload.resources]\nefa = 2"}}, "workload.resources.efa", "asks for 2 vpc.amazonaws.com/efa but "
                                                                          "g6.12xlarge has 1"},
      {{{"efa = true", "efa = false"}}, "train.expect_transport", "every rank would refuse"},
      // EFA on, an EFA transport expected, and pods that ask for no EFA device.
      {{{"", "[workload.resources]\nefa = 0"}}, "workload.resources.efa",
       "ask for no vpc.amazonaws.com/efa but train.expect_transport = \"efa\""},
      {{{"expect_transport = \"efa\"", "expect_transport = \"\""}, {"", "[workload.resources]\nefa = 0"}},
       "workload.resources.efa", "ask for no vpc.amazonaws.com/efa but fabric.transport = \"efa\""},
      {{{"", "[workload.resources]\ngpus = 2"}}, "workload.resources.gpus", "g6.12xlarge has 4, the pod asks for 2"},
      {{{"", "[workload.resources]\ncpu = 48"}}, "workload.resources.cpu", "asks for 48 CPU but a g6.12xlarge node"},
      {{{"", "[workload.resources]\nmemory_gib = 191"}}, "workload.resources.memory_gib", "GiB allocatable"},
      {{{"digest = \"sha256:0000000000000000000000000000000000000000000000000000000000000000\"\n", ""},
        {"allow_unpinned = true", "allow_unpinned = false"}},
       "image.digest", "is not pinned"},
      // The samples' placeholder digests, without allow_unpinned.
      {{{"allow_unpinned = true", "allow_unpinned = false"}}, "image.digest",
       "the image the pods run is the all-zero placeholder, which no registry has"},
      {{{"allow_unpinned = true", "allow_unpinned = false"}}, "image.base",
       "the Dockerfile's base is the all-zero placeholder"},
      {{{"digest = \"sha256:0000000000000000000000000000000000000000000000000000000000000000\"\n",
         "digest = \"sha256:abc\"\n"}},
       "image.digest", "is not a digest"},
      {{{"-ubuntu24.04@sha256:0000000000000000000000000000000000000000000000000000000000000000", "-ubuntu24.04"},
        {"allow_unpinned = true", "allow_unpinned = false"}},
       "image.base", "not pinned by digest"},
      {{{"capacity = \"on-demand\"", "capacity = \"reservation\""}}, "nodes.gpu.capacity_reservation_id", "cr-"},
      // The EFA installer unchecked, and a checksum that is none.
      {{{"allow_unpinned = true", "allow_unpinned = false"}}, "image.efa_installer_sha256",
       "downloads the EFA installer without a checksum"},
      {{{"allow_unpinned = true", "allow_unpinned = true\nefa_installer_sha256 = \"abc\""}},
       "image.efa_installer_sha256", "'abc' is not a SHA-256"},
      {{}, "nodes.gpu.count", "need 96 vCPU of \"Running On-Demand G and VT instances\" (L-DB2E81BA) but the quota is 64",
       64},
      {{{"\"train.steps\" = 100", "\"train.steps\" = 100\n\"dist.shard_group_size\" = 3"}}, "train.set",
       "does not divide the world of 8 ranks"},
      // FP8 on A10Gs: every rank would refuse it once the nodes run.
      {{{"instance_type = \"g6.12xlarge\"", "instance_type = \"g5.12xlarge\""},
        {"\"train.steps\" = 100", "\"train.steps\" = 100\n\"train.matmul_dtype\" = \"fp8\""}},
       "train.matmul_dtype", "on a g5.12xlarge, but the A10G has compute capability 8.6"},
  };
  for (const Case& c : cases) {
    const ClusterSpec s = load_cluster_file(variant("pf", c.edits).string());
    PreflightOptions o;
    o.vcpu_quota = c.quota;
    bool found = false;
    std::string all;
    for (const Finding& f : preflight(s, o)) {
      all += (f.refusal ? "refusal " : "note ") + f.key + ": " + f.message + "\n";
      found |= f.refusal && f.key == c.key && f.message.find(c.expect) != std::string::npos;
    }
    EXPECT_TRUE(found) << "expected a refusal on " << c.key << " saying '" << c.expect << "', got:\n" << all;
  }
  // A quota that is enough passes.
  PreflightOptions enough;
  enough.vcpu_quota = 96;
  for (const Finding& f : preflight(load_cluster_file(kRecipe.string()), enough)) EXPECT_FALSE(f.refusal) << f.message;
}

TEST(Preflight, AllocatableFollowsTheEksFormula) {
  const Allocatable a = eks_allocatable(*find_instance("g6.12xlarge"));
  EXPECT_NEAR(a.cpu, 48 - (0.06 + 0.01 + 0.01 + 44 * 0.0025), 1e-9);
  EXPECT_NEAR(a.memory_gib, 192 - (255 + 11 * 234 + 100) / 1024.0, 1e-9);
}

// A pod that takes fewer of the node's EFA interfaces than it has is planned, with a
// note saying so; one that takes them all gets none.
TEST(Preflight, FewerEfaInterfacesThanTheInstanceHasIsNoted) {
  auto efa_notes = [](const std::vector<std::pair<std::string, std::string>>& edits) {
    std::string notes;
    for (const Finding& f : preflight(load_cluster_file(variant("efa-share", edits).string()), {})) {
      EXPECT_FALSE(f.refusal && f.key == "workload.resources.efa") << f.message;
      if (f.key == "workload.resources.efa") notes += f.message + "\n";
    }
    return notes;
  };
  const std::pair<std::string, std::string> p4d = {"instance_type = \"g6.12xlarge\"", "instance_type = \"p4d.24xlarge\""};
  const std::string one = efa_notes({p4d, {"", "[workload.resources]\nefa = 1"}});
  EXPECT_NE(one.find("a pod asks for 1 of the 4 EFA interfaces of a p4d.24xlarge"), std::string::npos) << one;
  EXPECT_EQ(efa_notes({p4d}), "");                                                 // derived: all 4
  EXPECT_EQ(efa_notes({p4d, {"", "[workload.resources]\nefa = 4"}}), "");
  EXPECT_EQ(efa_notes({}), "");                                                    // g6.12xlarge: its one
}

std::string plan_commands(const ClusterSpec& s) {
  std::string out;
  for (const PlanStep& st : plan_steps(s, "OUT")) {
    for (const auto& c : st.commands) out += shell_line(c) + "\n";
    for (const auto& n : st.notes) out += "note: " + n + "\n";
  }
  return out;
}

// A capacity reservation has its own placement: the GPU node group gets no placement
// group of ours, none is created or deleted. On demand, the EFA nodes keep theirs.
TEST(DeployPlan, ACapacityReservationGetsNoPlacementGroupOfOurs) {
  const ClusterSpec cr = load_cluster_file(
      variant("cr", {{"capacity = \"on-demand\"", "capacity = \"reservation\"\ncapacity_reservation_id = "
                                                  "\"cr-0123456789abcdef0\""}}).string());
  const auto gpu = docs_of(render_artifacts(cr), "eksctl-cluster.yaml").at(0)["managedNodeGroups"][1];
  EXPECT_FALSE(gpu.contains("placement")) << gpu.dump();
  EXPECT_EQ(gpu["capacityReservation"]["capacityReservationTarget"]["capacityReservationID"], "cr-0123456789abcdef0");
  const std::string cmds = plan_commands(cr);
  EXPECT_EQ(cmds.find("create-placement-group"), std::string::npos) << cmds;
  EXPECT_NE(cmds.find("aws ec2 describe-capacity-reservations --capacity-reservation-ids cr-0123456789abcdef0"),
            std::string::npos) << cmds;
  EXPECT_NE(cmds.find("note: no placement group of ours: capacity reservation cr-0123456789abcdef0"),
            std::string::npos) << cmds;

  const ClusterSpec od = load_cluster_file(kRecipe.string());
  const auto od_gpu = docs_of(render_artifacts(od), "eksctl-cluster.yaml").at(0)["managedNodeGroups"][1];
  EXPECT_EQ(od_gpu["placement"]["groupName"], "shardtrain-g6-gpu");
  EXPECT_NE(plan_commands(od).find("aws ec2 create-placement-group --group-name shardtrain-g6-gpu --strategy cluster"),
            std::string::npos);
}

// The EFA plugin's image from the cluster's own region's EKS registry (the chart's
// default is us-west-2's), including the regions with an account of their own.
TEST(DeployPlan, TheEfaPluginImageComesFromTheClustersRegion) {
  for (const auto& [region, registry] : std::vector<std::pair<std::string, std::string>>{
           {"us-east-1", "602401143452.dkr.ecr.us-east-1.amazonaws.com"},
           {"eu-south-1", "590381155156.dkr.ecr.eu-south-1.amazonaws.com"},
           {"cn-north-1", "918309763551.dkr.ecr.cn-north-1.amazonaws.com.cn"}}) {
    const ClusterSpec s = load_cluster_file(
        variant("region-" + region, {{"region = \"us-west-2\"", "region = \"" + region + "\""},
                                     {"zones = [\"us-west-2a\", \"us-west-2b\"]",
                                      "zones = [\"" + region + "a\", \"" + region + "b\"]"},
                                     {"zones = [\"us-west-2a\"]", "zones = [\"" + region + "a\"]"}})
            .string());
    for (const Finding& f : preflight(s, {})) EXPECT_FALSE(f.refusal) << region << ": " << f.key << ": " << f.message;
    const auto values = docs_of(render_artifacts(s), "helm/aws-efa-k8s-device-plugin.values.yaml").at(0);
    EXPECT_EQ(values["image"]["repository"], registry + "/eks/aws-efa-k8s-device-plugin") << values.dump();
  }
  EXPECT_EQ(eks_registry("xx-nowhere-1"), "");  // unknown: the chart's default stays
  const auto recipe = docs_of(render_artifacts(load_cluster_file(kRecipe.string())),
                              "helm/aws-efa-k8s-device-plugin.values.yaml").at(0);
  EXPECT_EQ(recipe["image"]["repository"], "602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin");
}

// ---- [nodes.gpu.facts]: a type outside the built-in table ------------------------------

const std::pair<std::string, std::string> kG5Big = {"instance_type = \"g6.12xlarge\"", "instance_type = \"g5.48xlarge\""};
const std::string kG5BigFacts =
    "[nodes.gpu.facts]\nvcpus = 192\nmemory_gib = 768\ngpus = 8\ngpu_model = \"NVIDIA A10G\"\ngpu_memory_gib = 24\n"
    "efa_interfaces = 1\nnetwork_gbps = 100\nmax_pods = 737";

// g5.48xlarge (8 x A10G, 192 vCPU, 768 GiB, 1 EFA) is not in the table: described by
// the file, it is planned, sized and checked from those figures as a built-in type is.
TEST(ClusterFile, AnInstanceOutsideTheTableIsDescribedByTheFile) {
  const std::string without = error_of([&] { load_cluster_file(variant("g5-none", {kG5Big}).string()); });
  EXPECT_NE(without.find("'g5.48xlarge' is not in the built-in instance table"), std::string::npos) << without;
  EXPECT_NE(without.find("[nodes.gpu.facts]"), std::string::npos) << without;

  const ClusterSpec s = load_cluster_file(variant("g5-facts", {kG5Big, {"", kG5BigFacts}}).string());
  ASSERT_NE(s.gpu.facts, nullptr);
  const ClusterSpec copy = s;  // the facts stay valid in a copy
  EXPECT_EQ(copy.gpu.facts->vcpus, 192);
  EXPECT_EQ(s.gpu.facts->type, "g5.48xlarge");
  EXPECT_EQ(s.gpu.facts->quota_code, "L-DB2E81BA");  // a G type: the G and VT quota
  EXPECT_EQ(s.pod_gpus, 8);
  EXPECT_EQ(s.pod_efa, 1);
  EXPECT_EQ(s.pod_cpu, 192 - 32);
  EXPECT_EQ(s.world(), 16);
  std::string notes;
  for (const Finding& f : preflight(s, {})) {
    EXPECT_FALSE(f.refusal) << f.key << ": " << f.message;
    if (f.key == "nodes.gpu.facts") notes += f.message;
  }
  EXPECT_NE(notes.find("g5.48xlarge is described by the cluster file, not the built-in table: 192 vCPU, 768 GiB, "
                       "8 GPUs, 1 EFA interfaces"), std::string::npos) << notes;
  const auto arts = render_artifacts(s);
  EXPECT_EQ(docs_of(arts, "eksctl-cluster.yaml").at(0)["managedNodeGroups"][1]["instanceType"], "g5.48xlarge");
  const auto job = docs_of(arts, "job.yaml").at(0);
  const auto& limits = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"];
  EXPECT_EQ(limits["nvidia.com/gpu"], "8") << limits.dump();
  EXPECT_EQ(limits["vpc.amazonaws.com/efa"], "1") << limits.dump();
  // The same checks as a built-in type: the quota, the pod's GPUs, EFA.
  PreflightOptions small;
  small.vcpu_quota = 200;
  bool quota = false;
  for (const Finding& f : preflight(s, small))
    quota |= f.refusal && f.message.find("need 384 vCPU of \"Running On-Demand G and VT instances\"") != std::string::npos;
  EXPECT_TRUE(quota);
  auto refusals = [](const ClusterSpec& x) {
    std::string out;
    for (const Finding& f : preflight(x, {}))
      if (f.refusal) out += f.key + ": " + f.message + "\n";
    return out;
  };
  const std::string no_efa = refusals(load_cluster_file(
      variant("g5-noefa", {kG5Big, {"", std::regex_replace(kG5BigFacts, std::regex("efa_interfaces = 1"),
                                                               "efa_interfaces = 0")}}).string()));
  EXPECT_NE(no_efa.find("nodes.gpu.efa: g5.48xlarge has no EFA interfaces"), std::string::npos) << no_efa;
  const std::string four = refusals(
      load_cluster_file(variant("g5-4", {kG5Big, {"", "[workload.resources]\ngpus = 4\n" + kG5BigFacts}}).string()));
  EXPECT_NE(four.find("g5.48xlarge has 8, the pod asks for 4"), std::string::npos) << four;
}

TEST(ClusterFile, InstanceFactsAreRefusedWhereTheyCannotBeRight) {
  struct Case {
    std::vector<std::pair<std::string, std::string>> edits;
    std::string expect;
  };
  const std::vector<Case> cases = {
      // A built-in type keeps its table's facts.
      {{{"", kG5BigFacts}}, "[nodes.gpu.facts] is for a type outside the built-in instance table, but 'g6.12xlarge'"},
      {{kG5Big, {"", std::regex_replace(kG5BigFacts, std::regex("vcpus = 192\n"), "")}},
       "nodes.gpu.facts.vcpus must be set"},
      {{kG5Big, {"", std::regex_replace(kG5BigFacts, std::regex("gpus = 8\n"), "gpus = 0\n")}},
       "nodes.gpu.facts.gpus"},
      {{kG5Big, {"", kG5BigFacts + "\ncores = 96"}}, "unknown key 'nodes.gpu.facts.cores'"},
      // No quota known for the family: the file must name it.
      {{{"instance_type = \"g6.12xlarge\"", "instance_type = \"x9.gpu\""}, {"", kG5BigFacts}},
       "nodes.gpu.facts.quota_code must be set for x9.gpu"},
  };
  for (const Case& c : cases) {
    const std::string err = error_of([&] { load_cluster_file(variant("facts-bad", c.edits).string()); });
    EXPECT_NE(err.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in: " << err;
  }
}

// The Dockerfile compares the EFA installer it downloads with image.efa_installer_sha256
// before unpacking it; without one (allow_unpinned) it says it is unverified.
TEST(DeployImage, TheEfaInstallerIsCheckedAgainstItsSha256) {
  const std::string sha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
  auto dockerfile_of = [](const ClusterSpec& s) {
    for (const Artifact& a : render_artifacts(s))
      if (a.file == "Dockerfile") return a.text;
    return std::string();
  };
  const ClusterSpec s = load_cluster_file(
      variant("efa-sha", {{"allow_unpinned = true", "allow_unpinned = true\nefa_installer_sha256 = \"" + sha + "\""}})
          .string());
  const std::string d = dockerfile_of(s);
  EXPECT_NE(d.find("ARG EFA_INSTALLER_SHA256=" + sha + "\n"), std::string::npos) << d;
  const size_t check = d.find("&& echo \"${EFA_INSTALLER_SHA256}  aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz\" "
                              "| sha256sum -c -");
  ASSERT_NE(check, std::string::npos) << d;
  EXPECT_LT(d.find("curl -fsSLO"), check);
  EXPECT_LT(check, d.find("tar -xzf"));
  for (const Finding& f : preflight(s, {})) EXPECT_NE(f.key, "image.efa_installer_sha256") << f.message;
  const std::string unverified = dockerfile_of(load_cluster_file(kRecipe.string()));
  EXPECT_NE(unverified.find("# Unverified: image.efa_installer_sha256 is not set"), std::string::npos) << unverified;
  EXPECT_EQ(unverified.find("sha256sum"), std::string::npos) << unverified;
}

// ---- memory: the run against the GPUs ------------------------------------------------

constexpr size_t kGiB = size_t(1) << 30;

// A planner of round numbers, to test the search on its own: `params_g` GiB-params per
// rank at 18 bytes each (fp32 master 4, its bf16 copy 2, gradient 4, AdamW 8; bf16
// master 2 and no copy, bf16 AdamW 4), the optimizer (and master) in host RAM with
// train.offload, and 3 GiB of activations per sequence (1.5 with any recompute: the
// leanest is then norm, the first).
MemoryPlanner round_planner(double params_g) {
  MemoryPlanner p;
  p.plan = [params_g](const RunConfig& c, int) {
    const bool bf16_master = c.optim.master_dtype == "bf16";
    // A bf16 master is gathered as it is, unless it is in host RAM.
    const double master = bf16_master ? 2 : 4, low = bf16_master && c.train.offload != "optimizer+master" ? 0 : 2,
                 grad = 4,
                 opt = c.optim.state_dtype == "bf16" ? 4 : 8;
    double device = low + grad, host = 0;
    (c.train.offload == "none" ? device : host) += opt;
    (c.train.offload == "optimizer+master" ? host : device) += master;
    const double act = (c.train.recompute == "none" ? 3.0 : 1.5) * c.train.micro_batch;
    return RankMemory{size_t((device * params_g + act) * double(kGiB)), size_t(host * params_g * double(kGiB))};
  };
  p.largest_micro_batch = [plan = p.plan](const RunConfig& c, int world, size_t limit) {
    RunConfig x = c;
    int best = 0;
    for (x.train.micro_batch = 1; x.train.micro_batch <= 64; ++x.train.micro_batch)
      if (plan(x, world).device <= limit) best = x.train.micro_batch;
    return best;
  };
  return p;
}

std::string refusal_of(const std::vector<Finding>& findings) {
  std::string out;
  for (const Finding& f : findings)
    if (f.refusal) out += f.key + ": " + f.message + "\n";
  return out;
}

TEST(DeployMemory, TheFirstChangeThatFitsIsNamed) {
  ClusterSpec s = load_cluster_file(kRecipe.string());
  s.run.train.recompute = "none";
  s.run.train.micro_batch = 4;
  s.run.train.grad_accum = 1;
  // 1 G params: 18 GiB + 4 x 3 GiB = 30 GiB > 22.5: one sequence at a time fits, four micro-batches.
  MemoryFit f = check_memory_fit(s, round_planner(1.0));
  EXPECT_EQ(f.gpu_limit, size_t(22.5 * double(kGiB)));  // an L4 as a process sees it
  EXPECT_FALSE(f.fits_gpu);
  EXPECT_TRUE(f.fits_host);
  ASSERT_EQ(f.first_fit, 0);
  EXPECT_EQ(f.tried[0].what, "a smaller train.micro_batch");
  using Set = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(f.tried[0].set, (Set{{"train.micro_batch", "1"}, {"train.grad_accum", "4"}}));
  ASSERT_EQ(f.per_recompute.size(), recompute_choices().size());
  EXPECT_EQ(f.per_recompute[0], (std::pair<std::string, int>{"none", 1}));
  EXPECT_EQ(f.per_recompute[1], (std::pair<std::string, int>{"norm", 3}));
  std::string r = refusal_of(memory_findings(s, f));
  EXPECT_NE(r.find("train.config: the run does not fit: one rank needs 30.00 GiB of GPU memory, one NVIDIA L4 of a "
                   "g6.12xlarge gives 22.50 GiB"), std::string::npos) << r;
  EXPECT_NE(r.find("qwen2.5-1.5b.toml (train.config) and [train.set] of " + kRecipe.string()), std::string::npos) << r;
  EXPECT_NE(r.find("The first change that fits: a smaller train.micro_batch (one rank 21.00 GiB"), std::string::npos)
      << r;
  EXPECT_NE(r.find("add to [train.set] \"train.micro_batch\" = 1, \"train.grad_accum\" = 4 (or "
                   "--train.micro_batch=1 --train.grad_accum=4)"), std::string::npos) << r;

  // 6 sequences, 4 fit at once: 3 x 2 keeps the six.
  s.run.train.micro_batch = 6;
  f = check_memory_fit(s, round_planner(0.5));  // 9 GiB + 6 x 3
  ASSERT_EQ(f.first_fit, 0);
  EXPECT_EQ(f.tried[0].set, (Set{{"train.micro_batch", "3"}, {"train.grad_accum", "2"}}));

  // 1.5 G params: 27 GiB of state alone; no micro-batch or recompute helps, bf16 state
  // and master (15 GiB) do with two sequences at a time.
  s.run.train.micro_batch = 4;
  f = check_memory_fit(s, round_planner(1.5));
  ASSERT_EQ(f.tried.size(), 1 + (recompute_choices().size() - 1) + 3 + 1);  // and all of them together
  ASSERT_GE(f.first_fit, 0);
  EXPECT_EQ(f.tried[size_t(f.first_fit)].what, "bf16 optimizer state and master weights");
  for (int i = 0; i < f.first_fit; ++i) EXPECT_FALSE(f.tried[size_t(i)].fits()) << f.tried[size_t(i)].what;
  r = refusal_of(memory_findings(s, f));
  EXPECT_NE(r.find("\"optim.state_dtype\" = \"bf16\", \"optim.master_dtype\" = \"bf16\", \"train.micro_batch\" = 2, "
                   "\"train.grad_accum\" = 2 (or --optim.state_dtype=bf16 --optim.master_dtype=bf16 "
                   "--train.micro_batch=2 --train.grad_accum=2)"), std::string::npos) << r;

  // 2 G params: bf16 state (20 GiB) fits with the leanest recompute, one sequence at a time.
  f = check_memory_fit(s, round_planner(2.0));
  ASSERT_GE(f.first_fit, 0);
  EXPECT_EQ(f.tried[size_t(f.first_fit)].what, "bf16 optimizer state and master weights, train.recompute = norm");
  EXPECT_EQ(f.tried[size_t(f.first_fit)].set,
            (Set{{"optim.state_dtype", "\"bf16\""}, {"optim.master_dtype", "\"bf16\""}, {"train.recompute", "\"norm\""},
                 {"train.micro_batch", "1"}, {"train.grad_accum", "4"}}));
  EXPECT_FALSE(f.tried[size_t(f.first_fit) - 1].fits());  // bf16 with recompute none

  // 2.5 G params: only the master in host RAM too leaves room (15 GiB on the GPU), and
  // the node's four ranks then hold 4 x 30 GiB of host RAM: the pod's 160 GiB take it.
  f = check_memory_fit(s, round_planner(2.5));
  ASSERT_GE(f.first_fit, 0);
  EXPECT_EQ(f.tried[size_t(f.first_fit)].what, "train.offload = optimizer+master");
  EXPECT_EQ(f.tried[size_t(f.first_fit)].host_node, 4 * 30 * kGiB);
  // ... a pod of 64 GiB does not, but bf16 state and master there (4 x 15 GiB) do.
  s.pod_memory_gib = 64;
  f = check_memory_fit(s, round_planner(2.5));
  ASSERT_GE(f.first_fit, 0);
  EXPECT_EQ(f.tried[size_t(f.first_fit)].what, "all of them: bf16 state and master in host RAM, train.recompute = norm");
  EXPECT_EQ(f.tried[size_t(f.first_fit)].host_node, 4 * 15 * kGiB);
  // ... and one of 32 GiB nothing tried.
  s.pod_memory_gib = 32;
  f = check_memory_fit(s, round_planner(2.5));
  EXPECT_EQ(f.first_fit, -1);
  EXPECT_TRUE(f.tried.back().fits_gpu);
  EXPECT_FALSE(f.tried.back().fits_host);
  r = refusal_of(memory_findings(s, f));
  EXPECT_NE(r.find("Nothing tried fits"), std::string::npos) << r;
  EXPECT_NE(r.find("give the pod more memory"), std::string::npos) << r;
  EXPECT_NE(memory_fit_text(s, f).find("train.offload = optimizer+master"), std::string::npos);
  EXPECT_NE(memory_fit_text(s, f).find("host RAM does not fit"), std::string::npos);

  // A config that carries the change is accepted.
  s.pod_memory_gib = 160;
  s.run.optim.state_dtype = s.run.optim.master_dtype = "bf16";
  s.run.train.micro_batch = 2;
  s.run.train.grad_accum = 2;
  f = check_memory_fit(s, round_planner(1.5));
  EXPECT_TRUE(f.fits()) << memory_fit_text(s, f);
  EXPECT_TRUE(f.tried.empty());
  EXPECT_EQ(refusal_of(memory_findings(s, f)), "");
  // Host RAM alone: the ranks of a node against the pod.
  s.pod_memory_gib = 8;
  s.run.train.offload = "optimizer";
  f = check_memory_fit(s, round_planner(1.5));  // 4 x 6 GiB of AdamW state in host RAM
  EXPECT_TRUE(f.fits_gpu);
  EXPECT_FALSE(f.fits_host);
  r = refusal_of(memory_findings(s, f));
  EXPECT_NE(r.find("the 4 ranks of a node need 24.00 GiB of host RAM, the worker pod has 8.00 GiB"),
            std::string::npos) << r;
}

TEST(DeployMemory, CpuRunsAndUnknownGpusAreNotedNotRefused) {
  ClusterSpec s = load_cluster_file(kRecipe.string());
  s.run.train.device = "cpu";
  std::vector<Finding> f = memory_findings(s, check_memory_fit(s, round_planner(100)));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_FALSE(f[0].refusal);
  EXPECT_NE(f[0].message.find("train.device = cpu"), std::string::npos) << f[0].message;
  // A type the file describes without gpu_usable_gib: 15/16 of its label, noted.
  const ClusterSpec g5 = load_cluster_file(variant("mem-g5", {kG5Big, {"", kG5BigFacts}}).string());
  EXPECT_EQ(g5.gpu.facts->gpu_usable_gib, 22.5);
  f = memory_findings(g5, check_memory_fit(g5, round_planner(0.5)));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_FALSE(f[0].refusal);
  EXPECT_EQ(f[0].key, "nodes.gpu.facts.gpu_usable_gib");
  const ClusterSpec given = load_cluster_file(
      variant("mem-g5-usable", {kG5Big, {"", kG5BigFacts + "\ngpu_usable_gib = 22.5"}}).string());
  EXPECT_EQ(given.gpu.facts->gpu_usable_gib, 22.5);
  EXPECT_TRUE(memory_findings(given, check_memory_fit(given, round_planner(0.5))).empty());
}

// What the trainer's planner says, asserted through it: the check uses its numbers, the
// change it names fits by the planner and none before it does.
void expect_the_planners_first_fit(const ClusterSpec& s, const MemoryFit& f) {
  const MemoryPlanner p = trainer_memory_planner();
  for (int i = 0; i < int(f.tried.size()) && (f.first_fit < 0 || i <= f.first_fit); ++i) {
    ConfigOverrides set = s.train_set;
    for (const auto& [k, v] : f.tried[size_t(i)].set)
      set.push_back({k, v.front() == '"' ? v.substr(1, v.size() - 2) : v});
    RunConfig c = load_run_config((kRoot / "configs/qwen2.5-1.5b.toml").string(), set);
    c.train.device = "cuda";
    const RankMemory m = p.plan(c, f.world);
    EXPECT_EQ(m.device, f.tried[size_t(i)].rank.device) << f.tried[size_t(i)].what;
    EXPECT_EQ(m.device <= f.gpu_limit && m.host * 4 <= f.host_limit, i == f.first_fit) << f.tried[size_t(i)].what;
  }
}

const std::string kRecipeRecompute = "\"train.recompute\" = \"norm\"";

// The recipe with `set_lines` in [train.set] in place of its micro-batch and recompute.
ClusterSpec recipe_with(const std::string& name, const std::vector<std::string>& set_lines) {
  std::string lines;
  for (const std::string& l : set_lines) lines += l + "\n";
  return load_cluster_file(
      variant(name, {{"\"train.micro_batch\" = 4\n", lines}, {kRecipeRecompute, "# recompute as below"}}).string());
}

TEST(DeployMemory, TheTrainersPlanForQwenOnEightL4s) {
  const MemoryPlanner p = trainer_memory_planner();
  // The recipe fits, by the numbers `train --run.dry_run=true` prints.
  ClusterSpec s = load_cluster_file(kRecipe.string());
  MemoryFit f = check_memory_fit(s, p);
  EXPECT_TRUE(f.fits()) << memory_fit_text(s, f);
  const MemoryPlan plan = plan_rank_memory(s.run, Device::CUDA, 8, false, kCudaPlannedWorkspaceBytes);
  EXPECT_EQ(f.rank.device, plan.device_total());
  EXPECT_EQ(f.rank.host, plan.host_total());
  for (const auto& [rc, m] : f.per_recompute) {
    RunConfig c = s.run;
    c.train.recompute = rc;
    EXPECT_EQ(m, largest_fitting_micro_batch(c, Device::CUDA, 8, false, kCudaPlannedWorkspaceBytes, f.gpu_limit)) << rc;
  }
  EXPECT_GE(f.per_recompute[0].second, 3);  // Qwen2.5-1.5B at seq 2048: three sequences without recompute
  EXPECT_EQ(refusal_of(memory_findings(s, f)), "");
  const std::string text = memory_fit_text(s, f);
  EXPECT_NE(text.find("GPU per rank: " + human_bytes(double(plan.device_total())) + " of the 22.50 GiB one NVIDIA L4 "
                      "of a g6.12xlarge gives"), std::string::npos) << text;

  // Eight sequences of 2048 at once do not fit; the change named is the planner's.
  s = recipe_with("mem-mb8", {"\"train.micro_batch\" = 8", "\"train.recompute\" = \"none\""});
  f = check_memory_fit(s, p);
  EXPECT_FALSE(f.fits());
  ASSERT_GE(f.first_fit, 0) << memory_fit_text(s, f);
  expect_the_planners_first_fit(s, f);

  // 7B: 17 GB of fp32 state per rank leaves little room for activations.
  s = recipe_with("mem-7b", {"\"model.preset\" = \"qwen2.5-7b\"", "\"train.micro_batch\" = 4"});
  f = check_memory_fit(s, p);
  EXPECT_FALSE(f.fits());
  EXPECT_GE(f.first_fit, 0) << memory_fit_text(s, f);
  expect_the_planners_first_fit(s, f);

  // 14B: 33 GB of fp32 state per rank: no micro-batch or recompute can fit.
  s = recipe_with("mem-14b", {"\"model.preset\" = \"qwen2.5-14b\"", "\"train.micro_batch\" = 1"});
  f = check_memory_fit(s, p);
  EXPECT_FALSE(f.fits_gpu);
  for (size_t i = 0; i < recompute_choices().size(); ++i) EXPECT_FALSE(f.tried.at(i).fits()) << f.tried[i].what;
  // bf16 state and master weights, or the state in host RAM, is what fits.
  ASSERT_GE(f.first_fit, int(recompute_choices().size())) << memory_fit_text(s, f);
  expect_the_planners_first_fit(s, f);
  const std::string r = refusal_of(memory_findings(s, f));
  EXPECT_NE(r.find("train.config: the run does not fit"), std::string::npos) << r;
  const std::string& named = f.tried[size_t(f.first_fit)].what;
  EXPECT_TRUE(named.rfind("bf16 optimizer state", 0) == 0 || named.rfind("train.offload", 0) == 0 ||
              named.rfind("all of them", 0) == 0) << named;
  EXPECT_NE(r.find("The first change that fits: " + named), std::string::npos) << r;
}

// ---- golden files and the command line ---------------------------------------------------

// The recipe's artifacts, byte for byte, and the predicted step plan prints
// (prediction.txt). SHARDTRAIN_UPDATE_GOLDEN=1 rewrites them (then read the diff
// before committing it).
TEST(DeployPlan, GoldenFilesForTheRecipe) {
  // Paths as a user in the repository root types them, so the files hold no
  // checkout-specific directory.
  const fs::path cwd = fs::current_path();
  fs::current_path(kRoot);
  for (const fs::path& f : {kRecipe, kRecipeRay}) {
    const ClusterSpec s = load_cluster_file(fs::relative(f, kRoot).string());
    const fs::path golden = kRoot / "tests/deploy/golden" / f.stem();
    std::vector<std::pair<std::string, std::string>> files;
    for (const Artifact& a : render_artifacts(s)) files.emplace_back(a.file, a.text);
    std::string plan;
    for (const PlanStep& st : plan_steps(s, "OUT")) {
      plan += "step " + std::to_string(st.number) + ". " + st.title + "\n";
      for (const auto& c : st.commands) plan += "  $ " + shell_line(c) + "\n";
    }
    files.emplace_back("plan-commands.txt", plan);
    files.emplace_back("prediction.txt", prediction_text(s, predict_cluster(s)));
    for (const auto& [name, text] : files) {
      const fs::path p = golden / name;
      if (std::getenv("SHARDTRAIN_UPDATE_GOLDEN")) {
        fs::create_directories(p.parent_path());
        std::ofstream(p, std::ios::binary) << text;
      }
      EXPECT_EQ(read_file(p), text) << p << " differs from what the plan renders";
    }
  }
  fs::current_path(cwd);
}

TEST(DeployPlanCli, WritesEverythingOrNothing) {
  using st::testing::run_shell;
  const fs::path out = temp_dir("cli") / "out";
  const std::string bin = SHARDTRAIN_BINARY;
  auto r = run_shell(bin + " deploy plan --cluster " + kRecipe.string() + " --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* step : {"step 1.", "step 3.", "step 8.", "eksctl create cluster -f", "helm upgrade --install"})
    EXPECT_NE(r.out.find(step), std::string::npos) << step << "\n" << r.out;
  for (const char* f : {"eksctl-cluster.yaml", "workload.yaml", "job.yaml", "Dockerfile", "config.toml", "plan.txt",
                        "prediction.txt", "memory.txt", "helm/nvidia-device-plugin.values.yaml",
                        "helm/aws-efa-k8s-device-plugin.values.yaml"})
    EXPECT_TRUE(fs::exists(out / f)) << f;
  EXPECT_NE(read_file(out / "Dockerfile").find("FROM nvcr.io/nvidia/cuda:13.0.0-cudnn-devel-ubuntu24.04@sha256:"),
            std::string::npos);
  // Again: the same bytes (idempotent).
  const std::string job = read_file(out / "job.yaml");
  r = run_shell(bin + " deploy plan --cluster " + kRecipe.string() + " --out " + out.string() + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(read_file(out / "job.yaml"), job);
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["world"], 8);
  EXPECT_EQ(j["steps"].size(), 8u);
  EXPECT_EQ(j["memory"]["fits"], true) << j["memory"].dump();
  // Refused: every refusal listed, a non-zero exit, nothing written.
  const fs::path bad = variant("cli_bad", {{"zones = [\"us-west-2a\"]", "zones = [\"us-west-2a\", \"us-west-2b\"]"},
                                           {"digest = \"sha256:0000000000000000000000000000000000000000000000000000000000000000\"\n", ""},
                                           {"allow_unpinned = true", "allow_unpinned = false"}});
  const fs::path out2 = temp_dir("cli2") / "out";
  r = run_shell(bin + " deploy plan --cluster " + bad.string() + " --out " + out2.string());
  EXPECT_EQ(r.code, 2) << r.out;  // a configuration error
  EXPECT_NE(r.out.find("REFUSED nodes.gpu.zones"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("REFUSED image.digest"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("REFUSED image.base: the digest of the Dockerfile's base is the all-zero placeholder"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("REFUSED image.efa_installer_sha256"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("refused by 4 preflight checks"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out2));
  // Pods without EFA while EFA is expected: refused before anything is written.
  const fs::path no_efa = variant("cli_no_efa", {{"", "[workload.resources]\nefa = 0"}});
  r = run_shell(bin + " deploy plan --cluster " + no_efa.string() + " --out " + out2.string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("REFUSED workload.resources.efa: the worker pods ask for no vpc.amazonaws.com/efa"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find(no_efa.string() + ": refused by 1 preflight check"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out2));
  r = run_shell(bin + " deploy apply --dry-run --cluster " + no_efa.string() + " --out " + out2.string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("workload.resources.efa: the worker pods ask for no"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out2));
  r = run_shell(bin + " deploy plan --cluster " + kRecipe.string() + " --vcpu-quota 64 --out " + out2.string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("need 96 vCPU"), std::string::npos) << r.out;
}

// Through the binary: a run that does not fit its GPUs is refused (exit 2, nothing
// written) naming the change that fits; the cluster file with that change is planned.
TEST(DeployPlanCli, ARunThatDoesNotFitIsRefusedWithTheChangeThatFits) {
  using st::testing::run_shell;
  const std::string bin = SHARDTRAIN_BINARY;
  const fs::path big = variant("cli_mem", {{"\"train.micro_batch\" = 4\n", "\"train.micro_batch\" = 16\n"}});
  const fs::path out = temp_dir("cli_mem_out") / "out";
  auto r = run_shell(bin + " deploy plan --cluster " + big.string() + " --out " + out.string());
  EXPECT_EQ(r.code, 2) << r.out;  // a configuration error, as every refusal
  EXPECT_NE(r.out.find("REFUSED train.config: the run does not fit: one rank needs "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("qwen2.5-1.5b.toml (train.config) and [train.set] of " + big.string()), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("memory: the trainer's plan of one rank"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(big.string() + ": refused by 1 preflight check"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("add to \\[train.set\\] (.*) \\(or (--[^)]*)\\)"))) << r.out;
  // The matches point into r.out, which the next run replaces: copy them first.
  const std::string train_set = m[1].str(), change_flags = m[2].str();
  // Its [train.set] lines, in place of the micro-batch's.
  std::string lines = std::regex_replace(train_set, std::regex(", \""), "\n\"") + "\n";
  if (lines.find("\"train.micro_batch\"") == std::string::npos) lines += "\"train.micro_batch\" = 16\n";
  const fs::path fixed = variant("cli_mem_fixed", {{"\"train.micro_batch\" = 4\n", lines}});
  r = run_shell(bin + " deploy plan --cluster " + fixed.string() + " --out " + out.string());
  EXPECT_EQ(r.code, 0) << lines << r.out;
  EXPECT_NE(read_file(out / "memory.txt").find(": fits\n"), std::string::npos) << read_file(out / "memory.txt");
  // apply refuses the same run before running anything.
  r = run_shell(bin + " deploy apply --dry-run --cluster " + big.string() + " --out " + out.string() + "-apply");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("train.config: the run does not fit"), std::string::npos) << r.out;
  // The same as `train --run.dry_run=true` says for the fixed run's flags.
  std::string flags = "--train.recompute=norm " + change_flags;  // the recipe's, then the change's
  if (flags.find("--train.micro_batch=") == std::string::npos) flags += " --train.micro_batch=16";
  r = run_shell(bin + " train --config " + (kRoot / "configs/qwen2.5-1.5b.toml").string() + " " + flags +
                " --run.gpu_memory_gib=22.5 --run.dry_run_world=8 --run.dry_run=true");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("\nfits: "), std::string::npos) << r.out;
}

// ---- the image's build context ---------------------------------------------------------

// .dockerignore as Docker reads it: one pattern a line (# comments), matched against
// the path from the context root ('*' and '?' within a component, '**' across
// components, a leading '/' dropped, '!' re-includes); the last matching line wins,
// and a directory that is excluded is not entered.
struct DockerIgnore {
  std::vector<std::pair<std::regex, bool>> rules;  // pattern, excludes
  explicit DockerIgnore(const fs::path& file) {
    std::ifstream in(file);
    for (std::string l; std::getline(in, l);) {
      while (!l.empty() && (l.back() == ' ' || l.back() == '\r')) l.pop_back();
      if (l.empty() || l[0] == '#') continue;
      const bool exclude = l[0] != '!';
      if (!exclude) l.erase(0, 1);
      while (!l.empty() && l[0] == '/') l.erase(0, 1);
      while (!l.empty() && l.back() == '/') l.pop_back();
      std::string re;
      for (size_t i = 0; i < l.size(); ++i) {
        if (l.compare(i, 3, "**/") == 0) re += "(.*/)?", i += 2;
        else if (l.compare(i, 2, "**") == 0) re += ".*", i += 1;
        else if (l[i] == '*') re += "[^/]*";
        else if (l[i] == '?') re += "[^/]";
        else if (std::string(".+()[]{}^$|\\").find(l[i]) != std::string::npos) re += std::string("\\") + l[i];
        else re += l[i];
      }
      rules.emplace_back(std::regex(re), exclude);
    }
  }
  bool excluded(const std::string& rel) const {
    bool out = false;
    for (const auto& [re, exclude] : rules)
      if (std::regex_match(rel, re)) out = exclude;
    return out;
  }
  // Every file of the context under `root`, relative to it.
  std::vector<std::string> context(const fs::path& root) const {
    std::vector<std::string> files;
    for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
      const std::string rel = fs::relative(it->path(), root).generic_string();
      if (excluded(rel)) {
        if (it->is_directory()) it.disable_recursion_pending();
        continue;
      }
      if (!it->is_directory()) files.push_back(rel);
    }
    return files;
  }
};

// A tree that has been set up, built and run in, as the one the Dockerfile is built
// from: its build context is the sources, without the build outputs, the fetched
// tools, the git metadata and the runs.
TEST(DeployImage, TheBuildContextIsTheSourcesOnly) {
  ASSERT_TRUE(fs::exists(kRoot / ".dockerignore"));
  const fs::path tree = temp_dir("context") / "src";
  for (const char* f : {"CMakeLists.txt", "scripts/setup.sh", "src/deploy/ray_driver.py", "src/cli/main.cpp",
                        "configs/tiny.toml", "tests/deploy/golden/eks-g6-efa/Dockerfile", "docs/deploy.md",
                        "build/shardtrain", "build/CMakeCache.txt", "build-cpu/CMakeFiles/x.o", "build-asan/a",
                        ".tools/bin/kubectl", ".tools/npm/node_modules/x/layer.zip", ".git/HEAD", ".git/objects/ab/cd",
                        "runs/tiny/metrics.jsonl", "bench-out/report.html", "src/core/.error.cpp.swp"}) {
    fs::create_directories((tree / f).parent_path());
    std::ofstream(tree / f) << "x";
  }
  fs::copy_file(kRoot / ".dockerignore", tree / ".dockerignore");
  const auto files = DockerIgnore(tree / ".dockerignore").context(tree);
  std::set<std::string> got(files.begin(), files.end());
  for (const char* keep : {"CMakeLists.txt", "scripts/setup.sh", "src/deploy/ray_driver.py", "src/cli/main.cpp",
                           "configs/tiny.toml", "tests/deploy/golden/eks-g6-efa/Dockerfile", "docs/deploy.md"})
    EXPECT_TRUE(got.count(keep)) << keep << " is not in the context";
  for (const std::string& f : got)
    for (const char* out : {"build", ".tools/", ".git/", "runs/", "bench-out/"})
      EXPECT_NE(f.rfind(out, 0), 0u) << f << " is in the context";
  EXPECT_FALSE(got.count("src/core/.error.cpp.swp"));
  // The rendered Dockerfile's COPY takes the tree whole: what it then needs is there.
  const std::string docker = render_artifacts(load_cluster_file(kRecipe.string())).back().text;
  EXPECT_NE(docker.find("COPY . /opt/shardtrain/src"), std::string::npos) << docker;
  // This checkout too, as it is now (built or not).
  for (const std::string& f : DockerIgnore(kRoot / ".dockerignore").context(kRoot))
    for (const char* out : {"build", ".tools/", ".git/", "runs/", "bench-out/"})
      EXPECT_NE(f.rfind(out, 0), 0u) << f << " is in this checkout's context";
}

}  // namespace
}  // namespace st

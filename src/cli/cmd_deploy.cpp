// `shardtrain deploy plan`: the EKS recipe from one cluster file, offline: checks it
// (preflight, and the run's memory against the GPUs with the trainer's planner:
// deploy/memory_fit.h, cli/deploy_memory.h), writes every artifact (eksctl config,
// Helm values, workload, Dockerfile), prints the eight steps with the commands
// `deploy apply` runs, and the predicted step time of the file's run on its nodes
// (deploy/prediction.h).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/deploy_memory.h"
#include "core/error.h"
#include "deploy/apply.h"
#include "deploy/cluster_file.h"
#include "deploy/memory_fit.h"
#include "deploy/prediction.h"
#include "deploy/preflight.h"
#include "deploy/render.h"
#include "deploy/tools.h"
#include "deploy/verify.h"
#include "core/files.h"

namespace st {
namespace {

namespace fs = std::filesystem;

// dir/file, its directories made, written through a temporary name and a rename
// (core/files.h): a rerun replaces each file whole.
void write_file(const fs::path& dir, const std::string& file, const std::string& text) {
  const fs::path path = dir / file;
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  ST_CHECK(!ec, "deploy: cannot create '", path.parent_path().string(), "': ", ec.message());
  write_text_atomic(path.string(), text);
}

nlohmann::json to_json(const Finding& f) {
  return {{"kind", f.refusal ? "refusal" : "note"}, {"key", f.key}, {"message", f.message}};
}

struct PlanArgs {
  std::string cluster, out;
  bool json = false;
  std::optional<long> vcpu_quota;
};

int run_plan(const PlanArgs& a) {
  ClusterSpec spec = load_cluster_file(a.cluster);
  PreflightOptions po;
  po.vcpu_quota = a.vcpu_quota;
  std::vector<Finding> findings = preflight(spec, po);
  // The run against its GPUs, by the trainer's own memory plan.
  const MemoryFit memory = check_memory_fit(spec, trainer_memory_planner());
  for (Finding& f : memory_findings(spec, memory)) findings.push_back(std::move(f));
  const std::string memory_txt = memory_fit_text(spec, memory);
  std::vector<Artifact> artifacts;
  bool refused = false;
  for (const Finding& f : findings) refused |= f.refusal;
  if (!refused) {
    artifacts = render_artifacts(spec);
    // The rendered worker pods themselves must be Guaranteed (requests == limits).
    for (const Artifact& art : artifacts)
      for (const ojson& d : art.docs) {
        const nlohmann::json doc = nlohmann::json::parse(d.dump());
        std::vector<nlohmann::json> pods;
        if (doc.value("kind", "") == "Job") pods.push_back(doc["spec"]["template"]["spec"]);
        if (doc.value("kind", "") == "RayCluster")
          for (const auto& wg : doc["spec"]["workerGroupSpecs"]) pods.push_back(wg["template"]["spec"]);
        if (doc.value("kind", "") == "PyTorchJob")
          for (const auto& [_, r] : doc["spec"]["pytorchReplicaSpecs"].items()) pods.push_back(r["template"]["spec"]);
        for (const auto& p : pods)
          for (const std::string& c : non_guaranteed_containers(p)) {
            refused = true;
            fail("deploy plan: ", art.file, ": container '", c, "' of a ", doc.value("kind", ""),
                 " has requests different from its limits (its pods would not be Guaranteed)");
          }
      }
  }
  const std::string out_dir =
      !a.out.empty() ? a.out : (fs::path(spec.dir) / spec.name).lexically_normal().string();
  const std::vector<PlanStep> steps = refused ? std::vector<PlanStep>{} : plan_steps(spec, out_dir);
  const std::optional<ClusterPrediction> prediction =
      refused ? std::nullopt : std::optional<ClusterPrediction>(predict_cluster(spec));
  const std::string prediction_txt = prediction ? prediction_text(spec, *prediction) : "";

  const InstanceFacts& g = *spec.gpu.facts;
  const std::string zones = spec.gpu.zones.empty() ? "(no zone)" : spec.gpu.zones.front();
  if (a.json) {
    nlohmann::json j = {{"cluster", a.cluster},
                        {"name", spec.name},
                        {"region", spec.region},
                        {"engine", spec.engine},
                        {"out", out_dir},
                        {"world", spec.world()},
                        {"ok", !refused}};
    j["worker_pod"] = {{"gpus", spec.pod_gpus}, {"efa", spec.pod_efa}, {"cpu", spec.pod_cpu},
                       {"memory_gib", spec.pod_memory_gib}, {"shm_gib", spec.shm_gib}};
    j["findings"] = nlohmann::json::array();
    for (const Finding& f : findings) j["findings"].push_back(to_json(f));
    j["steps"] = nlohmann::json::array();
    for (const PlanStep& s : steps)
    {
      nlohmann::json cmds = nlohmann::json::array();
      for (const auto& c : s.commands) cmds.push_back(shell_line(c));
      j["steps"].push_back({{"step", s.number}, {"title", s.title}, {"commands", cmds}, {"notes", s.notes}});
    }
    j["artifacts"] = nlohmann::json::array();
    for (const Artifact& art : artifacts) j["artifacts"].push_back({{"file", art.file}, {"what", art.what}});
    j["memory"] = memory_fit_json(memory);
    if (prediction) j["prediction"] = prediction_json(*prediction);
    std::printf("%s\n", j.dump(1).c_str());
  } else {
    std::printf("deploy plan: cluster %s in %s: %d x %s (%d x %s, %d EFA) in %s, engine %s, %d ranks\n",
                spec.name.c_str(), spec.region.c_str(), spec.gpu.count, spec.gpu.instance_type.c_str(), g.gpus,
                g.gpu_model.c_str(), g.efa_interfaces, zones.c_str(), spec.engine.c_str(), spec.world());
    std::printf("worker pod: %d nvidia.com/gpu, %d vpc.amazonaws.com/efa, %d CPU, %dGi memory (requests = limits: "
                "Guaranteed), /dev/shm %dGi; image %s\n",
                spec.pod_gpus, std::max(spec.pod_efa, 0), spec.pod_cpu, spec.pod_memory_gib, spec.shm_gib,
                spec.image().c_str());
    for (const Finding& f : findings)
      std::printf("%s%s%s\n", f.refusal ? "REFUSED " : "note: ", f.key.empty() ? "" : (f.key + ": ").c_str(),
                  f.message.c_str());
    std::printf("\n%s", memory_txt.c_str());
    for (const PlanStep& s : steps) {
      std::printf("\nstep %d. %s\n", s.number, s.title.c_str());
      for (const auto& c : s.commands) std::printf("  $ %s\n", shell_line(c).c_str());
      for (const std::string& n : s.notes) std::printf("  # %s\n", n.c_str());
    }
    if (!artifacts.empty()) {
      std::printf("\nartifacts in %s:\n", out_dir.c_str());
      for (const Artifact& art : artifacts) std::printf("  %-44s %s\n", art.file.c_str(), art.what.c_str());
      std::printf("  %-44s %s\n", "memory.txt", "one rank's memory against the GPU and the node, as above");
      std::printf("  %-44s %s\n", "prediction.txt", "the predicted step, as below");
    }
    if (prediction) std::printf("\n%s", prediction_txt.c_str());
  }
  if (refused) {
    int n = 0;
    for (const Finding& f : findings) n += f.refusal;
    fail_config(a.cluster, ": refused by ", n, " preflight check", n == 1 ? "" : "s", " (listed above); nothing was written");
  }
  std::string listing;
  for (const PlanStep& s : steps) {
    listing += "step " + std::to_string(s.number) + ". " + s.title + "\n";
    for (const auto& c : s.commands) listing += "  $ " + shell_line(c) + "\n";
    for (const std::string& n : s.notes) listing += "  # " + n + "\n";
  }
  for (const Artifact& art : artifacts) write_file(out_dir, art.file, art.text);
  write_file(out_dir, "plan.txt", listing);
  write_file(out_dir, "memory.txt", memory_txt);
  write_file(out_dir, "prediction.txt", prediction_txt);
  std::fflush(stdout);
  return 0;
}

struct ApplyArgs {
  std::string cluster, out;
  bool dry_run = false, train = false;
};

// apply: the plan's checks and artifacts first (refusals stop it before any tool
// runs), then the steps.
int run_apply(const ApplyArgs& a) {
  const ClusterSpec spec = load_cluster_file(a.cluster);
  std::string refusals;
  std::vector<Finding> findings = preflight(spec, {});
  for (Finding& f : memory_findings(spec, check_memory_fit(spec, trainer_memory_planner())))
    findings.push_back(std::move(f));
  for (const Finding& f : findings)
    if (f.refusal) refusals += "\n  " + f.key + ": " + f.message;
  if (!refusals.empty()) fail_config(a.cluster, ": refused by preflight (see `deploy plan`):", refusals);
  ApplyOptions o;
  o.out_dir = !a.out.empty() ? a.out : (fs::path(spec.dir) / spec.name).lexically_normal().string();
  o.dry_run = a.dry_run;
  o.train = a.train;
  for (const Artifact& art : render_artifacts(spec)) write_file(o.out_dir, art.file, art.text);
  std::printf("deploy apply%s: cluster %s in %s, artifacts in %s\n", a.dry_run ? " --dry-run" : "", spec.name.c_str(),
              spec.region.c_str(), o.out_dir.c_str());
  return deploy_apply(spec, o);
}

}  // namespace

Command add_deploy_command(CLI::App& root) {
  auto plan = std::make_shared<PlanArgs>();
  CLI::App* app = root.add_subcommand(
      "deploy",
      "Deploy training to Amazon EKS from one cluster file (configs/deploy/eks-g6-efa.toml is the\n"
      "EFA recipe): plan renders and checks everything offline, apply runs it, verify checks the\n"
      "nodes and pods; docs/deploy.md walks through it.");
  app->require_subcommand(1);
  CLI::App* p = app->add_subcommand(
      "plan",
      "Check a cluster file (zones, EFA, quotas, pod sizes, image pinning, the run config and whether\n"
      "it fits the GPUs' memory by the trainer's own plan) and write every artifact: eksctl\n"
      "ClusterConfig, Helm values, workload manifests, Dockerfile; print the recipe's eight steps\n"
      "with the exact commands `deploy apply` runs. Creates nothing in AWS.");
  p->add_option("--cluster", plan->cluster, "the cluster file (TOML)")->required()->check(CLI::ExistingFile);
  p->add_option("--out", plan->out, "where to write the artifacts (default: <cluster file's dir>/<cluster name>)");
  p->add_flag("--json", plan->json, "print the plan as one JSON object");
  p->add_option_function<long>(
       "--vcpu-quota", [plan](long q) { plan->vcpu_quota = q; },
       "your on-demand vCPU quota for the GPU family: refuse when the GPU nodes need more")
      ->check(CLI::NonNegativeNumber);
  auto apply = std::make_shared<ApplyArgs>();
  CLI::App* ap = app->add_subcommand(
      "apply",
      "Run the plan's steps 3 to 7 (8 with --train) with the real aws, eksctl, helm and kubectl on\n"
      "PATH: capacity probe (quota, zone offering, reservation), placement group, cluster and node\n"
      "groups, device plugins, KubeRay operator, workload, node checks. Each step is skipped when it\n"
      "is done already, so apply can be run again after a failure; it stops at the first failure\n"
      "naming the step and the command. Every command and its output go to <out>/deploy.log.");
  ap->add_option("--cluster", apply->cluster, "the cluster file (TOML)")->required()->check(CLI::ExistingFile);
  ap->add_option("--out", apply->out, "where the artifacts and deploy.log go (default as for plan)");
  ap->add_flag("--dry-run", apply->dry_run, "print the commands only");
  ap->add_flag("--train", apply->train, "go on to step 8: submit the job and follow its logs");
  auto verify = std::make_shared<ApplyArgs>();
  auto verify_json = std::make_shared<bool>(false);
  CLI::App* vp = app->add_subcommand(
      "verify",
      "Check the cluster kubectl points at against the cluster file: each GPU node's label, zone,\n"
      "allocatable nvidia.com/gpu and vpc.amazonaws.com/efa, its device-plugin pods Ready, one\n"
      "DaemonSet per plugin, and each worker pod Guaranteed (requests == limits), one per node, one\n"
      "zone. Exits 1 listing every failed check.");
  vp->add_option("--cluster", verify->cluster, "the cluster file (TOML)")->required()->check(CLI::ExistingFile);
  vp->add_flag("--json", *verify_json, "print the checks as JSON");
  // submit / status / logs / down / destroy: the cluster file, and where its artifacts are.
  struct JobArgs {
    std::string cluster, out;
    int rank = -1;
    bool yes = false;
    double timeout_s = 86400;
  };
  auto job = std::make_shared<JobArgs>();
  auto job_command = [&](const char* name, const char* help) {
    CLI::App* c = app->add_subcommand(name, help);
    c->add_option("--cluster", job->cluster, "the cluster file (TOML)")->required()->check(CLI::ExistingFile);
    c->add_option("--out", job->out, "where the artifacts are (default as for plan)");
    return c;
  };
  CLI::App* sp = job_command(
      "submit",
      "Step 8: apply the job, report why pods are Pending, print rank 0's log as it grows and a failing\n"
      "pod's log, and end with the job's result (exit 0 when it completed). A rank that refused its\n"
      "transport (--expect-transport) is named with the line that says so.");
  sp->add_option("--timeout-s", job->timeout_s, "give up waiting after this long (the job keeps running)")
      ->capture_default_str();
  CLI::App* stp = job_command("status", "The job's pods: index, phase, node, or why they are Pending.");
  CLI::App* lp = job_command("logs", "A pod's log: --rank N prints that global rank's lines from its pod.");
  lp->add_option("--rank", job->rank, "global rank (default: pod 0, every line)");
  CLI::App* dp = job_command("down", "Delete the job and the workload (namespace, config, service); the cluster stays.");
  CLI::App* xp = job_command("destroy", "Delete the cluster (eksctl) and its placement group; asks first unless --yes.");
  xp->add_flag("--yes", job->yes, "do not ask");
  auto job_spec = [job](std::string* out) {
    ClusterSpec spec = load_cluster_file(job->cluster);
    *out = !job->out.empty() ? job->out : (fs::path(spec.dir) / spec.name).lexically_normal().string();
    // The files the commands name, as the cluster file says now (the same bytes as plan's).
    for (const Artifact& art : render_artifacts(spec)) write_file(*out, art.file, art.text);
    return spec;
  };
  return {app, [=] {
            std::string out;
            if (sp->parsed()) {
              const ClusterSpec spec = job_spec(&out);
              SubmitOptions so;
              so.out_dir = out;
              so.timeout_s = job->timeout_s;
              if (const char* poll = std::getenv("SHARDTRAIN_DEPLOY_POLL_S")) so.poll_s = std::atof(poll);
              return deploy_submit(spec, so);
            }
            if (stp->parsed()) return deploy_status(job_spec(&out));
            if (lp->parsed()) return deploy_logs(job_spec(&out), job->rank);
            if (dp->parsed()) return deploy_down(job_spec(&out), out);
            if (xp->parsed()) {
              const ClusterSpec spec = job_spec(&out);
              if (!job->yes) {
                std::printf("delete cluster %s in %s and everything on it? type the cluster's name: ",
                            spec.name.c_str(), spec.region.c_str());
                std::fflush(stdout);
                std::string answer;
                if (!std::getline(std::cin, answer) || answer != spec.name) {
                  std::printf("\nnot deleted\n");
                  return 1;
                }
              }
              return deploy_destroy(spec, out);
            }
            if (p->parsed()) return run_plan(*plan);
            if (ap->parsed()) return run_apply(*apply);
            if (vp->parsed()) return deploy_verify(load_cluster_file(verify->cluster), *verify_json, "");
            return 2;
          }};
}

}  // namespace st

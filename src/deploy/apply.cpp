#include "deploy/apply.h"

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <map>
#include <sstream>
#include <thread>
#include <algorithm>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "deploy/preflight.h"
#include "deploy/render.h"
#include "deploy/tools.h"
#include "deploy/verify.h"

namespace st {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool starts_with(const std::vector<std::string>& argv, std::initializer_list<const char*> prefix) {
  size_t i = 0;
  for (const char* p : prefix)
    if (i >= argv.size() || argv[i++] != p) return false;
  return true;
}

std::string option(const std::vector<std::string>& argv, const std::string& name) {
  for (size_t i = 0; i + 1 < argv.size(); ++i)
    if (argv[i] == name) return argv[i + 1];
  return "";
}

json parse_json(const ToolRun& r) {
  try {
    return json::parse(r.out);
  } catch (const json::exception&) {
    fail("deploy apply: `", r.line(), "` printed no JSON:\n", r.err_tail());
  }
}

// Seconds from the environment (the tests shorten the waits), or the default.
double env_seconds(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atof(v) : fallback;
}

class Applier {
 public:
  Applier(const ClusterSpec& s, const ApplyOptions& o, const ToolRunner& runner) : s_(s), o_(o), run_(runner) {}

  void step(const PlanStep& st, int total) {
    std::printf("[step %d/%d] %s\n", st.number, total, st.title.c_str());
    std::fflush(stdout);
    step_ = &st;
    for (const auto& argv : st.commands) command(argv);
  }

 private:
  [[noreturn]] void failed(const ToolRun& r, const std::string& why = "") {
    fail("deploy apply: step ", step_->number, " (", step_->title, ") failed: `", r.line(), "` exited ", r.code,
         " after ", static_cast<int>(r.seconds), " s", why.empty() ? "" : ": " + why, "\n", r.err_tail(),
         "(every command and its output: ", run_.log_path(), ")");
  }
  ToolRun must(const std::vector<std::string>& argv) {
    ToolRun r = run_.run(argv);
    if (r.code != 0) failed(r);
    return r;
  }
  void done(const ToolRun& r, const std::string& note = "") {
    std::printf("  $ %s\n    ok (%.1f s)%s\n", r.line().c_str(), r.seconds, note.empty() ? "" : ("; " + note).c_str());
    std::fflush(stdout);
  }
  void skipped(const std::vector<std::string>& argv, const std::string& why) {
    std::printf("  $ %s\n    skipped: %s\n", shell_line(argv).c_str(), why.c_str());
    std::fflush(stdout);
  }

  void command(const std::vector<std::string>& argv) {
    const InstanceFacts& g = *s_.gpu.facts;
    if (o_.dry_run) {
      std::printf("  $ %s\n", shell_line(argv).c_str());
      return;
    }
    if (starts_with(argv, {"shardtrain", "deploy", "plan"})) return;  // the artifacts are written already
    if (starts_with(argv, {"aws", "service-quotas", "get-service-quota"})) {
      const ToolRun r = must(argv);
      const double quota = parse_json(r).value("/Quota/Value"_json_pointer, -1.0);
      const long need = static_cast<long>(s_.gpu.count) * g.vcpus;
      if (quota < need)
        failed(r, "the quota \"" + g.quota_name + "\" (" + g.quota_code + ") is " + std::to_string(static_cast<long>(quota)) +
                      " vCPU but " + std::to_string(s_.gpu.count) + " x " + s_.gpu.instance_type + " need " +
                      std::to_string(need) + "; ask AWS for more, or use a capacity reservation");
      return done(r, std::to_string(static_cast<long>(quota)) + " vCPU, " + std::to_string(need) + " needed");
    }
    if (starts_with(argv, {"aws", "ec2", "describe-instance-type-offerings"})) {
      const ToolRun r = must(argv);
      if (parse_json(r).value("InstanceTypeOfferings", json::array()).empty())
        failed(r, "the zone does not offer " + s_.gpu.instance_type + " (" + option(argv, "--filters") +
                      "); pick another of cluster.zones for nodes.gpu.zones");
      return done(r, s_.gpu.instance_type + " offered");
    }
    if (starts_with(argv, {"aws", "ec2", "describe-capacity-reservations"})) {
      const ToolRun r = must(argv);
      long free = 0;
      for (const auto& c : parse_json(r).value("CapacityReservations", json::array()))
        if (c.value("State", "") == "active" && c.value("InstanceType", "") == s_.gpu.instance_type)
          free += c.value("AvailableInstanceCount", 0L);
      if (free < s_.gpu.count)
        failed(r, "capacity reservation " + s_.gpu.capacity_reservation_id + " has " + std::to_string(free) + " free " +
                      s_.gpu.instance_type + ", " + std::to_string(s_.gpu.count) + " needed");
      return done(r, std::to_string(free) + " free in the reservation");
    }
    if (starts_with(argv, {"aws", "ec2", "create-placement-group"})) {
      const ToolRun probe = run_.run({"aws", "ec2", "describe-placement-groups", "--group-names",
                                      option(argv, "--group-name"), "--region", s_.region, "--output", "json"});
      if (probe.code == 0) return skipped(argv, "placement group " + option(argv, "--group-name") + " exists");
      return done(must(argv));
    }
    if (starts_with(argv, {"eksctl", "create", "cluster"})) {
      const ToolRun probe = run_.run({"eksctl", "get", "cluster", "--name", s_.name, "--region", s_.region, "-o", "json"});
      if (probe.code != 0) return done(must(argv));
      // The cluster exists: create only the node groups that are missing.
      const ToolRun groups = must({"eksctl", "get", "nodegroup", "--cluster", s_.name, "--region", s_.region, "-o", "json"});
      std::set<std::string> have;
      for (const auto& gj : parse_json(groups)) have.insert(gj.value("Name", ""));
      std::string missing;
      for (const NodeGroupSpec* ng : {&s_.system, &s_.gpu})
        if (!have.count(ng->name)) missing += (missing.empty() ? "" : ",") + ng->name;
      if (missing.empty()) return skipped(argv, "cluster " + s_.name + " and its node groups exist");
      return done(must({"eksctl", "create", "nodegroup", "-f", option(argv, "-f"), "--include=" + missing,
                        "--install-nvidia-plugin=false"}),
                  "cluster existed; created node group(s) " + missing);
    }
    if (starts_with(argv, {"helm", "upgrade", "--install"}) && argv.size() > 3) {
      const std::string release = argv[3], ns = option(argv, "--namespace"), version = option(argv, "--version");
      // `helm list` names each release's chart as "<chart>-<version>" (helm 3 and 4 alike).
      const std::string chart = fs::path(argv[4]).extension() == ".tgz" ? fs::path(argv[4]).stem().string()
                                                                         : argv[4] + "-" + version;
      const ToolRun probe = run_.run({"helm", "list", "--namespace", ns, "--filter", "^" + release + "$", "-o", "json"});
      if (probe.code == 0) {
        try {
          for (const auto& rel : json::parse(probe.out))
            if (rel.value("name", "") == release && rel.value("status", "") == "deployed" &&
                rel.value("chart", "") == chart)
              return skipped(argv, "release " + release + " " + version + " is deployed");
        } catch (const json::exception&) {
        }
      }
      return done(must(argv));
    }
    if (starts_with(argv, {"kubectl", "-n"}) && argv.size() > 5 && argv[3] == "rollout" && argv[4] == "status" &&
        argv[5].rfind("daemonset/", 0) == 0)
      return on_every_gpu_node(argv[2], argv[5].substr(10), must(argv));
    if (starts_with(argv, {"kubectl", "-n"}) && argv.size() > 4 && argv[3] == "wait" &&
        std::find(argv.begin(), argv.end(), "--for=condition=RayClusterProvisioned") != argv.end())
    {
      // Before the long wait: a wrong pod or a node without its devices would only
      // leave the cluster unprovisioned for the whole timeout.
      workers_as_planned(argv[2]);
      if (deploy_verify(s_, false, run_.log_path()) != 0)
        fail("deploy apply: step ", step_->number, " (", step_->title, "): the checks above failed before waiting on "
             "RayClusterProvisioned (", run_.log_path(), ")");
    }
    if (starts_with(argv, {"kubectl", "apply", "--server-side", "-f"}) && fs::path(argv.back()).filename() == "job.yaml") {
      SubmitOptions so;  // step 8: submit, follow, and end with the job's result
      so.out_dir = o_.out_dir;
      so.poll_s = env_seconds("SHARDTRAIN_DEPLOY_POLL_S", so.poll_s);
      if (deploy_submit(s_, so) != 0) fail("deploy apply: step 8 (", step_->title, ") failed");
      submitted_ = true;
      return;
    }
    if (starts_with(argv, {"kubectl", "apply", "--server-side", "-f"}) &&
        fs::path(argv.back()).filename() == "workload.yaml") {
      done(must(argv));
      // The workers read the run's job secret from its Secret (a Ray worker when it
      // starts): it exists before they do.
      ensure_job_secret(run_, s_, false);
      return;
    }
    if (submitted_ && starts_with(argv, {"kubectl"}) && std::find(argv.begin(), argv.end(), "logs") != argv.end())
      return;  // submit followed the logs already
    if (starts_with(argv, {"shardtrain", "deploy", "verify"})) {  // step 7, in this process
      const int rc = deploy_verify(s_, false, run_.log_path());
      if (rc != 0)
        fail("deploy apply: step ", step_->number, " (", step_->title, "): the checks above failed (", run_.log_path(), ")");
      return;
    }
    done(must(argv));
  }

  // A rollout of a DaemonSet that selects no node succeeds: the plugin's DaemonSet
  // must also have one pod desired and ready per GPU node.
  void on_every_gpu_node(const std::string& ns, const std::string& name, const ToolRun& rollout) {
    const auto t0 = std::chrono::steady_clock::now();
    const double wait_s = env_seconds("SHARDTRAIN_DEPLOY_WAIT_S", 120), poll_s = env_seconds("SHARDTRAIN_DEPLOY_POLL_S", 2);
    const long want = s_.gpu.count;
    while (true) {
      const ToolRun r = must({"kubectl", "-n", ns, "get", "daemonset", name, "-o", "json"});
      const json st = parse_json(r).value("status", json::object());
      const long desired = st.value("desiredNumberScheduled", 0L), ready = st.value("numberReady", 0L);
      if (desired == want && ready == want)
        return done(rollout, std::to_string(ready) + " of " + std::to_string(want) + " GPU nodes have its pod ready");
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= wait_s)
        fail("deploy apply: step ", step_->number, " (", step_->title, ") failed: daemonset ", ns, "/", name, " has ",
             desired, " pod", desired == 1 ? "" : "s", " desired and ", ready, " ready, but the node group ", s_.gpu.name,
             " has ", want, " GPU node", want == 1 ? "" : "s",
             desired < want ? ": its nodeSelector, node affinity or tolerations leave GPU nodes out (they carry the "
                              "label nvidia.com/gpu.present=true and the taint nvidia.com/gpu=true:NoSchedule), or "
                              "nodes are not Ready (`shardtrain deploy verify` names them)"
                            : ": it runs on nodes outside the GPU node group too",
             "\n(every command and its output: ", run_.log_path(), ")");
      std::this_thread::sleep_for(std::chrono::duration<double>(poll_s));
    }
  }

  // The workload's worker pods, once they exist (up to a minute), against the plan:
  // the GPUs and EFA devices each asks for, requests == limits.
  void workers_as_planned(const std::string& ns) {
    const auto t0 = std::chrono::steady_clock::now();
    const double wait_s = env_seconds("SHARDTRAIN_DEPLOY_WAIT_S", 60), poll_s = env_seconds("SHARDTRAIN_DEPLOY_POLL_S", 2);
    while (true) {
      const ToolRun r = must({"kubectl", "-n", ns, "get", "pods", "-l", "app.kubernetes.io/instance=" + s_.job_name,
                              "-o", "json"});
      int workers = 0;
      std::string bad;
      for (const auto& pod : parse_json(r).value("items", json::array())) {
        if (!is_worker_pod(s_, pod)) continue;
        ++workers;
        for (const Check& c : worker_pod_checks(s_, pod))
          if (!c.ok) bad += "\n  " + c.subject + ": " + c.what + ": " + c.detail;
      }
      if (!bad.empty())
        fail("deploy apply: step ", step_->number, " (", step_->title, ") failed: worker pods differ from the plan:", bad,
             "\n(every command and its output: ", run_.log_path(), ")");
      if (workers >= s_.gpu.count) return done(r, std::to_string(workers) + " worker pods as planned");
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= wait_s)
        return done(r, std::to_string(workers) + " of " + std::to_string(s_.gpu.count) +
                           " worker pods so far, each as planned");
      std::this_thread::sleep_for(std::chrono::duration<double>(poll_s));
    }
  }

  const ClusterSpec& s_;
  const ApplyOptions& o_;
  const ToolRunner& run_;
  const PlanStep* step_ = nullptr;
  bool submitted_ = false;
};

}  // namespace

int deploy_apply(const ClusterSpec& s, const ApplyOptions& o) {
  const std::vector<PlanStep> steps = plan_steps(s, o.out_dir);
  const int last = o.train ? 8 : 7;
  // Every tool the steps call, before anything runs.
  std::set<std::string> tools;
  for (const PlanStep& st : steps)
    if (st.number >= 3 && st.number <= last)
      for (const auto& c : st.commands)
        if (c.at(0) != "shardtrain") tools.insert(c.at(0));  // this program runs its own steps
  std::string missing;
  for (const std::string& t : tools)
    if (!tool_on_path(t)) missing += "\n  " + t + ": " + install_hint(t);
  if (!missing.empty() && !o.dry_run) fail("deploy apply: tools missing from PATH:", missing);

  ToolRunner runner(o.dry_run ? "" : (fs::path(o.out_dir) / "deploy.log").string());
  Applier a(s, o, runner);
  for (const PlanStep& st : steps)
    if (st.number >= 3 && st.number <= last) {
      if (st.commands.empty()) {
        std::printf("[step %d/%d] %s: nothing to run%s\n", st.number, last, st.title.c_str(),
                    st.notes.empty() ? "" : (" (" + st.notes.front() + ")").c_str());
        continue;
      }
      a.step(st, last);
    }
  if (!o.dry_run)
    std::printf("deploy apply: done (steps 3 to %d); every command and its output: %s\n", last,
                runner.log_path().c_str());
  return 0;
}

int deploy_verify(const ClusterSpec& s, bool as_json, const std::string& log_path) {
  if (!tool_on_path("kubectl")) fail("deploy verify: kubectl is not on PATH: ", install_hint("kubectl"));
  const ToolRunner runner(log_path);
  ClusterState state;
  for (auto [what, target] : {std::pair<const char*, json*>{"nodes", &state.nodes}, {"pods", &state.pods},
                              {"daemonsets", &state.daemonsets}}) {
    std::vector<std::string> argv = {"kubectl", "get", what, "-o", "json"};
    if (std::string(what) != "nodes") argv.insert(argv.begin() + 3, "--all-namespaces");
    const ToolRun r = runner.run(argv);
    if (r.code != 0) fail("deploy verify: `", r.line(), "` exited ", r.code, ":\n", r.err_tail());
    *target = parse_json(r);
  }
  const std::vector<Check> checks = verify_cluster(s, state);
  int failed = 0;
  for (const Check& c : checks) failed += !c.ok;
  if (as_json)
    std::printf("%s\n", json{{"ok", failed == 0}, {"checks", checks_json(checks)}}.dump(1).c_str());
  else
    std::printf("%s", format_checks(checks).c_str());
  if (failed) {
    std::string list;
    for (const Check& c : checks)
      if (!c.ok) list += "\n  " + c.subject + ": " + c.what + ": " + c.detail;
    std::fprintf(stderr, "deploy verify: %d check%s failed:%s\n", failed, failed == 1 ? "" : "s", list.c_str());
    return 1;
  }
  return 0;
}

int deploy_destroy(const ClusterSpec& s, const std::string& out_dir) {
  const ToolRunner run((fs::path(out_dir) / "deploy.log").string());
  for (const std::vector<std::string>& argv :
       {std::vector<std::string>{"eksctl", "delete", "cluster", "-f", (fs::path(out_dir) / "eksctl-cluster.yaml").string(),
                                 "--wait"},
        std::vector<std::string>{"aws", "ec2", "delete-placement-group", "--group-name", s.gpu.placement_group,
                                 "--region", s.region}}) {
    if (argv[0] == "aws" && !uses_placement_group(s)) continue;
    std::printf("  $ %s\n", shell_line(argv).c_str());
    std::fflush(stdout);
    const ToolRun r = run.run(argv);
    if (r.code != 0) fail("deploy destroy: `", r.line(), "` exited ", r.code, ":\n", r.err_tail());
  }
  std::printf("deploy destroy: cluster %s deleted\n", s.name.c_str());
  return 0;
}

}  // namespace st

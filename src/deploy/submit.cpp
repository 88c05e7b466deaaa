#include "deploy/submit.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "deploy/render.h"
#include "deploy/verify.h"

namespace st {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json parse_json(const ToolRun& r) {
  try {
    return json::parse(r.out);
  } catch (const json::exception&) {
    fail("deploy: `", r.line(), "` printed no JSON:\n", r.err_tail());
  }
}

json kubectl_json(const ToolRunner& run, const std::vector<std::string>& argv) {
  const ToolRun r = run.run(argv);
  if (r.code != 0) fail("deploy: `", r.line(), "` exited ", r.code, ":\n", r.err_tail());
  return parse_json(r);
}

const json& field(const json& o, const char* key) {
  static const json empty = json::object();
  return o.is_object() && o.contains(key) && o[key].is_object() ? o[key] : empty;
}
std::string str(const json& o, const char* key) {
  return o.is_object() && o.contains(key) && o[key].is_string() ? o[key].get<std::string>() : "";
}
std::string name_of(const json& o) { return str(field(o, "metadata"), "name"); }
std::string uid_of(const json& o) { return str(field(o, "metadata"), "uid"); }

// The object job.yaml makes, by engine.
std::string job_kind(const ClusterSpec& s) {
  return s.engine == "pytorchjob" ? "pytorchjob" : s.engine == "kuberay" ? "rayjob" : "job";
}

// The job object as it is now, or null when there is none.
json job_object(const ToolRunner& run, const ClusterSpec& s, const std::string& kind, const std::string& name) {
  const ToolRun got = run.run({"kubectl", "-n", s.namespace_, "get", kind, name, "-o", "json"});
  if (got.code != 0) return nullptr;
  return parse_json(got);
}

// A condition of type `type` with status True.
const json* true_condition(const json& o, const std::string& type) {
  const json& st = field(o, "status");
  if (!st.contains("conditions") || !st["conditions"].is_array()) return nullptr;
  for (const auto& c : st["conditions"])
    if (str(c, "type") == type && str(c, "status") == "True") return &c;
  return nullptr;
}

// How the job object ended, or "" while it runs.
std::string finished(const ClusterSpec& s, const json& o) {
  if (o.is_null()) return "";
  if (s.engine == "kuberay") {
    const std::string d = str(field(o, "status"), "jobDeploymentStatus");
    return d == "Complete" || d == "Failed" ? d : "";
  }
  for (const char* t : {"Complete", "Succeeded", "Failed"})
    if (true_condition(o, t)) return t;
  return "";
}

// Pods whose controller is the object of this UID (a Job's carry its UID as a label;
// a PyTorchJob's are found by its name label, then by owner).
std::vector<json> owned_pods(const ToolRunner& run, const ClusterSpec& s, const std::string& selector,
                             const std::string& uid) {
  std::vector<json> out;
  const json pods = kubectl_json(run, {"kubectl", "-n", s.namespace_, "get", "pods", "-l", selector, "-o", "json"});
  for (const auto& pod : pods.value("items", json::array()))
    for (const auto& o : field(pod, "metadata").value("ownerReferences", json::array()))
      if (str(o, "uid") == uid) {
        out.push_back(pod);
        break;
      }
  return out;
}

// The Ray worker pods of the RayCluster the RayJob runs on (KubeRay's, by labels).
std::vector<json> ray_worker_pods(const ToolRunner& run, const ClusterSpec& s) {
  const json pods = kubectl_json(run, {"kubectl", "-n", s.namespace_, "get", "pods", "-l",
                                       "ray.io/cluster=" + s.job_name + ",ray.io/node-type=worker", "-o", "json"});
  return pods.value("items", json::array()).get<std::vector<json>>();
}

// The pods of the run: the workers, and for kuberay the submitter's (driver's) pod.
struct RunPods {
  std::vector<json> workers;
  std::vector<json> driver;  // kuberay: the submitter Job's pods
};

RunPods run_pods(const ToolRunner& run, const ClusterSpec& s, const std::string& uid) {
  RunPods p;
  if (s.engine == "job") {
    p.workers = owned_pods(run, s, "batch.kubernetes.io/controller-uid=" + uid, uid);
  } else if (s.engine == "pytorchjob") {
    p.workers = owned_pods(run, s, "training.kubeflow.org/job-name=" + s.job_name, uid);
  } else {
    p.workers = ray_worker_pods(run, s);
    // KubeRay's submitter: a Job of the RayJob's name that the RayJob owns.
    const json job = job_object(run, s, "job", s.job_name);
    bool ours = false;
    if (!job.is_null())
      for (const auto& o : field(job, "metadata").value("ownerReferences", json::array())) ours = ours || str(o, "uid") == uid;
    if (ours) p.driver = owned_pods(run, s, "batch.kubernetes.io/controller-uid=" + uid_of(job), uid_of(job));
  }
  return p;
}

// A worker pod's index: its completion index (job), 0 for the Master and i + 1 for
// Worker i (pytorchjob), -1 when it has none.
int pod_index(const json& pod) {
  const json& labels = field(field(pod, "metadata"), "labels");
  const std::string idx = str(labels, "batch.kubernetes.io/job-completion-index");
  if (!idx.empty()) return std::atoi(idx.c_str());
  const std::string type = str(labels, "training.kubeflow.org/replica-type");
  const std::string ri = str(labels, "training.kubeflow.org/replica-index");
  if (type == "master") return 0;
  if (type == "worker" && !ri.empty()) return std::atoi(ri.c_str()) + 1;
  return -1;
}

std::string phase_of(const json& pod) {
  const std::string p = str(field(pod, "status"), "phase");
  return p.empty() ? "Pending" : p;
}

// Why a pod waits: the scheduler's message, or its container's waiting reason
// (e.g. CreateContainerConfigError: secret "..." not found).
std::string pending_reason(const json& pod) {
  const json& st = field(pod, "status");
  for (const auto& c : st.value("conditions", json::array()))
    if (str(c, "type") == "PodScheduled" && str(c, "status") == "False")
      return str(c, "reason") + ": " + str(c, "message");
  for (const auto& c : st.value("containerStatuses", json::array())) {
    const json& w = field(field(c, "state"), "waiting");
    if (!str(w, "reason").empty() && str(w, "reason") != "ContainerCreating")
      return str(w, "reason") + ": " + str(w, "message");
  }
  return "";
}

// The lines of a failed rank's log that say why: the transport gate's refusal and
// NCCL's channel lines, or the last error.
std::vector<std::string> why_lines(const std::string& log) {
  std::vector<std::string> gate, all;
  std::stringstream ss(log);
  for (std::string l; std::getline(ss, l);) {
    if (l.empty()) continue;
    all.push_back(l);
    if (l.find("expect-transport") != std::string::npos || l.find("expect_transport") != std::string::npos ||
        l.find(" via NET/") != std::string::npos)
      gate.push_back(l);
  }
  if (!gate.empty()) return gate;
  // Otherwise the end of the log, where a rank says why it stopped.
  return std::vector<std::string>(all.size() > 4 ? all.end() - 4 : all.begin(), all.end());
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// One line for the job object's state as its controller reports it ("" for a Job:
// its pods say it).
std::string object_state(const ClusterSpec& s, const json& o) {
  const json& st = field(o, "status");
  if (s.engine == "kuberay") {
    std::string d = str(st, "jobDeploymentStatus"), j = str(st, "jobStatus");
    if (d.empty()) return "";
    std::string line = d + (j.empty() ? "" : " (job " + j + ")");
    if (!str(st, "reason").empty()) line += ", reason " + str(st, "reason");
    return line;
  }
  if (s.engine == "pytorchjob") {
    std::string last;
    for (const auto& c : st.value("conditions", json::array()))
      if (str(c, "status") == "True") last = str(c, "type");
    return last;
  }
  return "";
}

std::string random_hex(size_t bytes) {
  std::ifstream in("/dev/urandom", std::ios::binary);
  std::string raw(bytes, '\0');
  in.read(raw.data(), static_cast<std::streamsize>(bytes));
  if (!in) fail("deploy: cannot read /dev/urandom for the job secret");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) out += {hex[c >> 4], hex[c & 15]};
  return out;
}

// Follows one run to its end.
class Follower {
 public:
  Follower(const ToolRunner& run, const ClusterSpec& s, const SubmitOptions& o) : run_(run), s_(s), o_(o) {}

  int follow(const std::string& uid) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string kind = job_kind(s_);
    while (true) {
      const json obj = job_object(run_, s_, kind, s_.job_name);
      if (obj.is_null() || uid_of(obj) != uid)
        fail("deploy submit: ", kind, " ", s_.job_name, " (uid ", uid, ") ",
             obj.is_null() ? "is gone" : "was replaced by another of the same name", " in namespace ", s_.namespace_);
      const std::string state = object_state(s_, obj);
      if (!state.empty() && state != said_object_) {
        said_object_ = state;
        say(kind + " " + s_.job_name + ": " + state);
      }
      const RunPods pods = run_pods(run_, s_, uid);
      for (const json& pod : pods.workers) look_at(pod, true);
      for (const json& pod : pods.driver) look_at(pod, false);
      pick_log_pod(pods);
      show_log(false);
      if (const int rc = outcome(obj, pods); rc >= 0) return rc;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (waited > o_.timeout_s) {
        int ok = 0;
        for (const json& pod : pods.workers) ok += phase_of(pod) == "Succeeded";
        fail("deploy submit: ", s_.job_name, " did not finish within ", static_cast<int>(o_.timeout_s), " s",
             s_.engine == "kuberay" ? " (rayjob: " + (state.empty() ? std::string("no status yet") : state) + ")"
                                    : " (" + std::to_string(ok) + " of " + std::to_string(s_.gpu.count) +
                                          " pods succeeded)",
             "; it keeps running: `shardtrain deploy status`");
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(o_.poll_s));
    }
  }

 private:
  void say(const std::string& line) {
    std::printf("deploy submit: %s\n", line.c_str());
    std::fflush(stdout);
  }

  void look_at(const json& pod, bool worker) {
    const std::string name = name_of(pod);
    if (worker && checked_.insert(name).second) {  // a pod unlike the plan would wait or fail for nothing
      std::string bad;
      for (const Check& c : worker_pod_checks(s_, pod))
        if (!c.ok) bad += "\n  " + c.subject + ": " + c.what + ": " + c.detail;
      if (!bad.empty()) fail("deploy submit: ", s_.job_name, ": a worker pod differs from the plan:", bad);
    }
    std::string state = phase_of(pod);
    if (state == "Pending") {
      const std::string why = pending_reason(pod);
      if (!why.empty()) state += " (" + why + ")";
    }
    if (said_[name] != state) {
      said_[name] = state;
      say("pod " + name + (worker ? "" : " (driver)") + ": " + state);
    }
  }

  // Whose log is the run's: rank 0's pod (job), the Master (pytorchjob), the
  // submitter's, i.e. the driver's (kuberay).
  void pick_log_pod(const RunPods& pods) {
    if (!log_pod_.empty()) return;
    if (s_.engine == "kuberay") {
      for (const json& pod : pods.driver)
        if (phase_of(pod) != "Pending") log_pod_ = name_of(pod), tag_ = "[driver] ";
      return;
    }
    for (const json& pod : pods.workers)
      if (pod_index(pod) == 0 && phase_of(pod) != "Pending")
        log_pod_ = name_of(pod), tag_ = s_.engine == "pytorchjob" ? "[master] " : "[pod 0] ";
  }

  void show_log(bool all) {
    if (log_pod_.empty()) return;
    const ToolRun r = run_.run({"kubectl", "-n", s_.namespace_, "logs", log_pod_});
    if (r.code != 0 || r.out.size() <= shown_) return;
    std::string fresh = r.out.substr(shown_);
    if (!all) fresh = fresh.substr(0, fresh.rfind('\n') == std::string::npos ? 0 : fresh.rfind('\n') + 1);
    shown_ += fresh.size();
    std::stringstream ss(fresh);
    for (std::string l; std::getline(ss, l);) std::printf("%s%s\n", tag_.c_str(), l.c_str());
    std::fflush(stdout);
  }

  std::string failed_pods_report(const std::vector<json>& pods) {
    std::string report;
    for (const json& pod : pods) {
      if (phase_of(pod) != "Failed") continue;
      const ToolRun r = run_.run({"kubectl", "-n", s_.namespace_, "logs", name_of(pod)});
      report += "\n  pod " + name_of(pod) + " (index " + std::to_string(pod_index(pod)) + ") failed";
      for (const std::string& l : why_lines(r.out)) report += "\n    " + l;
    }
    return report;
  }

  [[noreturn]] void failed(const std::string& what) {
    show_log(true);
    fail("deploy submit: ", s_.job_name, " failed: ", what, "\n(`shardtrain deploy logs --cluster ", s_.path,
         "` shows ", s_.engine == "kuberay" ? "the driver's" : "a pod's", " whole log)");
  }

  // 0 on success, -1 while it runs; throws on failure.
  int outcome(const json& obj, const RunPods& pods) {
    const std::string end = finished(s_, obj);
    if (s_.engine == "kuberay") {
      if (end.empty()) return -1;
      const json& st = field(obj, "status");
      const std::string job = str(st, "jobStatus");
      if (end == "Complete" && job == "SUCCEEDED") {
        show_log(true);
        say(s_.job_name + " completed: rayjob Complete, job SUCCEEDED");
        return 0;
      }
      std::string report = "rayjob " + end + " (job " + (job.empty() ? "not started" : job) + ")";
      if (!str(st, "reason").empty()) report += ", reason " + str(st, "reason");
      if (!str(st, "message").empty()) report += ": " + first_line(str(st, "message"));
      for (const json& pod : pods.driver) {
        const ToolRun r = run_.run({"kubectl", "-n", s_.namespace_, "logs", name_of(pod)});
        report += "\n  driver pod " + name_of(pod) + " (" + phase_of(pod) + "):";
        for (const std::string& l : why_lines(r.out)) report += "\n    " + l;
      }
      failed(report);
    }
    int ok = 0, bad = 0;
    for (const json& pod : pods.workers) ok += phase_of(pod) == "Succeeded", bad += phase_of(pod) == "Failed";
    if (s_.engine == "pytorchjob") {
      if (end == "Succeeded") {
        show_log(true);
        say(s_.job_name + " completed: pytorchjob Succeeded, " + std::to_string(ok) + " of " +
            std::to_string(s_.gpu.count) + " pods succeeded");
        return 0;
      }
      // The operator's Failed condition follows a failed pod (restartPolicy Never).
      if (end == "Failed")
        failed("pytorchjob Failed: " + str(*true_condition(obj, "Failed"), "message") + failed_pods_report(pods.workers));
      return -1;
    }
    // job: the Job's condition, or its pods as they end (a failed pod ends the run:
    // its ranks' peers cannot go on without it).
    if (end == "Complete" || (end.empty() && bad == 0 && ok == s_.gpu.count && ok > 0)) {
      show_log(true);
      say(s_.job_name + " completed: " + std::to_string(ok) + " of " + std::to_string(s_.gpu.count) +
          " pods succeeded");
      return 0;
    }
    if (end == "Failed" || bad > 0) failed("job " + (end.empty() ? std::string("has a failed pod") : end) +
                                           failed_pods_report(pods.workers));
    return -1;
  }

  const ToolRunner& run_;
  const ClusterSpec& s_;
  const SubmitOptions& o_;
  std::map<std::string, std::string> said_;  // pod -> last state printed
  std::set<std::string> checked_;            // worker pods compared with the plan
  std::string said_object_;                  // the job object's last state printed
  std::string log_pod_, tag_;
  size_t shown_ = 0;                         // bytes of its log printed so far
};

}  // namespace

void ensure_job_secret(const ToolRunner& run, const ClusterSpec& s, bool renew) {
  const std::string name = job_secret_name(s);
  const ToolRun got = run.run({"kubectl", "-n", s.namespace_, "get", "secret", name, "-o", "name"});
  if (got.code == 0 && !renew) return;
  if (got.code == 0) {
    const ToolRun del = run.run({"kubectl", "-n", s.namespace_, "delete", "secret", name, "--wait=true"});
    if (del.code != 0) fail("deploy: `", del.line(), "` exited ", del.code, ":\n", del.err_tail());
  }
  // The value goes through a private file that is removed at once: never on a
  // command line (visible to every user, and logged), never in the plan directory.
  char path[] = "/tmp/shardtrain-secret-XXXXXX";
  const int fd = ::mkstemp(path);  // mode 0600
  if (fd < 0) fail("deploy: cannot create a private file for the job secret in /tmp");
  const std::string value = random_hex(32);
  const bool wrote = ::write(fd, value.data(), value.size()) == static_cast<ssize_t>(value.size());
  ::close(fd);
  ToolRun made;
  if (wrote)
    made = run.run({"kubectl", "-n", s.namespace_, "create", "secret", "generic", name,
                    "--from-file=" + std::string(kJobSecretKey) + "=" + path});
  fs::remove(path);
  if (!wrote) fail("deploy: cannot write the job secret's private file");
  if (made.code != 0) fail("deploy: `", made.line(), "` exited ", made.code, ":\n", made.err_tail());
  std::printf("deploy: job secret %s/%s %s (a random SHARDTRAIN_JOB_SECRET for the rendezvous)\n",
              s.namespace_.c_str(), name.c_str(), got.code == 0 ? "renewed" : "created");
  std::fflush(stdout);
}

int deploy_submit(const ClusterSpec& s, const SubmitOptions& o) {
  if (!tool_on_path("kubectl")) fail("deploy submit: kubectl is not on PATH: ", install_hint("kubectl"));
  const ToolRunner run((fs::path(o.out_dir) / "deploy.log").string());
  const std::string kind = job_kind(s);
  // An earlier run's finished object is not run again by its controller when the
  // same document is applied: it goes first. A running one is followed.
  const json before = job_object(run, s, kind, s.job_name);
  const std::string ended = finished(s, before);
  if (!ended.empty()) {
    const ToolRun del = run.run({"kubectl", "-n", s.namespace_, "delete", kind, s.job_name, "--wait=true"});
    if (del.code != 0) fail("deploy submit: `", del.line(), "` exited ", del.code, ":\n", del.err_tail());
    std::printf("deploy submit: %s %s of an earlier run (%s) deleted\n", kind.c_str(), s.job_name.c_str(),
                ended.c_str());
  }
  const bool new_run = before.is_null() || !ended.empty();
  ensure_job_secret(run, s, new_run && s.engine != "kuberay");
  const ToolRun applied = run.run({"kubectl", "apply", "--server-side", "-f", (fs::path(o.out_dir) / "job.yaml").string()});
  if (applied.code != 0)
    fail("deploy submit: `", applied.line(), "` exited ", applied.code, ":\n", applied.err_tail());
  std::printf("deploy submit: %s", applied.out.c_str());
  const json obj = job_object(run, s, kind, s.job_name);
  if (obj.is_null())
    fail("deploy submit: ", kind, " ", s.job_name, " is not in namespace ", s.namespace_, " after `", applied.line(), "`");
  Follower f(run, s, o);
  return f.follow(uid_of(obj));
}

int deploy_status(const ClusterSpec& s) {
  const ToolRunner run;
  const std::string kind = job_kind(s);
  const json obj = job_object(run, s, kind, s.job_name);
  if (obj.is_null()) {
    std::printf("(no %s %s in %s)\n", kind.c_str(), s.job_name.c_str(), s.namespace_.c_str());
    return 0;
  }
  const std::string state = object_state(s, obj);
  if (!state.empty()) std::printf("%s %s: %s\n", kind.c_str(), s.job_name.c_str(), state.c_str());
  const RunPods pods = run_pods(run, s, uid_of(obj));
  std::printf("%-40s %-6s %-10s %s\n", "pod", "index", "phase", "node / why");
  for (const std::vector<json>* group : {&pods.workers, &pods.driver})
    for (const auto& pod : *group) {
      const std::string phase = phase_of(pod);
      const std::string where = phase == "Pending" ? pending_reason(pod) : str(field(pod, "spec"), "nodeName");
      std::printf("%-40s %-6s %-10s %s\n", name_of(pod).c_str(),
                  group == &pods.driver ? "driver" : std::to_string(pod_index(pod)).c_str(), phase.c_str(),
                  where.c_str());
    }
  if (pods.workers.empty() && pods.driver.empty())
    std::printf("(no pods of %s in %s)\n", s.job_name.c_str(), s.namespace_.c_str());
  return 0;
}

int deploy_logs(const ClusterSpec& s, int rank) {
  const ToolRunner run;
  const json obj = job_object(run, s, job_kind(s), s.job_name);
  if (obj.is_null()) fail("deploy logs: no ", job_kind(s), " ", s.job_name, " in ", s.namespace_);
  const RunPods pods = run_pods(run, s, uid_of(obj));
  // kuberay: every node's output reaches the driver's log ("[node i] [rank r] ...").
  const int want = rank < 0 ? 0 : rank / std::max(1, s.pod_gpus);
  for (const auto& pod : s.engine == "kuberay" ? pods.driver : pods.workers) {
    if (s.engine != "kuberay" && pod_index(pod) != want) continue;
    const ToolRun r = run.run({"kubectl", "-n", s.namespace_, "logs", name_of(pod)});
    if (r.code != 0) fail("deploy logs: `", r.line(), "` exited ", r.code, ":\n", r.err_tail());
    const std::string tag = "[rank " + std::to_string(rank) + "]";
    std::stringstream ss(r.out);
    for (std::string l; std::getline(ss, l);) {
      const size_t at = l.find(tag);
      if (rank < 0) std::printf("%s\n", l.c_str());
      else if (at == 0 || (s.engine == "kuberay" && at != std::string::npos)) std::printf("%s\n", l.c_str());
    }
    return 0;
  }
  if (s.engine == "kuberay") fail("deploy logs: rayjob ", s.job_name, " has no driver pod (yet) in ", s.namespace_);
  fail("deploy logs: no pod with index ", want, " (rank ", std::max(rank, 0), ") of ", s.job_name, " in ",
       s.namespace_);
}

int deploy_down(const ClusterSpec& s, const std::string& out_dir) {
  const ToolRunner run((fs::path(out_dir) / "deploy.log").string());
  std::vector<std::vector<std::string>> cmds = {
      {"kubectl", "delete", "--ignore-not-found", "-f", (fs::path(out_dir) / "job.yaml").string()},
      {"kubectl", "-n", s.namespace_, "delete", "secret", job_secret_name(s), "--ignore-not-found"},
      {"kubectl", "delete", "--ignore-not-found", "-f", (fs::path(out_dir) / "workload.yaml").string()}};
  for (const auto& argv : cmds) {
    const ToolRun r = run.run(argv);
    if (r.code != 0) fail("deploy down: `", r.line(), "` exited ", r.code, ":\n", r.err_tail());
    std::printf("%s", r.out.c_str());
  }
  return 0;
}

}  // namespace st

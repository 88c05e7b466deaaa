#include "deploy/verify.h"

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <map>
#include <set>

namespace st {
namespace {

using nlohmann::json;

const char* kGpuLabel = "nvidia.com/gpu.present";
const char* kZoneLabel = "topology.kubernetes.io/zone";
const char* kGroupLabel = "eks.amazonaws.com/nodegroup";

std::string label(const json& o, const std::string& key) {
  const json l = o.value("metadata", json::object()).value("labels", json::object());
  return l.contains(key) && l[key].is_string() ? l[key].get<std::string>() : "";
}

std::string allocatable(const json& node, const std::string& res) {
  const json a = node.value("status", json::object()).value("allocatable", json::object());
  return a.contains(res) && a[res].is_string() ? a[res].get<std::string>() : "0";
}

bool ready(const json& pod) {
  for (const auto& c : pod.value("status", json::object()).value("conditions", json::array()))
    if (c.value("type", "") == "Ready") return c.value("status", "") == "True";
  return false;
}

// Which device plugin a DaemonSet or its pod runs, by its container image: "nvidia",
// "efa" or "" (the NVIDIA chart's MPS daemon and feature discovery are not plugins).
std::string plugin_of(const json& pod_spec, const std::string& name) {
  if (name.find("mps") != std::string::npos || name.find("feature-discovery") != std::string::npos) return "";
  for (const auto& c : pod_spec.value("containers", json::array())) {
    const std::string image = c.value("image", "");
    if (image.find("aws-efa-k8s-device-plugin") != std::string::npos) return "efa";
    if (image.find("k8s-device-plugin") != std::string::npos) return "nvidia";
  }
  return "";
}

// Why a node cannot run pods: its Ready condition other than True, and the taints the
// node lifecycle controller sets on a NotReady or unreachable node. "" when ready.
std::string not_ready(const json& node) {
  std::string why;
  bool found = false;
  for (const auto& c : node.value("status", json::object()).value("conditions", json::array())) {
    if (c.value("type", "") != "Ready") continue;
    found = true;
    if (c.value("status", "") != "True")
      why = "Ready=" + c.value("status", "") + (c.value("reason", "").empty() ? "" : " (" + c.value("reason", "") + ")");
  }
  if (!found) why = "no Ready condition";
  for (const auto& t : node.value("spec", json::object()).value("taints", json::array())) {
    const std::string key = t.value("key", "");
    if (key == "node.kubernetes.io/unreachable" || key == "node.kubernetes.io/not-ready")
      why += (why.empty() ? "" : "; ") + std::string("taint ") + key + ":" + t.value("effect", "");
  }
  return why;
}

// The amount of an extended resource a pod asks for (its containers' requests, which
// Kubernetes takes from the limits when only those are given).
long requested(const json& pod_spec, const std::string& res) {
  long n = 0;
  for (const auto& c : pod_spec.value("containers", json::array())) {
    const json r = c.value("resources", json::object());
    const json from = r.value("requests", json::object()).contains(res) ? r["requests"] : r.value("limits", json::object());
    if (from.contains(res)) {
      const json& q = from[res];
      n += q.is_string() ? std::atol(q.get<std::string>().c_str()) : q.is_number() ? q.get<long>() : 0;
    }
  }
  return n;
}

std::string owner_daemonset(const json& pod) {
  for (const auto& o : pod.value("metadata", json::object()).value("ownerReferences", json::array()))
    if (o.value("kind", "") == "DaemonSet") return o.value("name", "");
  return "";
}

}  // namespace

bool is_worker_pod(const ClusterSpec& s, const json& pod) {
  return pod.value("metadata", json::object()).value("namespace", "") == s.namespace_ &&
         label(pod, "app.kubernetes.io/instance") == s.job_name &&
         label(pod, "ray.io/node-type") != "head";  // the CPU-only Ray head
}

std::vector<Check> worker_pod_checks(const ClusterSpec& s, const json& pod) {
  std::vector<Check> out;
  const json spec = pod.value("spec", json::object());
  const std::string subject = "pod " + s.namespace_ + "/" + pod.value("metadata", json::object()).value("name", "?");
  bool equal = true;
  for (const auto& c : spec.value("containers", json::array())) {
    const json r = c.value("resources", json::object());
    equal = equal && r.contains("limits") && (!r.contains("requests") || r["requests"] == r["limits"]);
  }
  out.push_back({subject, "requests == limits", equal, equal ? "yes" : "no: the pod is not Guaranteed"});
  // What the plan gives every worker: all the node's GPUs and its EFA devices.
  for (const auto& [res, want] : {std::pair<std::string, long>{"nvidia.com/gpu", s.pod_gpus},
                                  {"vpc.amazonaws.com/efa", std::max(s.pod_efa, 0)}}) {
    const long got = requested(spec, res);
    out.push_back({subject, "requested " + res, got == want,
                   std::to_string(got) + (got == want ? "" : ", want " + std::to_string(want) + " (the plan's worker pod)")});
  }
  const std::string qos = pod.value("status", json::object()).value("qosClass", "");
  if (!qos.empty()) out.push_back({subject, "qosClass", qos == "Guaranteed", qos});
  return out;
}

std::vector<Check> verify_cluster(const ClusterSpec& s, const ClusterState& st) {
  std::vector<Check> out;
  auto add = [&](const std::string& subject, const std::string& what, bool ok, const std::string& detail) {
    out.push_back({subject, what, ok, detail});
  };
  const InstanceFacts& g = *s.gpu.facts;
  const std::string zone = s.gpu.zones.empty() ? "" : s.gpu.zones.front();

  // The GPU nodes: those of the GPU node group (by EKS's label), so a node that lost
  // its GPU label is still found and reported.
  std::vector<json> gpu_nodes;
  for (const auto& n : st.nodes.value("items", json::array()))
    if (label(n, kGroupLabel) == s.gpu.name || label(n, kGpuLabel) == "true") gpu_nodes.push_back(n);
  add("node group " + s.gpu.name, "GPU nodes", static_cast<int>(gpu_nodes.size()) == s.gpu.count,
      std::to_string(gpu_nodes.size()) + (static_cast<int>(gpu_nodes.size()) == s.gpu.count
                                              ? ""
                                              : ", want " + std::to_string(s.gpu.count)));

  for (const auto& n : st.nodes.value("items", json::array()))
    if (label(n, kGroupLabel) == s.system.name) {
      const std::string down = not_ready(n);
      add("node " + n.value("metadata", json::object()).value("name", "?"), "Ready", down.empty(),
          down.empty() ? "yes" : down + ": the system node group runs CoreDNS and the operators");
    }

  // DaemonSets per plugin.
  std::map<std::string, std::vector<std::string>> owners;
  for (const auto& d : st.daemonsets.value("items", json::array())) {
    const std::string name = d.value("metadata", json::object()).value("name", "");
    const json tmpl = d.value("spec", json::object()).value("template", json::object());
    const std::string p = plugin_of(tmpl.value("spec", json::object()), name);
    if (!p.empty()) owners[p].push_back(d.value("metadata", json::object()).value("namespace", "") + "/" + name);
  }
  std::vector<std::string> plugins = {"nvidia"};
  if (s.gpu.efa) plugins.push_back("efa");
  for (const std::string& p : plugins) {
    const auto& o = owners[p];
    std::string list;
    for (const std::string& x : o) list += (list.empty() ? "" : ", ") + x;
    add("plugin " + p, "DaemonSets running it", o.size() == 1,
        o.empty() ? "none" : (o.size() == 1 ? list : list + ": two owners advertise the same devices; remove one"));
  }

  for (const json& n : gpu_nodes) {
    const std::string name = n.value("metadata", json::object()).value("name", "?");
    const std::string subject = "node " + name;
    const std::string down = not_ready(n);
    add(subject, "Ready", down.empty(), down.empty() ? "yes" : down + ": pods cannot run on this node");
    add(subject, "label " + std::string(kGpuLabel), label(n, kGpuLabel) == "true",
        label(n, kGpuLabel) == "true" ? "true"
                                      : "missing: the NVIDIA device plugin's DaemonSet will not run on this node");
    if (!zone.empty())
      add(subject, "zone", label(n, kZoneLabel) == zone,
          label(n, kZoneLabel) + (label(n, kZoneLabel) == zone ? "" : ", want " + zone + " (EFA does not cross zones)"));
    const std::string gpus = allocatable(n, "nvidia.com/gpu");
    add(subject, "allocatable nvidia.com/gpu", gpus == std::to_string(g.gpus),
        gpus + (gpus == std::to_string(g.gpus) ? "" : ", want " + std::to_string(g.gpus)));
    if (s.gpu.efa) {
      const std::string efa = allocatable(n, "vpc.amazonaws.com/efa");
      add(subject, "allocatable vpc.amazonaws.com/efa", efa == std::to_string(g.efa_interfaces),
          efa + (efa == std::to_string(g.efa_interfaces)
                     ? ""
                     : ", want " + std::to_string(g.efa_interfaces) + " (is the EFA device plugin running here?)"));
    }
    for (const std::string& p : plugins) {
      bool found = false, is_ready = false;
      for (const auto& pod : st.pods.value("items", json::array())) {
        if (pod.value("spec", json::object()).value("nodeName", "") != name) continue;
        if (plugin_of(pod.value("spec", json::object()), owner_daemonset(pod)) != p || owner_daemonset(pod).empty())
          continue;
        found = true;
        is_ready = is_ready || ready(pod);
      }
      add(subject, p + " device plugin pod Ready", found && is_ready, !found ? "no pod" : (is_ready ? "yes" : "not Ready"));
    }
  }

  // The workload's pods, once they exist.
  std::set<std::string> nodes_used, zones_used;
  std::map<std::string, std::string> node_zone;
  for (const auto& n : st.nodes.value("items", json::array()))
    node_zone[n.value("metadata", json::object()).value("name", "")] = label(n, kZoneLabel);
  for (const auto& pod : st.pods.value("items", json::array())) {
    if (!is_worker_pod(s, pod)) continue;
    const std::string phase = pod.value("status", json::object()).value("phase", "");
    if (phase == "Succeeded" || phase == "Failed") continue;  // done: it holds no node any more
    const json spec = pod.value("spec", json::object());
    const std::string subject = "pod " + s.namespace_ + "/" + pod.value("metadata", json::object()).value("name", "?");
    for (Check& c : worker_pod_checks(s, pod)) out.push_back(std::move(c));
    const std::string node = spec.value("nodeName", "");
    if (node.empty()) continue;  // not scheduled yet
    add(subject, "one pod per node", nodes_used.insert(node).second, node);
    zones_used.insert(node_zone[node]);
  }
  if (!zones_used.empty()) {
    std::string list;
    for (const std::string& z : zones_used) list += (list.empty() ? "" : ", ") + z;
    add("workload " + s.job_name, "pods in one zone", zones_used.size() == 1, list);
  }
  return out;
}

std::string format_checks(const std::vector<Check>& checks) {
  size_t w1 = 7, w2 = 5;
  for (const Check& c : checks) w1 = std::max(w1, c.subject.size()), w2 = std::max(w2, c.what.size());
  std::string s;
  char buf[1024];
  std::snprintf(buf, sizeof buf, "%-*s  %-*s  %-4s  %s\n", static_cast<int>(w1), "subject", static_cast<int>(w2),
                "check", "ok", "found");
  s += buf;
  for (const Check& c : checks) {
    std::snprintf(buf, sizeof buf, "%-*s  %-*s  %-4s  %s\n", static_cast<int>(w1), c.subject.c_str(),
                  static_cast<int>(w2), c.what.c_str(), c.ok ? "ok" : "FAIL", c.detail.c_str());
    s += buf;
  }
  return s;
}

nlohmann::json checks_json(const std::vector<Check>& checks) {
  json a = json::array();
  for (const Check& c : checks)
    a.push_back({{"subject", c.subject}, {"check", c.what}, {"ok", c.ok}, {"detail", c.detail}});
  return a;
}

}  // namespace st

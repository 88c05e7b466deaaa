#include "deploy/cluster_file.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <toml++/toml.h>

#include "core/error.h"
#include "train/toml_text.h"

namespace st {
namespace {

namespace fs = std::filesystem;

// One key of the file: its dotted name, what it must be, and where it goes.
struct Key {
  std::string name;
  std::string expects;  // "a string", ...
  std::function<void(const toml::node&, const std::string& where)> set;
  std::vector<std::string> choices = {};
};

class Reader {
 public:
  Reader(ClusterSpec& spec, std::string file) : spec_(spec), file_(std::move(file)) {}

  [[noreturn]] void bad(const std::string& key, const toml::node& n, const std::string& what) const {
    fail(file_, ": ", key, " ", what, toml_line_text(n));
  }

  void string(const std::string& name, std::string& out, std::vector<std::string> choices = {}) {
    keys_.push_back({name, choices.empty() ? "a string" : "one of " + join(choices),
                     [this, name, &out, choices](const toml::node& n, const std::string&) {
                       if (!n.is_string()) bad(name, n, "must be a string, got " + toml_type_name(n));
                       out = n.as_string()->get();
                       if (!choices.empty() && std::find(choices.begin(), choices.end(), out) == choices.end())
                         bad(name, n, "must be one of " + join(choices) + ", got '" + out + "'");
                     },
                     choices});
  }
  void integer(const std::string& name, int& out, long lo, long hi) {
    keys_.push_back({name, "an integer", [this, name, &out, lo, hi](const toml::node& n, const std::string&) {
                       if (!n.is_integer()) bad(name, n, "must be an integer, got " + toml_type_name(n));
                       const long long v = n.as_integer()->get();
                       if (v < lo || v > hi)
                         bad(name, n, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                                          std::to_string(v));
                       out = static_cast<int>(v);
                     }});
  }
  void boolean(const std::string& name, bool& out) {
    keys_.push_back({name, "true or false", [this, name, &out](const toml::node& n, const std::string&) {
                       if (!n.is_boolean()) bad(name, n, "must be true or false, got " + toml_type_name(n));
                       out = n.as_boolean()->get();
                     }});
  }
  void strings(const std::string& name, std::vector<std::string>& out) {
    keys_.push_back({name, "an array of strings", [this, name, &out](const toml::node& n, const std::string&) {
                       if (!n.is_array()) bad(name, n, "must be an array of strings, got " + toml_type_name(n));
                       out.clear();
                       for (const toml::node& e : *n.as_array()) {
                         if (!e.is_string()) bad(name, e, "must hold strings only, got " + toml_type_name(e));
                         out.push_back(e.as_string()->get());
                       }
                     }});
  }
  // A table of string values (labels, env, subnets): its keys are the user's.
  void string_map(const std::string& name, std::map<std::string, std::string>& out) {
    keys_.push_back({name, "a table of strings", [this, name, &out](const toml::node& n, const std::string&) {
                       if (!n.is_table()) bad(name, n, "must be a table of strings, got " + toml_type_name(n));
                       for (const auto& [k, v] : *n.as_table()) {
                         if (!v.is_string())
                           bad(name + "." + std::string(k.str()), v, "must be a string, got " + toml_type_name(v));
                         out[std::string(k.str())] = v.as_string()->get();
                       }
                     }});
  }
  // [train.set]: run-config keys ("train.steps" = 100), checked later by the run config.
  void overrides(const std::string& name, ConfigOverrides& out) {
    keys_.push_back({name, "a table of run configuration keys", [this, name, &out](const toml::node& n,
                                                                                   const std::string&) {
                       if (!n.is_table()) bad(name, n, "must be a table of run configuration keys, got " + toml_type_name(n));
                       for (const auto& [k, v] : *n.as_table()) {
                         const std::string key(k.str());
                         std::string text;
                         if (v.is_string()) {
                           text = v.as_string()->get();
                         } else if (v.is_integer()) {
                           text = std::to_string(v.as_integer()->get());
                         } else if (v.is_floating_point()) {
                           std::ostringstream os;
                           os.precision(17);
                           os << v.as_floating_point()->get();
                           text = os.str();
                         } else if (v.is_boolean()) {
                           text = v.as_boolean()->get() ? "true" : "false";
                         } else if (v.is_array()) {
                           for (const toml::node& e : *v.as_array()) {
                             if (!e.is_string()) bad(name + ".\"" + key + "\"", e, "must hold strings only");
                             text += (text.empty() ? "" : ",") + std::string(e.as_string()->get());
                           }
                         } else {
                           bad(name + ".\"" + key + "\"", v, "must be a value, got " + toml_type_name(v) +
                                                               " (write run-config keys quoted: \"train.steps\" = 100)");
                         }
                         out.emplace_back(key, text);
                       }
                     }});
  }

  void read(const toml::table& root) { walk(root, ""); }

 private:
  static std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "" : ", ") + (x.empty() ? std::string("\"\"") : x);
    return s;
  }
  const Key* find(const std::string& name) const {
    for (const Key& k : keys_)
      if (k.name == name) return &k;
    return nullptr;
  }
  bool is_table_prefix(const std::string& name) const {
    for (const Key& k : keys_)
      if (k.name.rfind(name + ".", 0) == 0) return true;
    return false;
  }
  std::string known_under(const std::string& prefix) const {
    std::string s;
    for (const Key& k : keys_) {
      if (!prefix.empty() && k.name.rfind(prefix + ".", 0) != 0) continue;
      const std::string rest = prefix.empty() ? k.name : k.name.substr(prefix.size() + 1);
      const std::string first = rest.substr(0, rest.find('.'));
      if (s.find(first) == std::string::npos) s += (s.empty() ? "" : ", ") + first;
    }
    return s;
  }
  void walk(const toml::table& t, const std::string& prefix) {
    for (const auto& [k, v] : t) {
      const std::string name = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
      if (const Key* key = find(name)) {
        key->set(v, file_);
        continue;
      }
      if (is_table_prefix(name)) {
        if (!v.is_table()) bad(name, v, "must be the table [" + name + "], got " + toml_type_name(v));
        walk(*v.as_table(), name);
        continue;
      }
      const std::string where = prefix.empty() ? "at the top level" : "in [" + prefix + "]";
      fail(file_, ": unknown key '", name, "'", toml_line_text(v), " (known ", where, ": ", known_under(prefix), ")");
    }
  }

  ClusterSpec& spec_;
  std::string file_;
  std::vector<Key> keys_;
};

void node_group_keys(Reader& r, const std::string& sec, NodeGroupSpec& g) {
  r.string(sec + ".name", g.name);
  r.string(sec + ".instance_type", g.instance_type);
  r.integer(sec + ".count", g.count, 1, 1000);
  r.strings(sec + ".zones", g.zones);
  r.boolean(sec + ".efa", g.efa);
  r.string(sec + ".capacity", g.capacity, {"on-demand", "reservation"});
  r.string(sec + ".capacity_reservation_id", g.capacity_reservation_id);
  r.integer(sec + ".volume_gib", g.volume_gib, 20, 16384);
  r.string_map(sec + ".labels", g.labels);
  if (sec == "nodes.gpu") r.string(sec + ".placement_group", g.placement_group);
}

std::string instance_list() {
  std::string s;
  for (const InstanceFacts& f : instance_table()) s += (s.empty() ? "" : ", ") + f.type;
  return s;
}

}  // namespace

std::string ClusterSpec::image() const {
  if (!image_digest.empty()) return image_repository + "@" + image_digest;
  return image_repository + ":" + (image_tag.empty() ? std::string("latest") : image_tag);
}

void derive_pod_resources(ClusterSpec& spec) {
  const InstanceFacts* f = spec.gpu.facts;
  if (!f) return;
  if (spec.pod_gpus == 0) spec.pod_gpus = f->gpus;
  if (spec.pod_efa < 0) spec.pod_efa = spec.gpu.efa ? f->efa_interfaces : 0;
  if (spec.pod_cpu == 0) spec.pod_cpu = f->vcpus - std::max(4, f->vcpus / 6);
  if (spec.pod_memory_gib == 0) {
    const int mem = static_cast<int>(std::floor(f->memory_gib));
    spec.pod_memory_gib = mem - std::max(8, mem / 6);
  }
  // NCCL's shared-memory transport and the data loader live in /dev/shm: a quarter of
  // the pod's memory, at most 64 GiB (the 64 MiB container default breaks NCCL).
  if (spec.shm_gib == 0) spec.shm_gib = std::clamp(spec.pod_memory_gib / 4, 1, 64);
}

static ClusterSpec load_cluster_file_unclassified(const std::string& path);

ClusterSpec load_cluster_file(const std::string& path) {
  // Everything wrong with the cluster file or the run config it names is a
  // configuration error (exit 2).
  return classify_errors(ErrorKind::Usage, [&] { return load_cluster_file_unclassified(path); });
}

static ClusterSpec load_cluster_file_unclassified(const std::string& path) {
  ClusterSpec spec;
  spec.path = path;
  spec.dir = fs::path(path).parent_path().string();
  spec.system.name = "system";
  spec.system.instance_type = "m7i.xlarge";
  spec.gpu.name = "gpu";

  toml::table root = parse_toml_file(path, "the cluster file");

  Reader r(spec, path);
  r.string("cluster.name", spec.name);
  r.string("cluster.region", spec.region);
  r.string("cluster.kubernetes_version", spec.kubernetes_version);
  r.strings("cluster.zones", spec.zones);
  r.boolean("cluster.vpc.create", spec.create_vpc);
  r.string("cluster.vpc.id", spec.vpc_id);
  r.string_map("cluster.vpc.private_subnets", spec.private_subnets);
  r.string("cluster.vpc.cidr", spec.vpc_cidr);
  r.string("cluster.vpc.nat", spec.nat, {"Single", "HighlyAvailable"});
  node_group_keys(r, "nodes.system", spec.system);
  node_group_keys(r, "nodes.gpu", spec.gpu);
  r.string("image.repository", spec.image_repository);
  r.string("image.digest", spec.image_digest);
  r.string("image.tag", spec.image_tag);
  r.string("image.base", spec.base_image);
  r.boolean("image.allow_unpinned", spec.allow_unpinned);
  r.string("workload.engine", spec.engine, {"job", "kuberay", "pytorchjob"});
  r.string("workload.namespace", spec.namespace_);
  r.string("workload.name", spec.job_name);
  r.integer("workload.master_port", spec.master_port, 1, 65535);
  r.string("workload.ray_version", spec.ray_version);
  r.integer("workload.backoff_limit", spec.backoff_limit, 0, 100);
  r.string("workload.checkpoint_claim", spec.checkpoint_claim);
  r.integer("workload.resources.gpus", spec.pod_gpus, 1, 64);
  r.integer("workload.resources.efa", spec.pod_efa, 0, 64);
  r.integer("workload.resources.cpu", spec.pod_cpu, 1, 1024);
  r.integer("workload.resources.memory_gib", spec.pod_memory_gib, 1, 65536);
  r.integer("workload.resources.shm_gib", spec.shm_gib, 1, 4096);
  r.string("helm.charts_dir", spec.charts_dir);
  r.string("train.config", spec.train_config);
  r.overrides("train.set", spec.train_set);
  r.string("train.expect_transport", spec.expect_transport, fabric_expect_transports());
  r.string("fabric.transport", spec.transport, fabric_transports());
  r.string("fabric.socket_ifname", spec.socket_ifname);
  r.string_map("fabric.env", spec.env);
  r.read(root);

  // What must be there, and names Kubernetes and AWS accept.
  auto need = [&](const std::string& v, const char* key) {
    if (v.empty()) fail(path, ": ", key, " must be set");
  };
  need(spec.name, "cluster.name");
  need(spec.region, "cluster.region");
  need(spec.gpu.instance_type, "nodes.gpu.instance_type");
  need(spec.image_repository, "image.repository");
  auto dns_label = [&](const std::string& v, const char* key, size_t max) {
    const bool ok = !v.empty() && v.size() <= max && std::isalnum(static_cast<unsigned char>(v.front())) &&
                    std::isalnum(static_cast<unsigned char>(v.back())) &&
                    std::all_of(v.begin(), v.end(), [](char c) {
                      return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
                    });
    if (!ok)
      fail(path, ": ", key, " = '", v, "' must be lower-case letters, digits and '-', starting and ending with a ",
           "letter or digit, at most ", max, " characters (a Kubernetes name)");
  };
  dns_label(spec.name, "cluster.name", 100);
  dns_label(spec.namespace_, "workload.namespace", 63);
  // The Job's pods are "<name>-<index>" and their hostnames must stay DNS labels.
  dns_label(spec.job_name, "workload.name", 50);
  for (NodeGroupSpec* g : {&spec.system, &spec.gpu}) {
    const std::string sec = g == &spec.system ? "nodes.system" : "nodes.gpu";
    g->facts = find_instance(g->instance_type);
    if (!g->facts)
      fail(path, ": ", sec, ".instance_type = '", g->instance_type, "' is not in the built-in instance table (",
           instance_list(), "); docs/instance_facts.md says how to add one");
    dns_label(g->name, (sec + ".name").c_str(), 63);
  }
  if (spec.gpu.placement_group.empty()) spec.gpu.placement_group = spec.name + "-gpu";
  if (spec.gpu.facts->gpus == 0)
    fail(path, ": nodes.gpu.instance_type = '", spec.gpu.instance_type, "' has no GPUs");

  // The run configuration the ranks will train with, checked now: its errors name
  // the cluster file's keys.
  std::string run_toml;
  if (!spec.train_config.empty()) {
    const fs::path p = fs::path(spec.train_config).is_absolute() ? fs::path(spec.train_config)
                                                                   : fs::path(spec.dir) / spec.train_config;
    run_toml = p.lexically_normal().string();
    if (!fs::exists(run_toml)) fail(path, ": train.config = '", spec.train_config, "': ", run_toml, " does not exist");
  }
  try {
    spec.run = load_run_config(run_toml, spec.train_set);
  } catch (const Error& e) {
    fail(path, ": [train] (train.config and train.set): ", e.what());
  }
  // The pods train on their GPUs, unless [train.set] says otherwise (a CPU test cluster).
  bool device_set = false;
  for (const auto& [k, v] : spec.train_set) device_set |= k == "train.device" || k == "--train.device";
  if (!device_set) spec.run.train.device = "cuda";
  spec.run.fabric.transport = spec.transport;
  spec.run.fabric.socket_ifname = spec.socket_ifname;
  spec.run.fabric.expect_transport = spec.expect_transport;
  if (!spec.charts_dir.empty() && fs::path(spec.charts_dir).is_relative())
    spec.charts_dir = (fs::path(spec.dir) / spec.charts_dir).lexically_normal().string();
  // Checkpoints on a claim every pod mounts: a pod the Job starts again resumes there.
  if (!spec.checkpoint_claim.empty()) {
    spec.run.run.checkpoint_dir = "/checkpoints/" + spec.job_name;
    spec.run.run.resume = "auto";
  }
  derive_pod_resources(spec);
  return spec;
}

}  // namespace st

// libFuzzer target for the deploy cluster file (st::load_cluster_file): strict TOML
// whose [train] section names a run config and run-config overrides. The input is
// written as <scratch>/c/cluster.toml beside a valid run config, run.toml (so that
// train.config = "run.toml" loads). An st::Error is the expected rejection; a crash,
// a sanitizer report, any other exception, or an accepted file that breaks what
// acceptance promises (a GPU instance from the table, resources derived, names that
// are DNS labels) is a bug.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <toml++/toml.h>

#include "core/error.h"
#include "deploy/cluster_file.h"
#include "fuzz_util.h"
#include "config/run_config.h"

namespace {

const std::string& cluster_dir() {
  static const std::string dir = [] {
    const std::string d = fuzz::scratch_dir() + "/c";
    std::filesystem::create_directories(d);
    fuzz::write_file(d + "/run.toml", st::run_config_toml(st::load_run_config("", {})));
    return d;
  }();
  return dir;
}

// Files the loader would open: train.config (relative to the cluster file) and
// model.config / model.init_from in [train.set] (relative to the working directory).
bool paths_confined(std::string_view text) {
  try {
    const toml::table t = toml::parse(text);
    if (const auto* s = t.at_path("train.config").as_string(); s && !fuzz::confined_path(s->get())) return false;
    if (const auto* set = t.at_path("train.set").as_table())
      for (const auto& [k, v] : *set)
        if (k.str().find("model.config") != std::string_view::npos ||
            k.str().find("model.init_from") != std::string_view::npos)
          if (const auto* s = v.as_string(); s && !fuzz::confined_path(s->get())) return false;
  } catch (const toml::parse_error&) {
  }
  return true;
}

bool is_dns_label(const std::string& v) {
  if (v.empty() || v.front() == '-' || v.back() == '-') return false;
  for (char c : v)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (!paths_confined(text)) return 0;
  const std::string path = cluster_dir() + "/cluster.toml";
  fuzz::write_file(path, text);
  st::ClusterSpec spec;
  try {
    spec = st::load_cluster_file(path);
  } catch (const st::Error& e) {
    fuzz::rejected(e);
    return 0;
  }
  if (!spec.gpu.facts || !spec.system.facts || spec.gpu.facts->gpus <= 0) __builtin_trap();
  if (spec.world() <= 0 || spec.pod_gpus <= 0 || spec.pod_cpu <= 0 || spec.pod_memory_gib <= 0 || spec.shm_gib <= 0)
    __builtin_trap();
  if (!is_dns_label(spec.name) || !is_dns_label(spec.namespace_) || !is_dns_label(spec.job_name)) __builtin_trap();
  if (spec.image().empty()) __builtin_trap();
  return 0;
}

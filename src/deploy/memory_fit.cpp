#include "deploy/memory_fit.h"

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "config/options.h"
#include "core/log.h"

namespace st {
namespace {

constexpr double kGiB = double(size_t(1) << 30);

std::string toml_string(const std::string& s) { return "\"" + s + "\""; }

// Where the run config's values come from, as the user wrote them.
std::string config_source(const ClusterSpec& s) {
  std::string where;
  if (!s.train_config.empty())
    where = (std::filesystem::path(s.dir) / s.train_config).lexically_normal().string() + " (train.config)";
  if (!s.train_set.empty()) where += std::string(where.empty() ? "" : " and ") + "[train.set] of " + s.path;
  return where.empty() ? "the run-config defaults" : where;
}

std::string settings(const RunConfig& c) {
  return "model " + c.model.source + ", train.micro_batch " + std::to_string(c.train.micro_batch) +
         " x train.seq_len " + std::to_string(c.train.seq_len) + " (train.grad_accum " +
         std::to_string(c.train.grad_accum) + "), train.recompute " + c.train.recompute + ", optim.state_dtype " +
         c.optim.state_dtype + ", optim.master_dtype " + c.optim.master_dtype + ", train.offload " + c.train.offload;
}

std::string gib(size_t bytes) { return human_bytes(double(bytes)); }

}  // namespace

MemoryFit check_memory_fit(const ClusterSpec& s, const MemoryPlanner& planner) {
  MemoryFit f;
  const InstanceFacts& g = *s.gpu.facts;
  f.gpu_model = g.gpu_model;
  f.world = s.world();
  f.ranks_per_node = s.pod_gpus;
  f.shard_world = s.run.dist.shard_group_size > 0 ? s.run.dist.shard_group_size : f.world;
  f.usable_gib = g.gpu_usable_gib;
  f.usable_derived = s.gpu.gpu_usable_derived;
  if (!planner.plan || !planner.largest_micro_batch) {
    f.skipped = "no memory planner was given";
    return f;
  }
  if (s.run.train.device != "cuda") {
    f.skipped = "train.device = " + s.run.train.device + ": the ranks do not train on the GPUs";
    return f;
  }
  if (f.world < 1 || f.shard_world > f.world || f.world % f.shard_world != 0) {
    f.skipped = "dist.shard_group_size does not divide the world";
    return f;
  }
  if (f.usable_gib <= 0) {
    f.skipped = "the GPU's memory is not known (nodes.gpu.facts.gpu_memory_gib or gpu_usable_gib)";
    return f;
  }
  f.gpu_limit = size_t(f.usable_gib * kGiB);
  f.host_limit = size_t(double(s.pod_memory_gib) * kGiB);

  auto measure = [&](const RunConfig& c, RankMemory* rank, size_t* node, bool* gpu_ok, bool* host_ok) {
    *rank = planner.plan(c, f.world);
    *node = rank->host * size_t(f.ranks_per_node);
    *gpu_ok = rank->device <= f.gpu_limit;
    *host_ok = *node <= f.host_limit;
  };
  const RunConfig& base = s.run;
  measure(base, &f.rank, &f.host_node, &f.fits_gpu, &f.fits_host);
  for (const std::string& rc : recompute_choices()) {
    RunConfig c = base;
    c.train.recompute = rc;
    f.per_recompute.emplace_back(rc, planner.largest_micro_batch(c, f.world, f.gpu_limit));
  }
  if (f.fits()) return f;

  // The changes, in order. Each keeps the configured micro-batch where it fits with
  // it, else takes the largest that fits and divides the sequences of a step, with
  // train.grad_accum making up the rest.
  const int mb = base.train.micro_batch;
  const int seqs = mb * base.train.grad_accum;
  auto attempt = [&](const std::string& what, RunConfig c, std::vector<std::pair<std::string, std::string>> set) {
    FitChange ch;
    ch.what = what;
    const int m = planner.largest_micro_batch(c, f.world, f.gpu_limit);
    if (m >= 1 && m < mb) {
      int d = m;
      while (seqs % d != 0) --d;
      c.train.micro_batch = d;
      c.train.grad_accum = seqs / d;
      set.emplace_back("train.micro_batch", std::to_string(d));
      set.emplace_back("train.grad_accum", std::to_string(seqs / d));
    }
    ch.set = std::move(set);
    measure(c, &ch.rank, &ch.host_node, &ch.fits_gpu, &ch.fits_host);
    f.tried.push_back(std::move(ch));
    if (f.first_fit < 0 && f.tried.back().fits()) f.first_fit = int(f.tried.size()) - 1;
  };
  attempt("a smaller train.micro_batch", base, {});
  for (const std::string& rc : recompute_choices()) {
    if (rc == base.train.recompute) continue;
    RunConfig c = base;
    c.train.recompute = rc;
    attempt("train.recompute = " + rc, c, {{"train.recompute", toml_string(rc)}});
  }
  // The state's changes: each with the configured recompute, then (where that does
  // not fit) with the recompute that leaves the least on the GPU; last, all of them.
  std::string leanest = base.train.recompute;
  {
    size_t least = SIZE_MAX;
    for (const std::string& rc : recompute_choices()) {
      RunConfig c = base;
      c.train.recompute = rc;
      c.train.micro_batch = 1;
      const size_t d = planner.plan(c, f.world).device;
      if (d < least) least = d, leanest = rc;
    }
  }
  auto state_change = [&](const std::string& what, RunConfig c, std::vector<std::pair<std::string, std::string>> set) {
    attempt(what, c, set);
    if (f.tried.back().fits() || leanest == base.train.recompute) return;
    c.train.recompute = leanest;
    set.emplace_back("train.recompute", toml_string(leanest));
    attempt(what + ", train.recompute = " + leanest, c, set);
  };
  const bool bf16 = base.optim.state_dtype == "bf16" && base.optim.master_dtype == "bf16";
  if (!bf16) {
    RunConfig c = base;
    c.optim.state_dtype = c.optim.master_dtype = "bf16";
    state_change("bf16 optimizer state and master weights", c,
                 {{"optim.state_dtype", toml_string("bf16")}, {"optim.master_dtype", toml_string("bf16")}});
  }
  for (const std::string& off : {std::string("optimizer"), std::string("optimizer+master")}) {
    if (base.train.offload == off || (off == "optimizer" && base.train.offload == "optimizer+master")) continue;
    RunConfig c = base;
    c.train.offload = off;
    state_change("train.offload = " + off, c, {{"train.offload", toml_string(off)}});
  }
  if (!bf16 || base.train.offload != "optimizer+master" || base.train.recompute != leanest) {
    RunConfig c = base;
    c.optim.state_dtype = c.optim.master_dtype = "bf16";
    c.train.offload = "optimizer+master";
    c.train.recompute = leanest;
    attempt("all of them: bf16 state and master in host RAM, train.recompute = " + leanest, c,
            {{"optim.state_dtype", toml_string("bf16")}, {"optim.master_dtype", toml_string("bf16")},
             {"train.offload", toml_string("optimizer+master")}, {"train.recompute", toml_string(leanest)}});
  }
  return f;
}

std::vector<Finding> memory_findings(const ClusterSpec& s, const MemoryFit& f) {
  if (!f.skipped.empty())
    return {{false, "train.config", "the run's memory is not checked against the GPUs: " + f.skipped}};
  std::vector<Finding> out;
  if (f.usable_derived)
    out.push_back({false, "nodes.gpu.facts.gpu_usable_gib",
                   "not given: the run is checked against 15/16 of gpu_memory_gib (" +
                       gib(f.gpu_limit) + "); give what nvidia-smi shows as memory.total"});
  if (f.fits()) return out;
  const std::string key = s.train_config.empty() ? "train.set" : "train.config";
  std::string m = "the run does not fit: ";
  if (!f.fits_gpu)
    m += "one rank needs " + gib(f.rank.device) + " of GPU memory, one " + f.gpu_model + " of a " +
         s.gpu.instance_type + " gives " + gib(f.gpu_limit);
  if (!f.fits_host)
    m += std::string(f.fits_gpu ? "" : ", and ") + "the " + std::to_string(f.ranks_per_node) +
         " ranks of a node need " + gib(f.host_node) + " of host RAM, the worker pod has " + gib(f.host_limit) +
         " (workload.resources.memory_gib)";
  m += " (the trainer's memory plan, world " + std::to_string(f.world) + "; " + settings(s.run) + "; from " +
       config_source(s) + "). ";
  if (f.first_fit < 0) {
    m += "Nothing tried fits (a smaller train.micro_batch, every train.recompute, bf16 optimizer state and master "
         "weights, train.offload = optimizer or optimizer+master, each alone and with the leanest recompute, and all "
         "of them together): ";
    bool gpu_fits_somehow = f.fits_gpu;
    for (const FitChange& c : f.tried) gpu_fits_somehow |= c.fits_gpu;
    m += gpu_fits_somehow ? "host RAM is what runs out: give the pod more memory (workload.resources.memory_gib, up to the node's allocatable) or use "
                      "an instance type with more; `deploy plan` prints what each change would need"
                    : "use more or larger GPUs (nodes.gpu.count, nodes.gpu.instance_type) or a smaller model; "
                      "`deploy plan` prints what each change would need";
    out.push_back({true, key, m});
    return out;
  }
  const FitChange& c = f.tried[size_t(f.first_fit)];
  std::string toml, flags;
  for (const auto& [k, v] : c.set) {
    toml += std::string(toml.empty() ? "" : ", ") + "\"" + k + "\" = " + v;
    std::string bare = v;
    if (bare.size() >= 2 && bare.front() == '"') bare = bare.substr(1, bare.size() - 2);
    flags += std::string(flags.empty() ? "" : " ") + "--" + k + "=" + bare;
  }
  m += "The first change that fits: " + c.what + " (one rank " + gib(c.rank.device) + " of " + gib(f.gpu_limit) +
       " on the GPU, " + gib(c.host_node) + " of host RAM per node): add to [train.set] " + toml + " (or " + flags +
       ")";
  out.push_back({true, key, m});
  return out;
}

std::string memory_fit_text(const ClusterSpec& s, const MemoryFit& f) {
  std::string out = "memory: the trainer's plan of one rank (shardtrain train --run.dry_run=true)\n";
  if (!f.skipped.empty()) return out + "  not checked: " + f.skipped + "\n";
  char buf[512];
  const std::string sharding = f.shard_world < f.world
                                   ? "HSDP: shards over " + std::to_string(f.shard_world) + " ranks"
                                   : "FSDP over all ranks";
  out += "  " + settings(s.run) + "; world " + std::to_string(f.world) + " (" + sharding + ")\n";
  std::snprintf(buf, sizeof buf, "  GPU per rank: %s of the %s one %s of a %s gives = %.1f%%: %s\n",
                gib(f.rank.device).c_str(), gib(f.gpu_limit).c_str(), f.gpu_model.c_str(), s.gpu.instance_type.c_str(),
                100.0 * double(f.rank.device) / double(f.gpu_limit), f.fits_gpu ? "fits" : "DOES NOT FIT");
  out += buf;
  std::snprintf(buf, sizeof buf, "  host RAM per node: %d ranks x %s = %s of %s (the worker pod's memory): %s\n",
                f.ranks_per_node, gib(f.rank.host).c_str(), gib(f.host_node).c_str(), gib(f.host_limit).c_str(),
                f.fits_host ? "fits" : "DOES NOT FIT");
  out += buf;
  out += "  largest micro-batch that fits at seq " + std::to_string(s.run.train.seq_len) + ", per train.recompute:";
  for (const auto& [rc, m] : f.per_recompute) out += " " + rc + " " + std::to_string(m);
  out += "\n";
  if (!f.tried.empty()) out += "  changes tried, in order:\n";
  for (size_t i = 0; i < f.tried.size(); ++i) {
    const FitChange& c = f.tried[i];
    std::string set;
    for (const auto& [k, v] : c.set) set += std::string(set.empty() ? "" : ", ") + k + " = " + v;
    out += "    " + c.what + ": " + (c.fits() ? "fits" : (c.fits_gpu ? "host RAM does not fit" : "does not fit")) +
           (int(i) == f.first_fit ? "  <- the first that fits" : "") + "\n";
    out += "      GPU " + gib(c.rank.device) + ", host per node " + gib(c.host_node) + (set.empty() ? "" : "; " + set) +
           "\n";
  }
  return out;
}

nlohmann::json memory_fit_json(const MemoryFit& f) {
  if (!f.skipped.empty()) return {{"checked", false}, {"skipped", f.skipped}};
  nlohmann::json j = {{"checked", true},
                      {"fits", f.fits()},
                      {"gpu_model", f.gpu_model},
                      {"gpu_usable_bytes", f.gpu_limit},
                      {"world", f.world},
                      {"rank_gpu_bytes", f.rank.device},
                      {"rank_host_bytes", f.rank.host},
                      {"ranks_per_node", f.ranks_per_node},
                      {"node_host_bytes", f.host_node},
                      {"node_host_limit_bytes", f.host_limit}};
  j["largest_micro_batch"] = nlohmann::json::object();
  for (const auto& [rc, m] : f.per_recompute) j["largest_micro_batch"][rc] = m;
  j["tried"] = nlohmann::json::array();
  for (const FitChange& c : f.tried) {
    nlohmann::json set = nlohmann::json::object();
    for (const auto& [k, v] : c.set) set[k] = v;
    j["tried"].push_back({{"what", c.what}, {"set", set}, {"rank_gpu_bytes", c.rank.device},
                          {"node_host_bytes", c.host_node}, {"fits", c.fits()}});
  }
  if (f.first_fit >= 0) j["first_fit"] = f.tried[size_t(f.first_fit)].what;
  return j;
}

}  // namespace st

#include "train/memory_plan.h"

#include <algorithm>
#include <cstdio>

#include "core/log.h"
#include "model/layout.h"
#include "model/qwen2.h"
#include "train/memory_check.h"

namespace st {

MemoryPlan plan_rank_memory(const RunConfig& cfg, Device device, int shard_world, bool in_place,
                            size_t workspace_bytes) {
  const ParamLayout layout(cfg.model);
  const ShardPlan plan(layout, std::max(shard_world, 1));
  const bool cpu = device == Device::CPU;
  const DType compute = cpu ? DType::F32 : DType::BF16;
  const ShardElementBytes eb = shard_element_bytes(cfg, compute);
  MemoryPlan p;
  size_t largest = 0;
  for (int u = 0; u < plan.num_units(); ++u) {
    const size_t n = plan.shard_numel(u);
    p.master += n * eb.master;
    p.low += n * eb.low;
    p.grad += n * eb.grad;
    p.optimizer += n * eb.optimizer;
    p.offloaded += n * eb.host;
    largest = std::max(largest, n);
  }
  p.staging = largest * eb.staging;
  if (!in_place)
    p.gathered = plan.gathered_peak(dtype_size(compute), cfg.dist.reshard_after_forward,
                                    cfg.dist.reduce_dtype == "bf16" ? 2 : 4);
  p.activations = Qwen2Model::activation_bytes_for(cfg.model, compute, cfg.train.micro_batch, cfg.train.seq_len,
                                                   cpu ? 0 : 4096, parse_recompute(cfg.train.recompute),
                                                   Fp8Options::from(cfg.train));
  p.workspace = workspace_bytes;
  if (!cpu) p.attention = attention_workspace_bytes(cfg.model, cfg.train.micro_batch, cfg.train.seq_len);
  p.batches = size_t(cfg.train.grad_accum) * cfg.train.micro_batch * cfg.train.seq_len * 8;
  if (!cfg.model_options.init_from.empty()) p.loaded = size_t(cfg.model.num_params()) * 4;
  if (cfg.run.checkpoint_every > 0) p.checkpoint = plan.total_shard_numel() * 12;
  return p;
}

int largest_fitting_micro_batch(RunConfig cfg, Device device, int shard_world, bool in_place, size_t workspace_bytes,
                                size_t limit, int max_micro_batch) {
  const bool fp8 = cfg.train.matmul_dtype == "fp8";
  auto fits = [&](int mb) {
    cfg.train.micro_batch = mb;
    const MemoryPlan p = plan_rank_memory(cfg, device, shard_world, in_place, workspace_bytes);
    return (device == Device::CPU ? p.device_total() + p.host_total() : p.device_total()) <= limit;
  };
  auto valid = [&](int mb) { return !fp8 || (int64_t(mb) * cfg.train.seq_len) % 16 == 0; };
  // Memory grows with the micro-batch: bisect for the last one that fits, then step
  // down to one FP8 can run.
  int lo = 0, hi = max_micro_batch;
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  while (lo > 0 && !valid(lo)) --lo;
  return lo;
}

MemoryRowLabels memory_row_labels(const RunConfig& cfg, Device device) {
  const std::string compute = device == Device::CPU ? "fp32" : "bf16";
  const std::string& md = cfg.optim.master_dtype;
  const std::string& sd = cfg.optim.state_dtype;
  const bool offload_master = cfg.train.offload == "optimizer+master";
  MemoryRowLabels l;
  l.weights = offload_master ? "weights (" + compute + " copy of the offloaded " + md + " master)"
              : md == compute ? "weights (" + md + " master shard)"
                              : "weights (" + md + " master shard + its " + compute + " copy)";
  l.gradients = "gradients (fp32 shard)";
  l.optimizer = cfg.train.offload == "none" ? "optimizer state (" + sd + " AdamW m and v)"
                                            : "optimizer state: offloaded to host memory";
  l.staging = "offload staging (two slots of the largest unit's state)";
  l.offloaded = "offloaded state (" + (offload_master ? md + " master, " : std::string()) + sd +
                " m and v; page-locked)";
  return l;
}

std::string format_memory_plan(const RunConfig& cfg, Device device, int world, int shard_world, bool in_place,
                               size_t workspace_bytes, size_t limit, const std::string& limit_source) {
  const bool cpu = device == Device::CPU;
  const MemoryPlan p = plan_rank_memory(cfg, device, shard_world, in_place, workspace_bytes);
  std::string out;
  char buf[512];
  auto line = [&](const std::string& s) { out += s + "\n"; };
  auto row = [&](const std::string& what, size_t bytes) {
    std::snprintf(buf, sizeof buf, "  %-60s %12s", what.c_str(), human_bytes(double(bytes)).c_str());
    line(buf);
  };
  std::string sharding = "world " + std::to_string(world);
  if (shard_world < world)
    sharding += " (HSDP: shards over " + std::to_string(shard_world) + " ranks, " + std::to_string(world / shard_world) +
                " replicas)";
  else if (world > 1)
    sharding += " (FSDP over all ranks)";
  line("dry run: nothing is allocated or trained");
  line("plan for model " + cfg.model.source + " (" + human_count(double(cfg.model.num_params())) + " params) on " +
       (cpu ? std::string("the CPU") : std::string("a GPU")) + ", " + sharding + "; micro-batch " +
       std::to_string(cfg.train.micro_batch) + " x seq " + std::to_string(cfg.train.seq_len) + ", recompute " +
       cfg.train.recompute + ", matmuls " + cfg.train.matmul_dtype + ", optimizer state " + cfg.optim.state_dtype +
       ", master weights " + cfg.optim.master_dtype + ", offload " + cfg.train.offload);
  line(std::string("memory per rank (") + (cpu ? "host RAM" : "GPU") + "):");
  const MemoryRowLabels labels = memory_row_labels(cfg, device);
  row(labels.weights, p.master + p.low);
  row(labels.gradients, p.grad);
  row(labels.optimizer, p.optimizer);
  if (p.staging) row(labels.staging, p.staging);
  if (!in_place) {
    row("units gathered at the peak of a step", p.gathered.total());
    line("    (" + p.gathered.where + ")");
  } else {
    row("gathered: nothing (one rank reads its shards in place)", 0);
  }
  std::snprintf(buf, sizeof buf, "activations and scratch (%.2f MiB per token)",
                double(p.activations) / (double(cfg.train.micro_batch) * cfg.train.seq_len) / (1 << 20));
  row(buf, p.activations);
  row(cpu ? "workspace" : "workspace (cuBLASLt)", p.workspace);
  if (p.attention) row("attention workspace (cuDNN, sized at its first call)", p.attention);
  row(cpu ? "total (with the host part below)" : "total on the GPU", cpu ? p.device_total() + p.host_total()
                                                                            : p.device_total());
  line("host RAM per rank:");
  row("token ids (train.grad_accum micro-batches)", p.batches);
  if (p.loaded) row("model.init_from, loaded in fp32", p.loaded);
  if (p.checkpoint) row("checkpoint host copy", p.checkpoint);
  if (p.offloaded) row(labels.offloaded, p.offloaded);
  if (limit == 0) {
    line("no memory size to check against: give --run.gpu_memory_gib (e.g. 22.5 for an L4, 80 for an H100)");
    return out;
  }
  const size_t need = cpu ? p.device_total() + p.host_total() : p.device_total();
  std::snprintf(buf, sizeof buf, "%s: %s of %s (%s) = %.1f%%", need <= limit ? "fits" : "DOES NOT FIT",
                human_bytes(double(need)).c_str(), human_bytes(double(limit)).c_str(), limit_source.c_str(),
                100.0 * double(need) / double(limit));
  line(buf);
  std::string per = "largest micro-batch that fits at seq " + std::to_string(cfg.train.seq_len) + ", per recompute:";
  for (const std::string& rc : recompute_choices()) {
    RunConfig c = cfg;
    c.train.recompute = rc;
    per += " " + rc + " " + std::to_string(largest_fitting_micro_batch(c, device, shard_world, in_place,
                                                                      workspace_bytes, limit));
  }
  line(per);
  return out;
}

}  // namespace st

#include "train/memory_check.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "model/qwen2.h"

namespace st {
namespace {

using U = unsigned __int128;

uint64_t saturate(U v) {
  return v > std::numeric_limits<uint64_t>::max() ? std::numeric_limits<uint64_t>::max() : static_cast<uint64_t>(v);
}

std::string b(uint64_t v) { return human_bytes(static_cast<double>(v)); }

}  // namespace

uint64_t attention_workspace_bytes(const ModelConfig& m, int64_t B, int64_t T) {
  const U heads = static_cast<U>(m.num_heads), hd = heads > 0 ? static_cast<U>(m.head_dim()) : 0;
  const U b = static_cast<U>(B), t = static_cast<U>(T);
  // dP (bf16, B x H x T x T), dQ's fp32 accumulator (B x T x H x hd), the row sums.
  return saturate(2 * b * heads * t * t + 4 * b * t * heads * hd + 4 * b * heads * t);
}

uint64_t MemoryEstimate::device() const {
  return saturate(static_cast<U>(parameters) + gathered + activations + workspace);
}
uint64_t MemoryEstimate::host() const {
  return saturate(static_cast<U>(batches) + loaded + checkpoint + offloaded);
}

ShardElementBytes shard_element_bytes(const RunConfig& cfg, DType compute) {
  const bool offload_state = cfg.train.offload != "none", offload_master = cfg.train.offload == "optimizer+master";
  const unsigned ms = cfg.optim.master_dtype == "bf16" ? 2 : 4, ss = cfg.optim.state_dtype == "bf16" ? 2 : 4;
  const DType master_dtype = ms == 2 ? DType::BF16 : DType::F32;
  ShardElementBytes b;
  b.master = offload_master ? 0 : ms;
  b.low = (offload_master || master_dtype != compute) ? unsigned(dtype_size(compute)) : 0;
  b.grad = 4;
  b.optimizer = offload_state ? 0 : 2 * ss;
  b.host = (offload_state ? 2 * ss : 0) + (offload_master ? ms : 0);
  b.staging = 2 * b.host;  // two slots: one unit comes in while another is updated
  return b;
}
uint64_t MemoryEstimate::total() const { return saturate(static_cast<U>(device()) + host()); }

MemoryEstimate estimate_rank_memory(const RunConfig& cfg, DType compute, int shard_world, bool in_place,
                                    uint64_t workspace_bytes) {
  const ModelConfig& m = cfg.model;
  const U C = m.hidden_size, F = m.intermediate_size, V = m.vocab_size, L = m.num_layers;
  const U kv = static_cast<U>(m.num_kv_heads) * m.head_dim();
  // As ModelConfig::num_params and the layout's units, in 128 bits (validated
  // dimensions cannot overflow it).
  const U per_layer = (C * C + C) + 2 * (C * kv + kv) + C * C + 3 * C * F + 2 * C;
  const U embed = V * C, final_unit = C + (m.tie_word_embeddings ? 0 : V * C);
  const U params = embed + L * per_layer + final_unit;
  const U world = static_cast<U>(std::max(shard_world, 1));
  const U shard = (params + world - 1) / world;
  const U cdt = dtype_size(compute);
  MemoryEstimate e;
  // Fsdp: per unit master, grad, m, v, `low`, by shard_element_bytes; offloaded state is
  // streamed through a staging buffer the size of the largest unit's shard.
  const ShardElementBytes eb = shard_element_bytes(cfg, compute);
  const U largest_shard = (std::max({embed, per_layer, final_unit}) + world - 1) / world;
  e.parameters = saturate(shard * eb.device() + largest_shard * eb.staging);
  e.offloaded = saturate(shard * eb.host);
  if (!in_place) e.gathered = saturate(std::max({embed, per_layer, final_unit}) * (cdt + 4));
  e.activations = Qwen2Model::activation_bytes_for(m, compute, cfg.train.micro_batch, cfg.train.seq_len,
                                                   compute == DType::F32 ? 0 : 4096, parse_recompute(cfg.train.recompute),
                                                   Fp8Options::from(cfg.train));
  e.workspace = saturate(static_cast<U>(workspace_bytes) +
                         (compute == DType::F32 ? 0 : attention_workspace_bytes(m, cfg.train.micro_batch,
                                                                               cfg.train.seq_len)));
  e.batches = saturate(static_cast<U>(cfg.train.grad_accum) * cfg.train.micro_batch * cfg.train.seq_len * 8);
  if (!cfg.model_options.init_from.empty()) e.loaded = saturate(params * 4);
  if (cfg.run.checkpoint_every > 0) e.checkpoint = saturate(shard * 12);  // fp32 master, m, v
  return e;
}

void check_rank_memory(const RunConfig& cfg, Backend& backend, int shard_world, bool in_place, int ranks_on_host) {
  const bool cpu = backend.device() == Device::CPU;
  const DType compute = cpu ? DType::F32 : DType::BF16;
  const MemoryEstimate e = estimate_rank_memory(cfg, compute, shard_world, in_place, backend.workspace_bytes());
  const U ranks = static_cast<U>(std::max(ranks_on_host, 1));

  std::string parts = "parameters " + b(e.parameters) + " (" + human_count(static_cast<double>(cfg.model.num_params())) +
                      " sharded over " + std::to_string(shard_world) + ": " + cfg.optim.master_dtype +
                      " master, fp32 gradient, " + cfg.optim.state_dtype + " AdamW m and v" +
                      (cfg.train.offload == "none" ? "" : ", train.offload=" + cfg.train.offload) + ")";
  if (e.gathered) parts += ", largest unit gathered " + b(e.gathered);
  parts += ", activations " + b(e.activations) + " (train.micro_batch " + std::to_string(cfg.train.micro_batch) +
           " x train.seq_len " + std::to_string(cfg.train.seq_len) +
           (cfg.train.recompute == "none" ? "" : ", recompute " + cfg.train.recompute) + ")";
  if (e.workspace) parts += ", workspace " + b(e.workspace);
  std::string host_parts = "token ids " + b(e.batches) + " (train.grad_accum " + std::to_string(cfg.train.grad_accum) + ")";
  if (e.loaded) host_parts += ", model.init_from loaded in fp32 " + b(e.loaded);
  if (e.checkpoint) host_parts += ", checkpoint copy " + b(e.checkpoint);
  if (e.offloaded) host_parts += ", offloaded state " + b(e.offloaded) + " (train.offload=" + cfg.train.offload + ")";
  const std::string hint =
      ". Use a smaller model, a smaller train.micro_batch, train.seq_len or train.grad_accum, train.recompute, "
      "optim.state_dtype=bf16 and optim.master_dtype=bf16, train.offload, or more ranks (train --run.dry_run=true "
      "plans each without a GPU)";

  auto refuse = [&](uint64_t each, const std::string& what, size_t available, const std::string& source) {
    const uint64_t need = saturate(static_cast<U>(each) * ranks);
    fail("not enough memory for model ", cfg.model.source, ": ",
         ranks > 1 ? std::to_string(static_cast<int>(ranks)) + " ranks on this host need at least " + b(need) + " (" +
                         b(each) + " each: "
                   : "this rank needs at least " + b(need) + " (",
         what, "; a lower bound), but ", source, " has ", b(available), " available", hint);
  };
  if (cpu) {
    const size_t available = backend.memory_available_bytes();
    if (available > 0 && saturate(static_cast<U>(e.total()) * ranks) > available)
      refuse(e.total(), parts + ", " + host_parts, available, backend.memory_available_source());
    return;
  }
  // A GPU per rank: its own device memory; the host's RAM is shared by the host's ranks.
  const size_t gpu = backend.memory_available_bytes();
  if (gpu > 0 && e.device() > gpu) {
    const uint64_t each = e.device();
    fail("not enough GPU memory for model ", cfg.model.source, ": this rank needs at least ", b(each), " (", parts,
         "; a lower bound), but ", backend.memory_available_source(), " has ", b(gpu), " available", hint);
  }
  const size_t host = host_memory_available_bytes();
  if (host > 0 && saturate(static_cast<U>(e.host()) * ranks) > host)
    refuse(e.host(), host_parts, host, "host RAM (MemAvailable)");
}

}  // namespace st

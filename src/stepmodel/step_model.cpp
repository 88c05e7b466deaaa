#include "stepmodel/step_model.h"

#include <algorithm>

#include "core/error.h"

namespace st {

const char* schedule_name(OverlapSchedule s) { return s == OverlapSchedule::None ? "none" : "prefetch"; }

const char* group_name(CommGroup g) {
  switch (g) {
    case CommGroup::Shard: return "shard";
    case CommGroup::Replicate: return "replicate";
    default: return "world";
  }
}

OverlapSchedule parse_schedule(const std::string& name) {
  if (name == "none") return OverlapSchedule::None;
  if (name == "prefetch") return OverlapSchedule::Prefetch;
  fail_config("schedule '", name, "': one of none, prefetch");
}

namespace {

// A unit's elements as model/layout.cpp lays them out.
size_t block_numel(const ModelConfig& m) {
  const size_t C = m.hidden_size, F = m.intermediate_size, hd = m.head_dim();
  const size_t q = m.num_heads * hd, kv = m.num_kv_heads * hd;
  return 2 * C                 // input and post-attention norms
         + (q + 2 * kv) * C    // q, k, v weights
         + (q + 2 * kv)        // their biases
         + C * q               // o_proj
         + 3 * F * C;          // gate, up, down
}

// The ring of one group kind, all of its groups running at once (every shard group,
// or every replicate group, does its collective at the same time).
struct RingShape {
  int size = 1;             // ranks in one group
  bool crosses = false;     // some ring edge leaves a node
  int nic_edges = 0;        // ring edges leaving the busiest node, over all groups
  int intra_edges = 0;      // ring edges from the busiest rank to a rank of its own node (0 or 1)
  double inter_share = 0;   // share of the ranks whose next rank in the ring is on another node
};

RingShape ring_shape(const StepModelInput& in, CommGroup kind) {
  const int W = in.world(), P = in.ranks_per_node, G = in.shard_group();
  std::vector<std::vector<int>> groups;
  if (kind == CommGroup::World) {
    groups.emplace_back();
    for (int r = 0; r < W; ++r) groups.back().push_back(r);
  } else if (kind == CommGroup::Shard) {
    for (int base = 0; base < W; base += G) {
      groups.emplace_back();
      for (int r = base; r < base + G; ++r) groups.back().push_back(r);
    }
  } else {
    for (int pos = 0; pos < G; ++pos) {
      groups.emplace_back();
      for (int r = pos; r < W; r += G) groups.back().push_back(r);
    }
  }
  RingShape s;
  s.size = static_cast<int>(groups.front().size());
  if (s.size < 2) return s;
  std::vector<int> nic(in.nodes, 0), intra(W, 0);
  int crossing = 0;
  for (const std::vector<int>& m : groups)
    for (size_t i = 0; i < m.size(); ++i) {
      const int a = m[i], b = m[(i + 1) % m.size()];
      if (a / P != b / P)
        ++nic[a / P], ++crossing;
      else
        ++intra[a];
    }
  s.crosses = crossing > 0;
  s.nic_edges = *std::max_element(nic.begin(), nic.end());
  s.intra_edges = *std::max_element(intra.begin(), intra.end());
  s.inter_share = static_cast<double>(crossing) / W;
  return s;
}

double bytes_per_s(const Link& l) { return l.gbps * 1e9 / 8; }

// One call of `c` on its ring.
struct CallCost {
  double seconds = 0, inter_seconds = 0;
  double send_bytes = 0;   // what each rank sends
  double nic_bytes = 0;    // through the busiest node's network link
};

CallCost call_cost(const Collective& c, const RingShape& r, const StepModelInput& in) {
  CallCost k;
  const int R = r.size;
  if (R < 2) return k;
  const double n = static_cast<double>(c.count) * c.dtype_bytes;
  const bool all_reduce = c.kind == CollectiveKind::AllReduce;
  const int steps = all_reduce ? 2 * (R - 1) : R - 1;
  k.send_bytes = all_reduce ? 2.0 * (R - 1) / R * n : (R - 1) * n;
  // Unequal parts: the busiest rank sends all but the smallest (Collective::total).
  if (c.total) k.send_bytes = static_cast<double>(c.total - c.smallest) * c.dtype_bytes;
  k.nic_bytes = k.send_bytes * r.nic_edges;
  const double intra_s = r.intra_edges ? k.send_bytes * r.intra_edges / bytes_per_s(in.intra) : 0;
  const double inter_s = r.nic_edges ? k.nic_bytes / bytes_per_s(in.inter) : 0;
  // A ring step waits for its slowest edge: one that crosses nodes when any does.
  const double latency = steps * 1e-6 * (r.crosses ? in.inter.latency_us : in.intra.latency_us);
  k.seconds = latency + std::max(intra_s, inter_s);
  k.inter_seconds = r.crosses ? latency + inter_s : 0;
  return k;
}

}  // namespace

StepModelInput step_model_input(const RunConfig& cfg, int nodes, int ranks_per_node) {
  StepModelInput in;
  in.model = cfg.model;
  in.micro_batch = cfg.train.micro_batch;
  in.seq_len = cfg.train.seq_len;
  in.grad_accum = cfg.train.grad_accum;
  in.nodes = nodes;
  in.ranks_per_node = ranks_per_node;
  in.shard_group_size = cfg.dist.shard_group_size;
  in.reshard_after_forward = cfg.dist.reshard_after_forward;
  in.gather_dtype_bytes = cfg.train.device == "cuda" ? 2 : 4;
  in.reduce_dtype_bytes = cfg.dist.reduce_dtype == "bf16" ? 2 : 4;
  // What Qwen2Model::fp8_gather_spans hands FSDP: the MLP's weights when down is FP8,
  // gate|up with them when it is too.
  const auto& k = cfg.train.fp8_layers;
  auto named = [&](const char* n) { return std::find(k.begin(), k.end(), n) != k.end(); };
  if (cfg.train.matmul_dtype == "fp8" && cfg.dist.fp8_gather && named("down")) {
    const size_t C = cfg.model.hidden_size, F = cfg.model.intermediate_size;
    in.fp8_gather_numel = C * F + (named("gate_up") ? 2 * C * F : 0);
    in.fp8_bf16_end_blocks = cfg.train.fp8_bf16_end_blocks;
  }
  in.fp8_delayed = cfg.train.matmul_dtype == "fp8" && cfg.train.fp8_scaling == "delayed";
  return in;
}

void validate_step_model_input(const StepModelInput& in) {
  ST_CHECK_CONFIG(in.micro_batch >= 1 && in.seq_len >= 1 && in.grad_accum >= 1, "step model: micro_batch ",
                  in.micro_batch, ", seq_len ", in.seq_len, ", grad_accum ", in.grad_accum, ": each must be at least 1");
  ST_CHECK_CONFIG(in.nodes >= 1 && in.ranks_per_node >= 1, "step model: nodes ", in.nodes, ", ranks per node ",
                  in.ranks_per_node, ": each must be at least 1");
  ST_CHECK_CONFIG(in.shard_group_size >= 0 && in.shard_group() <= in.world() && in.world() % in.shard_group() == 0,
                  "step model: dist.shard_group_size ", in.shard_group_size, " does not divide the world of ",
                  in.world(), " ranks (", in.nodes, " nodes x ", in.ranks_per_node,
                  "): use a divisor of it, or 0 for every rank");
  for (int b : {in.gather_dtype_bytes, in.reduce_dtype_bytes})
    ST_CHECK_CONFIG(b == 2 || b == 4, "step model: a dtype on the wire of ", b, " bytes (2: bf16, 4: fp32)");
  ST_CHECK_CONFIG(in.compute_s >= 0, "step model: compute seconds ", in.compute_s, " below 0");
  ST_CHECK_CONFIG(in.host_net_s_per_byte >= 0 && in.host_cores_per_node >= 0, "step model: host network cost ",
                  in.host_net_s_per_byte, " s/byte over ", in.host_cores_per_node,
                  " cores per node (neither may be negative)");
  for (const Link* l : {&in.intra, &in.inter})
    ST_CHECK_CONFIG(l->gbps >= 0 && l->latency_us >= 0, "step model: a link of ", l->gbps, " Gbit/s and ",
                    l->latency_us, " us (neither may be negative)");
  if (in.world() == 1) return;
  for (CommGroup g : {CommGroup::Shard, CommGroup::Replicate, CommGroup::World}) {
    const RingShape r = ring_shape(in, g);
    ST_CHECK_CONFIG(!r.intra_edges || in.intra.gbps > 0, "step model: the ", group_name(g),
                    " group's ring runs between ranks of one node: an intra-node bandwidth is needed");
    ST_CHECK_CONFIG(!r.nic_edges || in.inter.gbps > 0, "step model: the ", group_name(g),
                    " group's ring crosses nodes: an inter-node bandwidth is needed");
  }
}

std::vector<UnitTraffic> unit_traffic(const ModelConfig& m, int shard_group, bool reshard, int accum) {
  const bool tied = m.tie_word_embeddings;
  const size_t C = m.hidden_size, V = m.vocab_size, G = shard_group;
  auto unit = [&](std::string name, size_t numel, int gathers) {
    return UnitTraffic{std::move(name), numel, (numel + G - 1) / G, gathers, accum, 1};
  };
  std::vector<UnitTraffic> units;
  // A tied embedding is released only by the forward pass that acquired it, at the
  // end of the backward: so it stays gathered to the step's end without resharding.
  units.push_back(unit("embed", V * C, reshard ? (tied ? accum : 2 * accum) : (tied ? 1 : accum)));
  for (int l = 0; l < m.num_layers; ++l)
    units.push_back(unit("layers." + std::to_string(l), block_numel(m), reshard ? 2 * accum : accum));
  units.push_back(unit("final", C + (tied ? 0 : V * C), reshard ? accum : 1));
  return units;
}

std::vector<Collective> step_collectives(const StepModelInput& in) {
  std::vector<Collective> out;
  size_t codes_blocks = 0;  // blocks whose MLP travels as FP8 codes
  const int A = in.grad_accum;
  if (in.world() > 1) {
    const std::vector<UnitTraffic> units = unit_traffic(in.model, in.shard_group(), in.reshard_after_forward, A);
    // The ends of a micro-batch, which nothing hides behind: the forward starts with
    // the embedding's gather (not prefetched) and the first block's (prefetched over
    // the embedding lookup only), and the backward ends with the first block's and the
    // embedding's reduce-scatters, which the next micro-batch's first gathers queue
    // behind on the same stream; with HSDP the step ends with their all-reduces.
    const size_t first = units.size() > 2 ? 1 : units.size() - 1;
    for (size_t i = 0; i < units.size(); ++i) {
      const UnitTraffic& u = units[i];
      const bool end = i == 0 || i == first;
      const int forward_gathers = i == 0 && in.model.tie_word_embeddings && !in.reshard_after_forward ? 1 : A;
      const int layer = static_cast<int>(i) - 1, ends = std::max(in.fp8_bf16_end_blocks, 0);
      const bool codes = in.fp8_gather_numel > 0 && in.fp8_gather_numel < u.numel && layer >= ends &&
                         layer < in.model.num_layers - ends && i + 1 < units.size() && in.world() > 1;
      if (codes) {
        ++codes_blocks;
        const size_t G = in.shard_group(), from = u.numel - in.fp8_gather_numel,
                     es = static_cast<size_t>(in.gather_dtype_bytes);
        const std::vector<size_t> parts = fp8_gather_part_bytes(u.numel, from, in.shard_group(), es);
        const size_t total = fp8_gather_byte(u.numel, from, es);
        out.push_back({CollectiveKind::AllGather, CommGroup::Shard, u.name + " fp8", (total + G - 1) / G, 1, u.gathers,
                       end ? forward_gathers : 0, total, *std::min_element(parts.begin(), parts.end())});
      } else {
        out.push_back({CollectiveKind::AllGather, CommGroup::Shard, u.name, u.shard_numel, in.gather_dtype_bytes,
                       u.gathers, end ? forward_gathers : 0});
      }
      out.push_back({CollectiveKind::ReduceScatter, CommGroup::Shard, u.name, u.shard_numel, in.reduce_dtype_bytes,
                     u.reductions, end ? u.reductions : 0});
      if (in.hsdp())
        out.push_back({CollectiveKind::AllReduce, CommGroup::Replicate, u.name, u.shard_numel, in.reduce_dtype_bytes,
                       u.replica_sums, end ? u.replica_sums : 0});
    }
  }
  if (in.world() > 1) {
    const int L = in.model.num_layers;
    const size_t CF = static_cast<size_t>(in.model.hidden_size) * in.model.intermediate_size;
    // FSDP's FP8 weight scales, once a step (Fsdp::agree_fp8_scales), and delayed
    // scaling's amax (the trainer), max-reduced in f32: synchronous, so exposed.
    if (codes_blocks > 0)
      out.push_back({CollectiveKind::AllReduce, CommGroup::Shard, "fp8_weight_scales",
                     codes_blocks * (in.fp8_gather_numel > CF ? 2 : 1), 4, 1, 1});
    if (in.fp8_delayed)
      out.push_back({CollectiveKind::AllReduce, CommGroup::World, "fp8_amax", static_cast<size_t>(L) * 8, 4, 1, 1});
  }
  // The trainer's scalar sums within a step (doubles; synchronous, so exposed).
  out.push_back({CollectiveKind::AllReduce, CommGroup::World, "total_valid", 1, 8, 1, 1});
  out.push_back({CollectiveKind::AllReduce, CommGroup::World, "loss", 1, 8, 1, 1});
  out.push_back({CollectiveKind::AllReduce, CommGroup::Shard, "grad_norm", 1, 8, 1, 1});
  return out;
}

double replica_start_share(const StepModelInput& in) {
  const ModelConfig& m = in.model;
  if (m.num_layers == 0) return 0;
  // FLOPs per token, in parameters: each block's and the lm_head's matmuls (the head
  // is computed whether or not it is tied), and attention's 6 x hidden x seq_len a layer.
  const double block = static_cast<double>(block_numel(m)) + static_cast<double>(m.hidden_size) * in.seq_len;
  const double head = static_cast<double>(m.vocab_size) * m.hidden_size;
  const double total = 6 * (block * m.num_layers + head);
  const double before = 2 * block * m.num_layers + 6 * head + 4 * block;  // forward, head, the last block's backward
  const int A = in.grad_accum;
  return (A - 1 + before / total) / A;
}

StepPrediction predict_step(const StepModelInput& in) {
  validate_step_model_input(in);
  const RingShape shapes[] = {ring_shape(in, CommGroup::Shard), ring_shape(in, CommGroup::Replicate),
                              ring_shape(in, CommGroup::World)};
  StepPrediction p;
  p.compute_s = in.compute_s;
  double exposed = 0, hideable[3] = {0, 0, 0};
  for (const Collective& c : step_collectives(in)) {
    const int g = static_cast<int>(c.group);
    const RingShape& r = shapes[g];
    const CallCost k = call_cost(c, r, in);
    const double seconds = k.seconds * c.times;
    p.comm_s += seconds;
    p.comm_inter_s += k.inter_seconds * c.times;
    p.inter_node_bytes_per_node += k.nic_bytes * c.times;
    exposed += k.seconds * c.exposed_times;
    hideable[g] += k.seconds * (c.times - c.exposed_times);
    if (r.size > 1) p.collectives_per_step += c.times;
    WireBytes& bytes = c.kind == CollectiveKind::AllGather       ? p.all_gather
                       : c.kind == CollectiveKind::ReduceScatter ? p.reduce_scatter
                                                                 : p.all_reduce;
    bytes.intra += k.send_bytes * c.times * (1 - r.inter_share);
    bytes.inter += k.send_bytes * c.times * r.inter_share;
    (c.kind == CollectiveKind::AllGather       ? p.comm_s_all_gather
     : c.kind == CollectiveKind::ReduceScatter ? p.comm_s_reduce_scatter
                                               : p.comm_s_all_reduce) += seconds;
  }
  // The node's network work on its own cores (CPU ranks): it runs during the
  // collectives, so without overlap it hides in their time, and with overlap it
  // takes cores from the compute.
  const double cores = in.host_cores_per_node > 0 ? in.host_cores_per_node : in.ranks_per_node;
  p.host_net_s = in.host_net_s_per_byte * p.inter_node_bytes_per_node / cores;
  if (in.schedule == OverlapSchedule::None) {
    p.step_s = p.compute_s + std::max(p.comm_s, p.host_net_s);
  } else {  // each communicator's stream runs beside the compute from its start; the exposed ends add
    const double busy = p.compute_s + p.host_net_s;
    const double replica_start = hideable[1] > 0 ? replica_start_share(in) * busy : 0;
    p.step_s = std::max({busy, hideable[0], replica_start + hideable[1], hideable[2]}) + exposed;
  }
  p.exposed_comm_s = p.step_s - p.compute_s;
  if (p.step_s > 0) {
    p.steps_per_s = 1 / p.step_s;
    p.tokens_per_s_per_rank = in.tokens_per_rank() / p.step_s;
    p.tokens_per_s_cluster = p.tokens_per_s_per_rank * in.world();
  }
  return p;
}

}  // namespace st

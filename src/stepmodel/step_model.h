// A step-time model of one FSDP / HSDP training step, as pure functions: which
// collectives a step runs and how many bytes each moves (what src/fsdp/fsdp.cpp and
// src/fsdp/shard_plan.cpp do, mirrored here without linking them), how long ring
// collectives take on the links between ranks, and how much of that compute hides.
// `deploy plan`, `shardtrain predict` and the scale-out bench use it;
// docs/scaleout.md gives the equations and where every number comes from.
//
// Ranks are numbered node by node (rank = node x ranks_per_node + local rank), as
// every launcher does. The shard group of a rank is ranks [g*G, (g+1)*G), its
// replicate group the ranks with the same rank % G (comm/process_groups.h).
#pragma once
#include <string>
#include <vector>

#include "config/model_config.h"
#include "core/collective.h"  // CollectiveKind (no broadcast in a step)
#include "config/run_config.h"

namespace st {

// What can hide behind what. None: every collective waits for the one before and
// compute waits for each (the CPU backend: Gloo runs the schedule synchronously).
// Prefetch: each communicator's collectives run on a stream of their own beside the
// compute (NCCL), so only the collectives at the ends of a micro-batch stay exposed.
enum class OverlapSchedule { None, Prefetch };
enum class CommGroup { Shard, Replicate, World };

const char* schedule_name(OverlapSchedule s);    // "none", "prefetch"
const char* group_name(CommGroup g);             // "shard", "replicate", "world"
// "none" | "prefetch"; throws a usage error naming the choices otherwise.
OverlapSchedule parse_schedule(const std::string& name);

// One direction of a link: the payload rate a collective achieves on it (not the
// line rate), and the latency each step of a ring pays on it.
struct Link {
  double gbps = 0;        // Gbit/s, 10^9 bits
  double latency_us = 0;  // one way, per message
};

struct StepModelInput {
  ModelConfig model;                 // resolved (config/model_config.h)
  int micro_batch = 1, seq_len = 1, grad_accum = 1;  // per rank, as [train] says
  int nodes = 1, ranks_per_node = 1;
  int shard_group_size = 0;          // dist.shard_group_size: 0 = every rank (full shard), G = HSDP
  bool reshard_after_forward = true;  // dist.reshard_after_forward
  int gather_dtype_bytes = 4;        // parameters on the wire: 2 (bf16, GPU) or 4 (fp32, CPU)
  int reduce_dtype_bytes = 4;        // gradients on the wire (dist.reduce_dtype): 4 (fp32) or 2 (bf16)
  // dist.fp8_gather with the MLP in FP8: the elements at the end of each FP8 block (the
  // MLP's weights) that are gathered as one-byte e4m3 codes, the rest of the block in
  // the gather dtype; blocks within fp8_bf16_end_blocks of either end have none.
  size_t fp8_gather_numel = 0;
  int fp8_bf16_end_blocks = 0;
  // train.fp8_scaling = "delayed" (with train.matmul_dtype = "fp8"): every step's amax of
  // the blocks' FP8 inputs and gradients (8 floats a block) is all-reduced (max) over the world.
  bool fp8_delayed = false;
  double compute_s = 0;              // forward + backward + optimizer of one rank's step, no communication
  Link intra, inter;                 // between ranks of one node; between nodes (one node's network link)
  OverlapSchedule schedule = OverlapSchedule::None;
  // The host's own cost of moving bytes between nodes, where the network stack runs on
  // the cores that compute (CPU ranks over TCP; 0 where a NIC and a GPU do the work):
  // CPU seconds per byte of one flow, its sender's and receiver's together, and the
  // cores one node has for it and its ranks' compute (0: one per rank).
  double host_net_s_per_byte = 0;
  double host_cores_per_node = 0;

  int world() const { return nodes * ranks_per_node; }
  int shard_group() const { return shard_group_size == 0 ? world() : shard_group_size; }
  int replicas() const { return world() / shard_group(); }
  double tokens_per_rank() const { return static_cast<double>(micro_batch) * seq_len * grad_accum; }
  bool hsdp() const { return replicas() > 1; }
};

// The inputs a run configuration fixes, for `nodes` x `ranks_per_node` ranks: the
// model, [train]'s batch, [dist]'s strategy and resharding, and the dtype the
// parameters are gathered in (bf16 with train.device = cuda, fp32 on the CPU).
// Gradients reduce in fp32 (what the code does); compute, links and schedule are
// left for the caller.
StepModelInput step_model_input(const RunConfig& cfg, int nodes, int ranks_per_node);

// Throws a usage error naming the input: sizes below 1, a shard group that does not
// divide the world, a dtype other than 2 or 4 bytes, a link a collective of this
// run crosses without a bandwidth.
void validate_step_model_input(const StepModelInput& in);

// What one unit of the shard plan (embedding, each block, final norm + untied
// lm_head) puts on the wire per step.
struct UnitTraffic {
  std::string name;        // "embed", "layers.N", "final" (model/layout.h's names)
  size_t numel = 0;        // parameters
  size_t shard_numel = 0;  // numel padded to a multiple of the shard group, over the group
  int gathers = 0;         // all-gathers per step
  int reductions = 0;      // reduce-scatters per step
  int replica_sums = 0;    // all-reduces over the replicate group per step (HSDP)
};

// Per micro-batch, with reshard_after_forward: a block is gathered twice (forward,
// backward), the final unit once (its forward and backward are one pass), a tied
// embedding once (held from the forward to the last backward), an untied one twice.
// Without it: a block or an untied embedding once per micro-batch; the final unit
// and a tied embedding once per step (never released by a backward, they stay
// gathered to the optimizer step). Every unit is reduce-scattered once per
// micro-batch and, with HSDP, all-reduced once per step (in the last micro-batch).
std::vector<UnitTraffic> unit_traffic(const ModelConfig& model, int shard_group, bool reshard_after_forward,
                                      int grad_accum);

// One collective call of a step, as the Comm interface takes it.
struct Collective {
  CollectiveKind kind = CollectiveKind::AllGather;
  CommGroup group = CommGroup::Shard;
  std::string what;        // the unit's name, or total_valid, loss, grad_norm (scalar sums)
  size_t count = 0;        // elements: the shard (all-gather send, reduce-scatter recv, all-reduce buffer)
  int dtype_bytes = 4;
  int times = 0;           // calls per step
  int exposed_times = 0;   // of those, the ones the prefetch schedule cannot hide
  // An all-gather of unequal parts (Comm::all_gather_v; count is then the mean part,
  // rounded up, as the communicators' byte counts take it): every part together and
  // the smallest (0, 0: every part is `count`). The busiest rank sends all but the
  // smallest, and its link bounds the time: NCCL pipelines the parts along the ring,
  // and Gloo's ring, which passes the largest part from rank to rank, starts the next
  // gather on a rank as soon as that rank is done with this one.
  size_t total = 0, smallest = 0;
};

// Every collective of a step: the units' (unit_traffic; a block with FP8 codes as one
// all-gather of unequal parts in bytes, each rank's slice of the part in the gather
// dtype and of the codes, fp8_gather_part_bytes, and the FP8 weights' scales
// agreed over the shard group; delayed FP8 scaling's amax over the world) and the three scalar sums
// inside a step's timing (the global count of valid targets and the loss over the
// world, the squared gradient norm over the shard group). A world of one rank
// gathers and reduces nothing (the shards are used in place).
std::vector<Collective> step_collectives(const StepModelInput& in);

struct WireBytes {
  double intra = 0, inter = 0;
  double total() const { return intra + inter; }
};

struct StepPrediction {
  double compute_s = 0;
  double comm_s = 0;            // every collective of the step, one after another
  double comm_inter_s = 0;      // of that, the inter-node link's part (its bytes / its rate + its latencies)
  double exposed_comm_s = 0;    // step_s - compute_s: communication that compute did not hide
  double host_net_s = 0;        // the node's network work on its own cores, per core (host_net_s_per_byte)
  double step_s = 0;
  double steps_per_s = 0, tokens_per_s_per_rank = 0, tokens_per_s_cluster = 0;
  // Bytes one rank sends per step (and receives: a ring is symmetric), mean over the
  // ranks, split by whether the next rank of the ring is on the same node.
  WireBytes all_gather, reduce_scatter, all_reduce;
  double comm_s_all_gather = 0, comm_s_reduce_scatter = 0, comm_s_all_reduce = 0;
  double inter_node_bytes_per_node = 0;  // through one node's network link, each way, per step
  int collectives_per_step = 0;          // calls over groups of more than one rank
};

// The model (docs/scaleout.md, "The model"): per collective call over a ring of R
// ranks, each rank sends s = (R-1) x count x dtype bytes (all-gather,
// reduce-scatter) or 2(R-1)/R x count x dtype bytes (all-reduce) in R-1 or 2(R-1)
// steps; its time is steps x latency + s x max(edges on the busiest intra-node link
// / intra rate, edges on the busiest node's network link / inter rate). With
// host = host_net_s_per_byte x the node's inter-node bytes each way / its cores:
//   none:      step = compute + max(comm, host)
//   prefetch:  step = max(compute + host, each communicator's start + hideable collectives) + exposed
// where a communicator's start is the compute before its first collective can run:
// none for the shard group (its first gathers run from the step's start), the
// forward, the head and the last block's backward for the replicate group (its
// all-reduces wait for gradients), scaled by compute + host.
StepPrediction predict_step(const StepModelInput& in);

// Of a step's compute, the share done before the replicate group's first all-reduce
// can start (HSDP): the micro-batches before the last, then the forward, the lm_head's
// forward and backward and the backward of the last block (FLOPs: 2 per parameter and
// token forward, 4 backward), over all of it.
double replica_start_share(const StepModelInput& in);

}  // namespace st

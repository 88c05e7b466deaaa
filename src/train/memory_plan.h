// One rank's memory planned from the configuration alone, the same sums as the
// trainer's own estimate (Trainer::estimated_peak_bytes: Fsdp's shards with their
// padding, ShardPlan::gathered_peak, Qwen2Model::activation_bytes_for, the backend's
// workspace) with nothing built or allocated: `train --run.dry_run=true` prints it for
// any device, world size and GPU memory size, and finds the micro-batch that fits.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/run_config.h"
#include "fsdp/shard_plan.h"

namespace st {

// What the CUDA backend holds before its first step: cuBLASLt's workspace (cuDNN
// attention's, sized at its first call, is MemoryPlan::attention).
constexpr size_t kCudaPlannedWorkspaceBytes = size_t(32) << 20;

struct MemoryPlan {
  // Where the backend computes (the GPU, or host RAM for the CPU backend):
  size_t master = 0;       // the master shard in optim.master_dtype (padded as Fsdp pads it; 0 offloaded)
  size_t low = 0;          // its compute-dtype copy (GPU: bf16), where gathers need one
  size_t grad = 0;         // the fp32 gradient shard
  size_t optimizer = 0;    // AdamW m and v in optim.state_dtype (0 offloaded)
  size_t staging = 0;      // train.offload: the largest unit's offloaded state, streamed through
  GatheredMemory gathered; // units gathered at the peak of a step (none in place)
  size_t activations = 0;  // one micro-batch's activations and scratch
  size_t workspace = 0;    // the backend's fixed buffers
  size_t attention = 0;    // GPU: cuDNN attention's workspace (attention_workspace_bytes)
  // Host RAM beside it:
  size_t batches = 0;      // a step's token ids (inputs and targets, grad_accum micro-batches)
  size_t loaded = 0;       // model.init_from in fp32 while it loads
  size_t checkpoint = 0;   // the host copy a checkpoint save writes from
  size_t offloaded = 0;    // train.offload: the shard's state in page-locked host memory

  size_t device_total() const {
    return master + low + grad + optimizer + staging + gathered.total() + activations + workspace + attention;
  }
  size_t host_total() const { return batches + loaded + checkpoint + offloaded; }
};

// `shard_world`: the ranks the parameters are sharded over; `in_place`: a world of one
// with no replicas (nothing gathered). `device` decides the compute dtype (CPU f32,
// CUDA bf16) and the lm_head's chunking, as the trainer does.
MemoryPlan plan_rank_memory(const RunConfig& cfg, Device device, int shard_world, bool in_place,
                            size_t workspace_bytes);

// The largest train.micro_batch (1..max_micro_batch) whose plan fits in `limit` bytes on
// the device, with everything else as in cfg (fp8: only micro-batches whose tokens are
// a multiple of 16); 0 when not even one fits.
int largest_fitting_micro_batch(RunConfig cfg, Device device, int shard_world, bool in_place, size_t workspace_bytes,
                                size_t limit, int max_micro_batch = 4096);

// The labels of the memory table's state rows, by the run's dtypes and offload, for
// the dry run's report and the trainer's header alike (device: the compute dtype).
struct MemoryRowLabels {
  std::string weights;    // the master shard and/or its compute copy
  std::string gradients;  // the fp32 gradient shard
  std::string optimizer;  // AdamW m and v on the device, or where they went
  std::string staging;    // train.offload's two staging slots
  std::string offloaded;  // train.offload: what lives in page-locked host memory
};
MemoryRowLabels memory_row_labels(const RunConfig& cfg, Device device);

// The dry run's report: the table of `plan`, the limit it is checked against (0: none
// known), and the largest micro-batch per recompute choice. One string, lines ending in
// '\n'.
std::string format_memory_plan(const RunConfig& cfg, Device device, int world, int shard_world, bool in_place,
                               size_t workspace_bytes, size_t limit, const std::string& limit_source);

}  // namespace st

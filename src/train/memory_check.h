// The memory a rank needs at least, estimated from the configuration alone, and the
// check of it against what can still be allocated: a run that cannot fit is refused
// before anything big is allocated (the layout, the shards, the activations, the
// micro-batches).
#pragma once
#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "config/run_config.h"

namespace st {

// Bytes per element of a rank's shard, by optim.master_dtype, optim.state_dtype and
// train.offload, as Fsdp allocates them (FsdpOptions from the same config): where the
// backend computes, and in page-locked host memory when offloaded. One rule for the
// trainer's estimate, the check before allocating and the dry run's plan.
struct ShardElementBytes {
  unsigned master = 4;     // the master weights (0 when offloaded)
  unsigned low = 0;        // their compute-dtype copy, where the compute dtype differs or the master is offloaded
  unsigned grad = 4;       // the fp32 gradient
  unsigned optimizer = 8;  // AdamW m and v (0 when offloaded)
  unsigned host = 0;       // offloaded master and/or m and v
  unsigned staging = 0;    // offloaded state streamed through the device (two slots), per element of the largest unit shard
  unsigned device() const { return master + low + grad + optimizer; }
};
ShardElementBytes shard_element_bytes(const RunConfig& cfg, DType compute);

// The workspace cuDNN's fused attention takes on a GPU at its first call, for one
// micro-batch of B sequences of T tokens: the deterministic backward's engine keeps
// dP in bf16 (2 bytes x B x heads x T x T: it grows with the square of the sequence)
// and dQ's fp32 accumulator (4 bytes x B x T x heads x head_dim), and the backward's
// fp32 softmax row sums (B x heads x T) come beside it. Fitted to cuDNN 9 on an H100
// and an H200 (0.5B to 14B, T 1024-4096): equal to the workspace measured at nine
// shapes, to 0.01 MiB at six and to the 0.01 GiB printed at three (the four in
// tests/train/test_memory_plan.cpp are among them). The
// planner, the trainer's estimate and the check before allocating count it on a GPU.
uint64_t attention_workspace_bytes(const ModelConfig& m, int64_t B, int64_t T);

// A lower bound of one rank's memory at its peak, in bytes. Padding, the gathered
// units beyond the one being computed, a reduction in flight, allocator slack and the
// data source's own buffers are not counted.
struct MemoryEstimate {
  // Where the backend computes (the GPU, or host RAM for the CPU backend):
  uint64_t parameters = 0;   // this rank's shard: master, fp32 gradient, AdamW m and v, a compute copy, offload staging
  uint64_t gathered = 0;     // sharded runs: the largest unit gathered in the compute dtype, with its fp32 gradient
  uint64_t activations = 0;  // one micro-batch's activations and scratch (Qwen2Model::activation_bytes_for)
  uint64_t workspace = 0;    // the backend's fixed buffers, and on a GPU cuDNN attention's
  // Host RAM:
  uint64_t batches = 0;      // a step's micro-batches of token ids (train.grad_accum x inputs and targets)
  uint64_t loaded = 0;       // model.init_from: the whole model in fp32 while it is loaded
  uint64_t checkpoint = 0;   // run.checkpoint_every > 0: the host copy of the shards a save writes from
  uint64_t offloaded = 0;    // train.offload: the shard's state kept in page-locked host memory

  uint64_t device() const;   // the first four (saturating)
  uint64_t host() const;     // the last four
  uint64_t total() const;    // all of it: the CPU backend's one memory
};

// `shard_world`: ranks the parameters are sharded over; `in_place`: a world of one with
// no replicas (nothing is gathered); compute: F32 on the CPU, BF16 on a GPU.
MemoryEstimate estimate_rank_memory(const RunConfig& cfg, DType compute, int shard_world, bool in_place,
                                    uint64_t workspace_bytes);

// Refuses (st::Error, exit 1) a run whose estimate does not fit, with the estimate, its
// parts and the limit: on the CPU the whole of it, times the `ranks_on_host` ranks that
// share the host, against backend.memory_available_bytes(); on a GPU the device part
// against the GPU's free memory and the host part (times ranks_on_host) against host
// RAM. Nothing is checked where the amount available is unknown (0).
void check_rank_memory(const RunConfig& cfg, Backend& backend, int shard_world, bool in_place, int ranks_on_host);

}  // namespace st

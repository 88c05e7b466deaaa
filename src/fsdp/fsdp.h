// Fully sharded data parallel state (ZeRO-3): per unit, this rank's slice of the
// fp32 master weights, fp32 gradient, and AdamW moments. The model sees whole
// units through ParamProvider: acquire all-gathers the unit (in the compute
// dtype), grad_ready reduce-scatters its fp32 gradient into this rank's shard. With
// HSDP the shard group is one node's ranks and the gradient shards are then summed
// across the groups (replicas) with an all-reduce.
//
// Overlap (with a comm that has its own stream, NCCL): prefetch(u) starts unit u's
// all-gather while the current unit computes, and acquire(u) only orders the compute
// after it. grad_ready(u) starts u's reduce-scatter and returns; the reduce-scatter
// is retired (its shard added to the gradient, its buffers freed) at the next
// grad_ready, so it runs during the next unit's backward. With HSDP the replicate
// all-reduce of a shard is started when its reduce-scatter is retired and retired
// one grad_ready later. sync_grads() retires everything; grad_norm, step and
// gather_unit call it, so callers never see a half-reduced gradient.
//
// HSDP with gradient accumulation: set_replica_sync(false) for every micro-batch but
// the last of a step lets the shards accumulate per replica; the last micro-batch then
// all-reduces each accumulated shard once (during its backward), instead of once per
// micro-batch. Whatever the calls, sync_grads() leaves every shard summed over the
// replicas exactly once.
//
// Reduce dtype: with FsdpOptions::reduce_dtype BF16 every gradient collective moves
// bf16: the reduce-scatter's input is the fp32 gradient rounded to bf16 and its output
// a bf16 part, widened when it is added to the fp32 shard; a replica all-reduce of a
// part runs on the bf16 part, one of a whole shard on a bf16 copy of it that, once
// summed, replaces the shard. The shards, the optimizer and the norm stay fp32.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "comm/comm.h"
#include "fsdp/shard_plan.h"
#include "model/layout.h"
#include "model/param_provider.h"

namespace st {

struct FsdpOptions {
  DType compute_dtype = DType::F32;
  // Free a unit's gathered weights after its forward and gather again for backward
  // (saves memory, costs one more all-gather per unit).
  bool reshard_after_forward = true;
  // One rank and no replicas: the model reads the shards in place and accumulates
  // into the gradient shard (no gather, cast or reduction). False takes the general
  // path anyway (tests of it).
  bool in_place_when_alone = true;
  // The dtype gradients travel in (dist.reduce_dtype): F32, or BF16, where the unit's
  // fp32 gradient is rounded to bf16 before its reduce-scatter and the reduced bf16
  // shard is widened and added to the fp32 shard gradient (the HSDP replica all-reduce
  // likewise), half the bytes on the wire.
  DType reduce_dtype = DType::F32;
  // The master weights' and AdamW moments' dtypes (optim.master_dtype, optim.state_dtype):
  // F32, or BF16 (each update computed in double and stored with stochastic rounding,
  // keyed by AdamWParams::round_key, the unit and the element's place in the unit, so the
  // same at any world size). A master in the compute dtype is gathered as is.
  DType master_dtype = DType::F32;
  DType state_dtype = DType::F32;
  // train.offload: m and v (offload_state), and the master weights too (offload_master),
  // live in page-locked host memory (Backend::alloc_host); step() streams each unit's
  // through two device staging slots (the next unit uploads while this one updates, the
  // previous one downloads: Backend's copy lanes), and gathers read the master's
  // compute-dtype copy kept on the device.
  bool offload_state = false;
  bool offload_master = false;
  // dist.fp8_gather: per unit, the FP8 weights that end it (Qwen2Model::fp8_gather_spans;
  // empty: none, or the option off). A gathered unit's parameters before them travel in
  // the compute dtype, they as e4m3 codes (one byte an element), each rank casting its
  // own part with the scale of the whole tensor's amax (agreed once per step,
  // Comm::all_reduce_max), and the model reads them through fp8_weights(): the same
  // codes it would cast from the gathered weights, half the bytes on the wire. Nothing
  // changes when nothing is gathered (one rank, in place).
  std::vector<std::vector<Fp8Span>> fp8_gather;
};

struct FsdpMemory {
  // On the device: master (+ its compute copy), gradient, m and v, offload staging;
  // host_bytes: what train.offload keeps in page-locked host memory.
  size_t master_bytes = 0, grad_bytes = 0, optimizer_bytes = 0, staging_bytes = 0, host_bytes = 0;
  size_t gathered_peak_bytes = 0;  // largest gathered weights + gradients seen at once
};

// The per-unit state a rank holds, each its shard of the unit (plan.shard_numel).
enum class ShardState { Master, Grad, AdamM, AdamV };

class Fsdp final : public ParamProvider {
 public:
  // `shard` all-gathers weights and reduce-scatters gradients; `replicate` (HSDP,
  // may be null) sums the gradient shards of ranks holding the same shard.
  // plan.world() must equal shard.world(); `plan` outlives this.
  Fsdp(const ShardPlan& plan, Backend& backend, Comm& shard, Comm* replicate, FsdpOptions options);
  ~Fsdp() override;
  Fsdp(const Fsdp&) = delete;
  Fsdp& operator=(const Fsdp&) = delete;

  // Seeded initialisation: this rank's shard of the same values at any world size.
  void init_weights(uint64_t seed, double std = 0.02);
  // Sets this rank's shard of unit u from the unit's whole unpadded values.
  void load_unit(int u, const std::vector<float>& values);
  // Whole unpadded values of unit u (collective: every rank must call it).
  std::vector<float> gather_unit(int u);

  void zero_grads();
  // Global L2 norm of the reduced gradient (collective).
  double grad_norm();
  // AdamW over every shard; weight decay only where the layout says decay.
  void step(const AdamWParams& params);

  FsdpMemory memory() const;
  // One rank, no replicas (and in_place_when_alone): the gathered unit is the shard
  // itself and the model accumulates its gradient straight into it (no gather, cast or
  // reduction), so nothing is ever gathered.
  bool in_place() const { return opt_.in_place_when_alone && comm_.world() == 1 && !replicate_; }
  const ShardPlan& plan() const { return plan_; }
  // Whether some unit's FP8 weights are gathered as codes (dist.fp8_gather).
  bool fp8_gathers() const { return fp8_slots_ > 0 && !in_place(); }

  // This rank's shard of unit u's `which` state, as fp32 on the host (padding
  // included). The gradient is complete (every reduction retired) when read.
  std::vector<float> download_shard(int u, ShardState which);
  // The same into `host` (plan.shard_numel(u) floats of the caller's).
  void download_shard_into(int u, ShardState which, float* host);
  Backend& backend() const { return be_; }
  // Sets this rank's shard of unit u's `which` state (plan.shard_numel values). Any
  // gathered copy of the unit is dropped (stale).
  void upload_shard(int u, ShardState which, const std::vector<float>& values);

  // ParamProvider
  Tensor acquire(int unit, Pass pass) override;
  void release(int unit, Pass pass) override;
  Tensor grad(int unit) override;
  void grad_ready(int unit) override;
  void prefetch(int unit, Pass pass) override;
  Fp8Weights fp8_weights(int unit) override;

  // Completes every gradient reduction started so far, including the replicate
  // all-reduce of shards still holding this replica's sum only (called by grad_norm,
  // step and gather_unit; harmless when there is nothing to do).
  void sync_grads();
  // HSDP: whether gradients from now on are summed across replicas as soon as they are
  // reduce-scattered (default), or left to accumulate per replica (see above).
  void set_replica_sync(bool on) { replica_sync_ = on; }
  // Before micro-batch i of the n of a step: replicas sum in the last one only.
  void begin_micro_batch(int i, int n) { set_replica_sync(i + 1 == n); }

 private:
  struct UnitState {
    Tensor master, grad, m, v;      // (shard) master and m, v in their dtypes (host memory when offloaded), grad f32
    // (shard) the master weights in the compute dtype, written by the optimizer step
    // (one pass with the update), so gathers read it without a cast; empty when the
    // compute dtype is f32 (they read `master`).
    Tensor low;                     // also when the master is offloaded or not in the compute dtype
    Tensor full;                    // (padded) compute dtype, while gathered
    Tensor full_grad;               // (padded) f32, while this micro-batch accumulates
    CommWork gathering;             // the all-gather filling `full`, until acquired
    // dist.fp8_gather: every rank's part of the gathered bytes (its slice before the FP8
    // tail in the compute dtype, of the tail as codes: fp8_gather_part_bytes), the counts
    // of the one all_gather_v; empty when the unit has no codes.
    std::vector<size_t> part_bytes;
    bool gather_pending = false;
    int refs = 0;
    std::vector<DecaySpan> spans;   // this rank's shard split by decay
    // HSDP: `grad` holds contributions summed across replicas / only this replica's.
    bool synced = false, local = false;
  };
  // A gradient reduction in flight: reduce-scatter of `full_grad` into `part`, then
  // (HSDP) the replicate all-reduce of the unit's accumulated shard or of `part`.
  struct Reduction {
    int unit;
    Tensor full_grad, part;   // in the reduce dtype (full_grad: the fp32 gradient itself when that is f32)
    CommWork work;
    bool sync = true;         // replica_sync_ when it started
    bool replicating = false;
    bool replaces = false;    // replicating a bf16 copy of the whole shard (in `part`): it replaces the shard
  };
  Tensor& state_tensor(int u, ShardState which);  // the shard tensor of `which` (gradient synced)
  bool on_host(ShardState which) const;            // kept in host memory (train.offload)
  // A device f32 copy of unit u's `which` (the caller frees it), and the way back.
  Tensor state_f32(int u, ShardState which);
  void set_state_f32(int u, ShardState which, Tensor f32);
  Tensor host_alloc(DType dtype, size_t n);       // page-locked, zero-filled
  void host_free(Tensor& t);
  // What gathers read: `low`, or `master` when the compute dtype is f32.
  Tensor& compute_shard(UnitState& s) { return s.low.empty() ? s.master : s.low; }
  void refresh_low(int u);               // low = master, after master changed other than by step()

  void start_gather(int u);
  // dist.fp8_gather: whether unit u gathers codes; where its FP8 tail starts; its codes
  // inside the gathered buffer `full`, after the compute-dtype part (16-byte aligned);
  // the scales of every FP8 tail agreed across the shard group (once after each change
  // of the weights: collective, and every rank reaches it at the same gather).
  bool fp8_gathered(int u) const { return !in_place() && !opt_.fp8_gather.empty() && !opt_.fp8_gather[u].empty(); }
  size_t fp8_from(int u) const { return opt_.fp8_gather[u].front().offset; }
  Tensor fp8_codes(const UnitState& s, int u) const;
  void agree_fp8_scales();
  void drop_full(UnitState& s);          // frees the gathered weights once no collective uses them
  bool retire(Reduction& r);             // advances one stage; true when it is complete
  bool low_reduce() const { return opt_.reduce_dtype != DType::F32; }
  void add_part(Tensor grad, Tensor& part, size_t n);  // grad += part (widened), then frees part
  // Starts the replica all-reduce of the whole shard `grad` (n): in place in f32, else
  // of a copy in the reduce dtype, returned (empty for f32) to be put back by wait_whole.
  CommWork all_reduce_whole(Tensor grad, size_t n, Tensor& wire);
  void put_back_whole(Tensor grad, Tensor& wire);  // after the wait: grad = wire (widened), frees wire
  void track_gathered();

  const ShardPlan& plan_;
  const ParamLayout& layout_;
  Backend& be_;
  Comm& comm_;
  Comm* replicate_;
  FsdpOptions opt_;
  std::vector<UnitState> units_;
  Tensor stage_master_, stage_m_, stage_v_;  // train.offload: two slots of the largest shard each, on the device
  size_t stage_slot_ = 0;                     // elements per slot
  std::vector<Reduction> reductions_;   // oldest first
  bool replica_sync_ = true;
  size_t gathered_now_ = 0, gathered_peak_ = 0;
  // dist.fp8_gather: per unit its first scale slot (4 floats a slot); amax, inverse
  // scales, a one-slot history for fp8_roll_scales, a scale of 1 and scratch codes for
  // the amax pass; whether the weights changed since the scales were agreed.
  std::vector<size_t> fp8_slot_;
  Tensor fp8_amax_, fp8_inv_, fp8_hist_, fp8_one_, fp8_scratch_;
  size_t fp8_slots_ = 0;
  bool fp8_stale_ = true;
};

}  // namespace st

// The sections of the run configuration, as plain values: [train], [optim], [data],
// [dist], [fabric] and [run] ([model] is config/model_config.h). Each section is read
// by one component, which includes this header for its own struct and is handed only
// that struct: the trainer its TrainOptions and RunOptions, the optimizer OptimOptions
// (train/schedule.h), the token sources DataOptions (data/source.h), the process
// groups and FSDP DistOptions (comm/process_groups.h), the NCCL profile FabricOptions
// (fabric/profile.h). Nothing here depends on what implements it, so the deploy
// tooling and the HTML report read a run configuration without linking a trainer.
//
// The choice lists below are the values a key may take; config/run_config.cpp
// checks them, and the component that reads the key acts on each of them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace st {

struct TrainOptions {           // [train]
  int steps = 300;              // optimizer steps
  int seq_len = 128;            // tokens per sequence
  int micro_batch = 16;         // sequences per forward/backward
  int grad_accum = 1;           // micro-batches per optimizer step
  uint64_t seed = 1234;         // initialisation and data order
  std::string device = "cpu";   // one of train_devices()
  int log_every = 10;           // step line every N steps
  double peak_tflops = 0;       // MFU denominator; 0 = the device table
  std::string recompute = "none";  // one of recompute_choices() (model/qwen2.h acts on it)
  std::string matmul_dtype = "bf16";  // one of matmul_dtypes(): the blocks' linear layers
  std::string fp8_scaling = "delayed";  // one of fp8_scalings(): how fp8 casts pick their scales
  // With fp8: which linear layers (fp8_layer_kinds(): the blocks' kinds and the
  // lm_head) compute in FP8, and how many blocks at each end of the stack keep theirs
  // all in bf16.
  std::vector<std::string> fp8_layers = {"gate_up", "down"};
  int fp8_bf16_end_blocks = 0;
  bool fp8_fast_accum = false;  // with fp8: the forward GEMMs use the tensor cores' fast accumulation
  // With an FP8 lm_head: how the logits' gradient rounds to e5m2 (fp8_roundings()).
  std::string fp8_dlogits_rounding = "stochastic";
  std::string offload = "none";       // one of offload_choices(): state kept in pinned host memory
};

// [optim]: AdamW and its learning-rate schedule (train/schedule.h).
struct OptimOptions {
  double lr = 3e-3;            // peak learning rate
  double min_lr_ratio = 0.1;   // cosine decay ends at lr * min_lr_ratio
  int warmup_steps = 20;       // linear warmup
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;   // decoupled; 2-D weights only
  double grad_clip = 1.0;      // global gradient norm; 0 disables
  std::string state_dtype = "fp32";   // one of state_dtypes(): AdamW's m and v
  std::string master_dtype = "fp32";  // one of state_dtypes(): the master weights
};

// [data]: where the tokens come from (data/source.h).
struct DataOptions {
  std::string source = "text";                                  // one of data_sources()
  std::vector<std::string> paths = {"/usr/share/common-licenses"};  // text: files or directories; tokens: prepared directories
  int ignore_index = -100;                                      // target id the loss skips (negative)
};

// [dist]: how ranks share the model (comm/process_groups.h, fsdp/).
struct DistOptions {
  int shard_group_size = 0;           // 0 = shard over all ranks (FSDP); G = HSDP groups of G
  bool reshard_after_forward = true;  // FSDP: free gathered weights after forward
  double timeout_s = 300;             // limit on every collective and rendezvous wait
  std::string reduce_dtype = "fp32";  // one of reduce_dtypes(): gradients on the wire (reduce-scatter, replica all-reduce)
  bool overlap = true;                // CPU (Gloo): prefetched gathers and reduce-scatters on a comm thread
  bool fp8_gather = true;             // train.matmul_dtype=fp8: gather the MLP's FP8 weights as e4m3 codes
  std::string bind;                   // where rank 0's rendezvous store listens; "" = MASTER_ADDR
};

// [fabric]: which network NCCL must use, and what it logs (fabric/profile.h).
struct FabricOptions {
  std::string transport = "auto";  // one of fabric_transports()
  std::string socket_ifname;       // "" = NCCL's choice
  std::string expect_transport;    // one of fabric_expect_transports()
  std::string log_dir;             // "" = <run.out_dir>/nccl
};

struct RunOptions {                // [run]
  std::string out_dir = "runs/default";  // logs, config, checkpoints
  std::string progress = "auto";   // one of progress_modes()
  std::string export_dir;          // write the trained model here (HF format); "" = no export
  std::string export_dtype = "bf16";  // one of export_dtypes()
  int checkpoint_every = 0;        // save every N steps (and at the end); 0 = never
  std::string checkpoint_dir;      // "" = <out_dir>/checkpoints
  int keep_last = 2;               // complete checkpoints kept (0 = all)
  std::string resume = "auto";     // auto (the newest checkpoint, else a fresh start) | none | a step-N directory
  std::string resume_config = "refuse";  // one of resume_configs(): a resume under other settings is refused | warned
  double term_grace_s = 30;        // after SIGTERM/SIGINT, the save must be done within this (then exit anyway)
  bool profile = false;            // time each op over a window of steps and print the table
  int profile_warmup = 3;          // steps before the profile window
  int profile_steps = 5;           // steps in the profile window
  bool tensorboard = true;         // rank 0 writes TensorBoard events to <out_dir>/tb
  bool dry_run = false;            // print the memory plan per rank and exit 0, allocating nothing
  double gpu_memory_gib = 0;       // dry_run: the GPU's memory to plan for; 0 = the GPU here, if any
  int dry_run_world = 0;           // dry_run: ranks to plan for; 0 = the launch environment's (else 1)
};

// The values each choice key may take, in the order --help lists them.
const std::vector<std::string>& train_devices();             // train.device: cpu, cuda
const std::vector<std::string>& recompute_choices();         // train.recompute: none, norm, swiglu, ffn, attn, block
const std::vector<std::string>& matmul_dtypes();             // train.matmul_dtype: bf16, fp8
const std::vector<std::string>& fp8_scalings();              // train.fp8_scaling: current, delayed
const std::vector<std::string>& fp8_roundings();  // train.fp8_dlogits_rounding: nearest, stochastic
const std::vector<std::string>& fp8_layer_kinds();  // train.fp8_layers: qkv, o, gate_up, down, lm_head, lm_head_grad, lm_head_fwd
const std::vector<std::string>& offload_choices();           // train.offload: none, optimizer, optimizer+master
const std::vector<std::string>& state_dtypes();              // optim.state_dtype, optim.master_dtype: fp32, bf16
const std::vector<std::string>& data_sources();              // data.source: random, text, tokens
const std::vector<std::string>& fabric_transports();         // fabric.transport: auto, efa, ib, socket
const std::vector<std::string>& fabric_expect_transports();  // fabric.expect_transport: "", efa, ib, socket, nvlink, shm
const std::vector<std::string>& progress_modes();            // run.progress: auto (a bar only on a terminal), on, off
const std::vector<std::string>& export_dtypes();             // run.export_dtype: bf16, f32
const std::vector<std::string>& reduce_dtypes();             // dist.reduce_dtype: fp32, bf16
const std::vector<std::string>& resume_configs();            // run.resume_config: refuse, override

}  // namespace st

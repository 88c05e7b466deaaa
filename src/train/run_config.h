// The run configuration: a TOML file (configs/*.toml) with command-line overrides of
// the form --section.key=value. Every key is declared once in a schema (name, type,
// help, default) which drives the TOML reader, the CLI options and --help alike.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"

namespace CLI { class App; }

namespace st {

struct RunConfig {
  // [model]
  std::string model_preset = "tiny";   // model.preset
  std::string model_config;            // model.config: HF config.json (file or dir); wins over preset
  std::string init_from;               // model.init_from: HF model dir whose weights start the run
  // Experiment overrides applied on top of the preset / config.json; 0 keeps its value.
  int model_layers = 0;                // model.layers
  int model_hidden_size = 0;           // model.hidden_size
  int model_intermediate_size = 0;     // model.intermediate_size
  int model_heads = 0;                 // model.heads
  int model_kv_heads = 0;              // model.kv_heads
  int model_vocab_size = 0;            // model.vocab_size
  // [train]
  int steps = 300;                     // train.steps
  int seq_len = 128;                   // train.seq_len
  int micro_batch = 16;                // train.micro_batch
  int grad_accum = 1;                  // train.grad_accum
  uint64_t seed = 1234;                // train.seed
  std::string device = "cpu";          // train.device: cpu | cuda
  int log_every = 10;                  // train.log_every
  double peak_tflops = 0;              // train.peak_tflops: MFU denominator; 0 = the device table
  // [optim]
  double lr = 3e-3;                    // optim.lr (peak)
  double min_lr_ratio = 0.1;           // optim.min_lr_ratio: final lr = lr * ratio
  int warmup_steps = 20;               // optim.warmup_steps
  double beta1 = 0.9;                  // optim.beta1
  double beta2 = 0.95;                 // optim.beta2
  double eps = 1e-8;                   // optim.eps
  double weight_decay = 0.1;           // optim.weight_decay
  double grad_clip = 1.0;              // optim.grad_clip: global norm; 0 disables
  // [data]
  std::string data_source = "text";    // data.source: random | text
  std::vector<std::string> data_paths = {"/usr/share/common-licenses"};  // data.paths: files or dirs
  int ignore_index = -100;             // data.ignore_index
  // [dist]
  int shard_group_size = 0;            // dist.shard_group_size: 0 = shard over all ranks (FSDP); G = HSDP
  bool reshard_after_forward = true;   // dist.reshard_after_forward
  double timeout_s = 300;              // dist.timeout_s: limit on every collective and rendezvous wait
  // [fabric] (NCCL only; see src/fabric/profile.h)
  std::string fabric_transport = "auto";   // fabric.transport: auto | efa | ib | socket
  std::string fabric_socket_ifname;        // fabric.socket_ifname: NCCL_SOCKET_IFNAME; "" = NCCL's choice
  std::string fabric_expect_transport;     // fabric.expect_transport: "" | efa | ib | socket | nvlink | shm
  std::string fabric_log_dir;              // fabric.log_dir: NCCL logs; "" = <run.out_dir>/nccl
  // [run]
  std::string out_dir = "runs/default";  // run.out_dir
  std::string progress = "auto";         // run.progress: auto | on | off
  std::string export_dir;                // run.export_dir: write the trained model here (HF format)
  std::string export_dtype = "bf16";     // run.export_dtype: bf16 | f32

  ModelConfig model;                   // resolved from model.preset / model.config
};

// Parsed "--section.key=value" overrides, in command-line order, as {"train.steps", "20"}
// (a leading "--" on the key is accepted too). Values stay text until load_run_config
// converts them; a list (data.paths) is comma-separated.
using ConfigOverrides = std::vector<std::pair<std::string, std::string>>;

// Registers one option per schema key (e.g. --train.steps) on `app`, with its help
// text and default shown in --help; values given land in `out` in order. `out` must
// outlive the parse.
void add_config_options(CLI::App& app, ConfigOverrides& out);

// Defaults, then the TOML file at `toml_path` (if not empty), then `overrides`;
// then resolves and validates the model config and the run values.
// Errors (st::Error) name the file (or "command line") and the key: unknown keys,
// wrong types, out-of-range values (steps < 1, seq_len < 1, ...), bad choices.
RunConfig load_run_config(const std::string& toml_path, const ConfigOverrides& overrides);

// The resolved configuration as TOML text (written to the run directory).
std::string run_config_toml(const RunConfig& cfg);

}  // namespace st

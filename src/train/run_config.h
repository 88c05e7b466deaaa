// The run configuration: a TOML file (configs/*.toml) with command-line overrides of
// the form --section.key=value. Every key is declared once in a schema (name, type,
// help, default) which drives the TOML reader, the CLI options and --help alike.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_groups.h"
#include "data/source.h"
#include "fabric/profile.h"
#include "model/config.h"
#include "train/schedule.h"

namespace CLI { class App; }

namespace st {

// The trainer's own sections.
struct TrainOptions {           // [train]
  int steps = 300;              // optimizer steps
  int seq_len = 128;            // tokens per sequence
  int micro_batch = 16;         // sequences per forward/backward
  int grad_accum = 1;           // micro-batches per optimizer step
  uint64_t seed = 1234;         // initialisation and data order
  std::string device = "cpu";   // one of backend_devices()
  int log_every = 10;           // step line every N steps
  double peak_tflops = 0;       // MFU denominator; 0 = the device table
  std::string recompute = "none";  // one of recompute_choices() (model/qwen2.h)
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
  double term_grace_s = 30;        // after SIGTERM/SIGINT, the save must be done within this (then exit anyway)
  bool profile = false;            // time each op over a window of steps and print the table
  int profile_warmup = 3;          // steps before the profile window
  int profile_steps = 5;           // steps in the profile window
  bool tensorboard = true;         // rank 0 writes TensorBoard events to <out_dir>/tb
};

// Every section, each a struct owned by the component that reads it; the trainer
// hands each component its own. Key names are "<section>.<field>" in TOML and on the
// command line (--train.steps=20).
struct RunConfig {
  ModelOptions model_options;   // [model]: where the model comes from (src/model/config.h)
  TrainOptions train;           // [train]
  OptimOptions optim;           // [optim] (src/train/schedule.h)
  DataOptions data;             // [data] (src/data/source.h)
  DistOptions dist;             // [dist] (src/comm/process_groups.h)
  FabricOptions fabric;         // [fabric] (src/fabric/profile.h)
  RunOptions run;               // [run]

  ModelConfig model;            // resolved from [model]
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

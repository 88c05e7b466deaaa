// The run configuration: a TOML file (configs/*.toml) with command-line overrides of
// the form --section.key=value. Every key is declared once in a schema table (name,
// field, help, range, choices; config/schema.h) which drives the TOML reader, the CLI
// options, --help and the TOML writer alike. The sections are config/options.h's.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config/model_config.h"
#include "config/options.h"
#include "config/schema.h"

namespace CLI { class App; }

namespace st {

// Every section, each a struct that one component reads (config/options.h); the
// trainer hands each component its own. Key names are "<section>.<field>" in TOML and on the
// command line (--train.steps=20).
struct RunConfig {
  ModelOptions model_options;   // [model]: where the model comes from (config/model_config.h)
  TrainOptions train;           // [train]
  OptimOptions optim;           // [optim]
  DataOptions data;             // [data]
  DistOptions dist;             // [dist]
  FabricOptions fabric;         // [fabric]
  RunOptions run;               // [run]

  ModelConfig model;            // resolved from [model]
};

// Parsed "--section.key=value" overrides, in command-line order, as {"train.steps", "20"}
// (a leading "--" on the key is accepted too). Values stay text until load_run_config
// converts them; a list (data.paths) is comma-separated.
using ConfigOverrides = KeyValues;

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

// The config.toml a run wrote, read back by a tool that looks at runs (`shardtrain
// report`): keys this version does not know are passed over (the run may be of
// another version), and a value of the wrong type or out of range is a data error
// (exit 3) naming the file, the key and the line. The model is resolved when it can
// be; when it cannot (a config.json that is not on this machine), `cfg.model` stays
// empty and `*model_note` says why.
RunConfig read_run_config(const std::string& path, std::string* model_note);

// A key whose value differs between two configurations, with each value as TOML
// writes it ("4", "\"runs/a\"", "[\"a.txt\"]").
struct ConfigChange {
  std::string key, before, after;
};

// The keys of `saved` (the TOML text of a configuration a run wrote, as a checkpoint's
// manifest records it; `source` names it in errors) whose values differ from `now`'s,
// in schema order. Only keys the text holds are compared: one written by another
// version may lack a key, or hold one this version does not know (passed over). A
// value of the wrong type is a data error (exit 3) naming `source` and the key.
std::vector<ConfigChange> run_config_changes(const std::string& saved, const std::string& source,
                                             const RunConfig& now);

}  // namespace st

// The small training runs the trainer tests share: the tiny preset cut to a few
// layers of a small width, a few steps of a short sequence, writing nothing and
// printing no progress, trained on one rank. Each test changes only what it is about.
#pragma once
#include <functional>

#include "backend/backend.h"
#include "comm/process_groups.h"
#include "config/model_config.h"
#include "train/trainer.h"

namespace st::testing {

// The dimensions of a tiny run. The defaults: 2 layers of width 64 (4 heads, 2 kv heads
// of head_dim 16), micro-batches of 8 x 32 tokens.
struct TinyShape {
  int layers = 2, hidden = 64, intermediate = 128;
  int seq_len = 32, micro_batch = 8, warmup_steps = 5;
};

// `steps` steps at `shape` on the default data (the text corpus), run.out_dir "" and
// run.progress off.
inline RunConfig tiny_run(int steps, const TinyShape& shape = {}) {
  RunConfig cfg;
  cfg.model = model_preset("tiny");
  cfg.model.num_layers = shape.layers;
  cfg.model.hidden_size = shape.hidden;
  cfg.model.intermediate_size = shape.intermediate;
  cfg.train.steps = steps;
  cfg.train.seq_len = shape.seq_len;
  cfg.train.micro_batch = shape.micro_batch;
  cfg.optim.warmup_steps = shape.warmup_steps;
  cfg.run.out_dir = "";
  cfg.run.progress = "off";
  return cfg;
}

// Trains `cfg` as the only rank on `be`, quietly; `after` (when given) sees the trainer
// once the run is done, before it goes.
inline TrainResult train_one_rank(const RunConfig& cfg, Backend& be,
                                  const std::function<void(Trainer&)>& after = nullptr) {
  ProcessGroups groups = make_single_process_groups(be);
  Trainer t(cfg, be, groups);
  TrainResult r = t.run(false);
  if (after) after(t);
  return r;
}

// train_one_rank on a CPU backend of its own.
inline TrainResult train_on_cpu(const RunConfig& cfg, const std::function<void(Trainer&)>& after = nullptr) {
  auto be = make_cpu_backend();
  return train_one_rank(cfg, *be, after);
}

}  // namespace st::testing

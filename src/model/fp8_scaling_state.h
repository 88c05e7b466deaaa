// What FP8 scaling carries from one optimizer step to the next (train.matmul_dtype =
// "fp8"), saved with a checkpoint so that a resumed run scales exactly as the
// uninterrupted one would have: with delayed scaling, the running amax of the step
// just done and the last steps' history of it, for each block linear layer's input and
// output gradient (agreed across ranks, so one state serves every rank at any world
// size); and the count of logit-gradient casts that keys the lm_head's stochastic
// rounding.
#pragma once
#include <cstdint>
#include <vector>

namespace st {

struct Fp8ScalingState {
  // The settings it was made under: a state restores only into the same ones.
  int layers = 0;
  unsigned kinds = 0;          // Fp8Options::kinds
  int bf16_end_blocks = 0;
  int history_len = 0;         // steps of history kept; 0: current scaling (no amax kept)
  // Delayed scaling.
  int rolls = 0;               // histories rolled so far (the next roll writes slot rolls % history_len)
  bool begun = false;          // a step began since the start: the next one rolls this step's amax in
  std::vector<float> amax;     // 2 x layers x 4: the inputs' (slot = 4 x layer + kind), then the output gradients'
  std::vector<float> history;  // 2 x layers x 4 x history_len, in the same order
  // The lm_head's stochastic rounding (train.fp8_dlogits_rounding): chunks cast so far.
  uint64_t dlogits_casts = 0;
};

}  // namespace st

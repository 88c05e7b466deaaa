#include "train/resume_config.h"

#include <algorithm>

#include "core/error.h"
#include "core/strings.h"

namespace st {

const std::vector<std::string>& resume_free_keys() {
  static const std::vector<std::string> keys = {
      // How long: the LR schedule follows the new train.steps from the step resumed.
      "train.steps",
      // How it is computed, not what: the same results (recompute, overlap, resharding), or
      // the same model on other hardware or ranks (a checkpoint loads at any world size).
      "train.device", "train.recompute", "train.log_every", "train.peak_tflops", "dist.shard_group_size",
      "dist.reshard_after_forward", "dist.timeout_s", "dist.overlap",
      // The matmuls' precision: the master weights and optimizer state are fp32 either
      // way, so a checkpoint continues in bf16 or fp8 alike.
      "train.matmul_dtype", "train.fp8_scaling", "train.fp8_layers", "train.fp8_bf16_end_blocks",
      "train.fp8_fast_accum", "train.fp8_dlogits_rounding",
      // Where the state lives (the same results), and its dtypes: a checkpoint stores
      // fp32 master weights and moments, converted to the run's dtypes when loaded.
      "train.offload", "optim.state_dtype", "optim.master_dtype",
      // The network, and everything about outputs: logs, progress, profiles, checkpoints, export.
      "fabric.", "run."};
  return keys;
}

namespace {

bool free_to_change(const std::string& key) {
  for (const std::string& k : resume_free_keys())
    if (k.back() == '.' ? key.compare(0, k.size(), k) == 0 : key == k) return true;
  return false;
}

}  // namespace

std::string check_resume_config(const std::string& saved, const std::string& checkpoint, const RunConfig& now) {
  if (saved.empty()) return "";
  const bool override = now.run.resume_config == "override";
  const std::string source = checkpoint + "/manifest.json (its run_config)";
  std::vector<ConfigChange> changes;
  try {
    changes = run_config_changes(saved, source, now);
  } catch (const Error& e) {
    if (!override)
      fail_data(e.what(), "; the settings it was saved under cannot be compared with this run's (pass "
                          "--run.resume_config=override to resume without comparing)");
    return std::string("run.resume_config=override: not compared with the checkpoint's settings: ") + e.what();
  }
  std::vector<std::string> shown;
  for (const ConfigChange& c : changes)
    if (!free_to_change(c.key)) shown.push_back(c.key + " " + c.before + " -> " + c.after);
  if (shown.empty()) return "";
  if (override)
    return "run.resume_config=override: resuming " + checkpoint + " under other settings than it was saved under: " +
           join(shown, ", ");
  fail_config("run.resume: ", checkpoint, " was saved under other settings than this run's: ", join(shown, ", "),
              " (checkpoint -> now). Resume with the checkpoint's values, start afresh (--run.resume=none, or "
              "another run.out_dir), or pass --run.resume_config=override to continue under the new ones");
}

}  // namespace st

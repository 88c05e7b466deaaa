// Resuming under other settings: a checkpoint's manifest records the run config it
// was saved under; a run that continues from it compares that with its own. Keys that
// change what is trained (the model, the data, the optimizer, the batch, the seed)
// must agree unless run.resume_config = "override"; the others (how long, how it logs,
// where it writes, how it is sharded) may change freely. docs/operations.md has the list.
#pragma once
#include <string>
#include <vector>

#include "config/run_config.h"

namespace st {

// The keys, or sections ending in ".", that may differ from the checkpoint's without a word.
const std::vector<std::string>& resume_free_keys();

// What resuming from `checkpoint` (whose manifest holds `saved`, its run config as
// TOML; empty for a checkpoint that records none) under `now` means: "" when nothing
// that matters changed; under run.resume_config = "override", a warning naming every
// changed key, old -> new. Under "refuse", a configuration error (exit 2) naming them
// all and the ways on. A `saved` that cannot be read is a data error (exit 3) under
// refuse, a warning under override.
std::string check_resume_config(const std::string& saved, const std::string& checkpoint, const RunConfig& now);

}  // namespace st

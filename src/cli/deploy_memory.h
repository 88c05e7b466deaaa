// The trainer's memory planner (train/memory_plan.h) in the form `deploy plan` and
// `deploy apply` take it (deploy/memory_fit.h): the deploy room may not link the
// trainer, the command line links both.
#pragma once
#include "deploy/memory_fit.h"

namespace st {

// plan: MemoryPlan::device_total() and host_total() of one rank, as
// `train --run.dry_run=true` plans it (the CUDA backend's workspace on a GPU);
// largest_micro_batch: largest_fitting_micro_batch.
MemoryPlanner trainer_memory_planner();

}  // namespace st

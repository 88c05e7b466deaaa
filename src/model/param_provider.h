// How the model reaches its weights and gradients without knowing about sharding.
// The model brackets each use of a unit with acquire/release and says when a
// unit's gradient for this micro-batch is complete; whoever implements this
// (FSDP, or a plain holder in tests) decides what gathering and reducing that means.
#pragma once
#include "backend/tensor.h"

namespace st {

enum class Pass { Forward, Backward };

class ParamProvider {
 public:
  virtual ~ParamProvider() = default;
  // The unit's full (unsharded) weights in the compute dtype, valid until the
  // matching release. Calls nest: a unit acquired twice stays until released twice.
  virtual Tensor acquire(int unit, Pass pass) = 0;
  virtual void release(int unit, Pass pass) = 0;
  // The unit's full gradient buffer (accumulated into by backward ops).
  virtual Tensor grad(int unit) = 0;
  // The unit's gradient for this micro-batch is complete.
  virtual void grad_ready(int unit) = 0;
  // A hint: `unit` is the next one to be acquired for `pass`. A provider that
  // gathers may start gathering it now, overlapped with the work on the current one.
  virtual void prefetch(int /*unit*/, Pass /*pass*/) {}
};

}  // namespace st

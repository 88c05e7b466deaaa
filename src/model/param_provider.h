// How the model reaches its weights and gradients without knowing about sharding.
// The model brackets each use of a unit with acquire/release and says when a
// unit's gradient for this micro-batch is complete; whoever implements this
// (FSDP, or a plain holder in tests) decides what gathering and reducing that means.
#pragma once
#include <cstddef>

#include "backend/tensor.h"

namespace st {

enum class Pass { Forward, Backward };

// One weight (or fused weights) of a unit: its elements [offset, offset + numel).
struct Fp8Span {
  size_t offset = 0, numel = 0;
};

// A unit's FP8 weights handed over already cast to e4m3 (FSDP gathers them so with
// dist.fp8_gather): the unit's elements [from, numel) as codes (codes[i] is element
// from + i), each weight of the tail (Qwen2Model::fp8_gather_spans) cast with the scale
// of its whole tensor's amax, the bits fp8_quantize gives it. The elements before `from` come in the compute dtype as always; those from
// `from` on are not in the compute-dtype buffer at all. inv_scales: one 16-byte slot
// per weight (cuBLASLt reads them in place), the k-th's 1/s at element 4 k.
struct Fp8Weights {
  Tensor codes;       // F8E4M3, numel - from
  size_t from = 0;
  Tensor inv_scales;  // F32, 4 per weight of the tail
};

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
  // The unit's FP8 weights, when this provider casts them (see Fp8Weights); empty
  // codes: none, the model casts the compute-dtype weights itself. Valid while acquired.
  virtual Fp8Weights fp8_weights(int /*unit*/) { return {}; }
};

}  // namespace st

// The collective-communication interface FSDP is written against. Implementations:
// a single-process one (world 1) here; NCCL (GPU) and Gloo (CPU, TCP) plug in
// behind the same calls. Buffers live where the backend keeps its tensors.
//
// Ordering. A collective reads its inputs after all backend work enqueued before the
// call, and backend work enqueued after the call (or, for the *_async forms, after
// wait()) sees its result. The synchronous forms behave as if the collective ran at
// the point of the call. The *_async forms return at once; until wait(work) the
// caller must neither read the outputs nor modify, reuse or free the inputs and
// outputs. wait() does not block the host where the backend has streams: it orders
// the backend's later work after the collective. Implementations without a separate
// communication stream (single process, Gloo) complete the collective inside the
// *_async call and wait() has nothing left to do.
//
// In place: all_gather may be given send == recv's slot of this rank
// (recv + rank * count); all_reduce and broadcast are always in place.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/tensor.h"

namespace st {

class Backend;

// A collective started by one of the *_async calls; id 0 is one already complete.
struct CommWork {
  uint64_t id = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;

  // recv (world * count) = concatenation over ranks of send (count). Same dtype.
  virtual void all_gather(Tensor recv, Tensor send, size_t count) = 0;
  // recv (count) = Σ over ranks of send[rank * count, (rank + 1) * count). Same dtype.
  virtual void reduce_scatter(Tensor recv, Tensor send, size_t count) = 0;
  // buf (count) = Σ over ranks of buf, in place.
  virtual void all_reduce(Tensor buf, size_t count) = 0;
  // buf (count, f32) = the element-wise maximum over ranks, in place (the FP8 amax
  // agreed across ranks). Synchronous, ordered as the other collectives.
  virtual void all_reduce_max(Tensor buf, size_t count);
  virtual void broadcast(Tensor buf, size_t count, int root) = 0;
  // A gather of unequal parts, in place: recv = the concatenation over ranks r of
  // counts[r] elements (rank r's at the sum of the counts before it), where this
  // rank's part already sits in its place. `counts` (one per rank, zeros allowed) is the
  // same on every rank. FSDP gathers a unit's FP8 weights and its other parameters so
  // (dist.fp8_gather). The default: one broadcast from each rank with a part.
  virtual void all_gather_v(Tensor recv, const std::vector<size_t>& counts);
  virtual void barrier() = 0;
  // Sum of a host scalar over ranks (losses, token counts, squared norms).
  virtual double all_reduce_sum(double value) = 0;

  // Asynchronous forms of the three bulk collectives (see Ordering above).
  virtual CommWork all_gather_async(Tensor recv, Tensor send, size_t count) {
    all_gather(recv, send, count);
    return {};
  }
  virtual CommWork reduce_scatter_async(Tensor recv, Tensor send, size_t count) {
    reduce_scatter(recv, send, count);
    return {};
  }
  virtual CommWork all_reduce_async(Tensor buf, size_t count) {
    all_reduce(buf, count);
    return {};
  }
  virtual CommWork all_gather_v_async(Tensor recv, const std::vector<size_t>& counts) {
    all_gather_v(recv, counts);
    return {};
  }
  // Backend work enqueued after this call sees the collective's results, and its
  // buffers may be reused or freed from then on. Waiting twice is harmless.
  virtual void wait(CommWork) {}
};

// all_gather_v's arguments checked (counts one per rank, recv large enough); their sum.
size_t check_gather_v(const Comm& comm, Tensor recv, const std::vector<size_t>& counts);

// World of one: every collective is a copy (or nothing).
std::unique_ptr<Comm> make_single_comm(Backend& backend);

}  // namespace st

// The collective-communication interface FSDP is written against. Implementations:
// a single-process one (world 1) here; NCCL (GPU) and Gloo (CPU, TCP) plug in
// behind the same calls. Buffers live where the backend keeps its tensors.
#pragma once
#include <cstddef>
#include <memory>

#include "backend/tensor.h"

namespace st {

class Backend;

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
  virtual void broadcast(Tensor buf, size_t count, int root) = 0;
  virtual void barrier() = 0;
  // Sum of a host scalar over ranks (losses, token counts, squared norms).
  virtual double all_reduce_sum(double value) = 0;
};

// World of one: every collective is a copy (or nothing).
std::unique_ptr<Comm> make_single_comm(Backend& backend);

}  // namespace st

// A non-owning view of backend memory: a pointer, an element type and a count.
// Shapes are passed to ops explicitly (llm.c style), with a shape comment at each
// call; `numel` is there so ops can check that a buffer is large enough.
#pragma once
#include <cstddef>

#include "core/dtype.h"
#include "core/error.h"

namespace st {

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  size_t numel = 0;

  bool empty() const { return data == nullptr; }
  size_t bytes() const { return numel * dtype_size(dtype); }
  template <class T>
  T* as() const { return static_cast<T*>(data); }
  // Elements [offset, offset + n) of this tensor.
  Tensor slice(size_t offset, size_t n) const {
    ST_CHECK(offset + n <= numel, "tensor slice [", offset, ", ", offset + n, ") past its end (", numel, ")");
    return Tensor{static_cast<char*>(data) + offset * dtype_size(dtype), dtype, n};
  }
};

}  // namespace st

// Argument checks of the op fronts (backend.cpp): every op names itself and the buffer
// in its message, so a wrong call reads "matmul_forward: weight holds 10 elements, needs 12".
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/tensor.h"
#include "core/error.h"

namespace st {

inline void check_dim(const char* op, const char* name, long long v) {
  ST_CHECK(v > 0, op, ": ", name, " must be positive, got ", v);
}

// Every id of ids[0, n) in [0, V) (or == ignore when has_ignore), checked before any
// output is written; the error names `op` (when given), `what`, the id and its row
// (backend/backend.cpp).
void check_ids_on_host(const int32_t* ids, size_t n, int V, bool has_ignore, int ignore, const char* what,
                       const char* op = nullptr);

// `t` must hold at least `count` elements of dtype `dt`.
inline void check_buf(const char* op, const char* name, Tensor t, DType dt, size_t count) {
  ST_CHECK(!t.empty(), op, ": ", name, " is empty (needs ", count, " elements)");
  ST_CHECK(t.dtype == dt, op, ": ", name, " is ", dtype_name(t.dtype), ", expected ", dtype_name(dt));
  ST_CHECK(t.numel >= count, op, ": ", name, " holds ", t.numel, " elements, needs ", count);
}

}  // namespace st

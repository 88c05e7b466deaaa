#include "comm/comm.h"

#include "core/error.h"

namespace st {

void Comm::all_reduce_max(Tensor buf, size_t count) {
  if (world() == 1 || count == 0) return;  // the maximum over one rank is its own
  fail_dist("all_reduce_max of ", count, " ", dtype_name(buf.dtype), " values: this communicator does not take maxima");
}

void Comm::all_gather_v(Tensor recv, const std::vector<size_t>& counts) {
  check_gather_v(*this, recv, counts);
  size_t at = 0;
  for (int r = 0; r < world(); ++r) {
    if (counts[r]) broadcast(recv.slice(at, counts[r]), counts[r], r);
    at += counts[r];
  }
}

size_t check_gather_v(const Comm& comm, Tensor recv, const std::vector<size_t>& counts) {
  ST_CHECK_DIST(static_cast<int>(counts.size()) == comm.world(), "all_gather_v: ", counts.size(),
                " counts for a group of ", comm.world());
  size_t total = 0;
  for (size_t c : counts) total += c;
  ST_CHECK_DIST(recv.numel >= total && (total == 0 || recv.data), "all_gather_v needs ", total,
                " elements in recv, it has ", recv.numel);
  return total;
}

}  // namespace st

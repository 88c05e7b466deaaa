// Splitting [0, n) across the host's cores for work whose every element is a pure
// function of its index (so the split never changes the result).
#pragma once
#include <algorithm>
#include <cstddef>
#include <thread>
#include <vector>

namespace st {

// fn(lo, hi) over [0, n): on one thread when n < 2 * min_chunk, else on up to one
// thread per core, each at least min_chunk elements.
template <class Fn>
void parallel_ranges(size_t n, size_t min_chunk, Fn&& fn) {
  const size_t threads = std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()), n / min_chunk);
  if (threads <= 1) {
    fn(size_t{0}, n);
    return;
  }
  std::vector<std::thread> pool;
  const size_t per = (n + threads - 1) / threads;
  for (size_t t = 0; t < threads; ++t) {
    const size_t lo = t * per, hi = std::min(n, lo + per);
    if (lo < hi) pool.emplace_back([&fn, lo, hi] { fn(lo, hi); });
  }
  for (auto& th : pool) th.join();
}

}  // namespace st

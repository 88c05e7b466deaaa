// The kinds of collective, as the communicators, their byte counts and the step-time
// model name them.
#pragma once
#include <algorithm>
#include <cstddef>

namespace st {

enum class CollectiveKind { AllGather, ReduceScatter, AllReduce, Broadcast };
inline constexpr int kCollectiveKinds = 4;

// "all_gather", "reduce_scatter", "all_reduce", "broadcast".
inline const char* collective_name(CollectiveKind k) {
  static const char* const names[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast"};
  return names[static_cast<int>(k)];
}

// Whether gathering a unit of n elements, cut into G equal slices (the last padded),
// with its elements from `from` on as one-byte FP8 codes and the rest in es-byte
// elements (two all-gathers of unequal parts) takes the link less long than gathering
// it all in es bytes (dist.fp8_gather). A communicator that pipelines unequal parts
// (NCCL: a broadcast from each rank, cut into chunks along the ring) moves fewer bytes
// whenever es > 1. A plain ring (Gloo) waits at every step for its largest chunk, and
// the part before the codes sits in the first ranks' slices: there it pays only if the
// largest part before the codes (es bytes an element) and the largest part of codes
// together are below one slice in es bytes.
inline bool fp8_codes_gather_pays(size_t n, size_t from, int G, size_t es, bool pipelined) {
  if (from >= n || G < 1) return false;
  if (pipelined) return es > 1;
  const size_t g = static_cast<size_t>(G), slice = (n + g - 1) / g;
  size_t head = 0, tail = 0;
  for (size_t q = 0; q < g; ++q) {
    const size_t b = std::min(q * slice, n), e = std::min(b + slice, n);
    const size_t h = b < from ? std::min(e, from) - b : 0;
    head = std::max(head, h);
    tail = std::max(tail, e - b - h);
  }
  return head * es + tail < slice * es;
}

}  // namespace st

// The kinds of collective, as the communicators, their byte counts and the step-time
// model name them.
#pragma once
#include <algorithm>
#include <cstddef>
#include <vector>

namespace st {

enum class CollectiveKind { AllGather, ReduceScatter, AllReduce, Broadcast };
inline constexpr int kCollectiveKinds = 4;

// "all_gather", "reduce_scatter", "all_reduce", "broadcast".
inline const char* collective_name(CollectiveKind k) {
  static const char* const names[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast"};
  return names[static_cast<int>(k)];
}

// dist.fp8_gather's byte layout of a gathered unit of n elements whose elements from
// `from` on travel as one-byte FP8 codes and the rest as es-byte elements: the es-byte
// part at byte 0, then the codes from the first 16-byte boundary after it. Element
// boundary i sits at byte fp8_gather_byte(i): every rank's slice [b, e) of the unit is
// then one run of bytes [byte(b), byte(e)), the runs back to back in rank order (the
// rank whose slice reaches `from` carries the alignment gap), so one all-gather of
// unequal parts moves the whole unit. No part is larger than a slice in es bytes, so
// that gather never takes a link longer than the one in es bytes, and its busiest
// rank, which sends every part but the smallest, sends fewer bytes.
inline size_t fp8_gather_codes_at(size_t from, size_t es) { return (from * es + 15) / 16 * 16; }
inline size_t fp8_gather_byte(size_t i, size_t from, size_t es) {
  return i < from ? i * es : fp8_gather_codes_at(from, es) + (i - from);
}

// Each of G ranks' part, in bytes, of that all-gather, the unit cut into G equal
// slices (the last short or empty, as the shard plan cuts it).
inline std::vector<size_t> fp8_gather_part_bytes(size_t n, size_t from, int G, size_t es) {
  const size_t g = static_cast<size_t>(std::max(G, 1)), slice = (n + g - 1) / g;
  std::vector<size_t> parts(g);
  for (size_t q = 0; q < g; ++q) {
    const size_t b = std::min(q * slice, n), e = std::min(b + slice, n);
    parts[q] = b == e ? 0 : fp8_gather_byte(e, from, es) - fp8_gather_byte(b, from, es);
  }
  return parts;
}

}  // namespace st

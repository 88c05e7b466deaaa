// The kinds of collective, as the communicators, their byte counts and the step-time
// model name them.
#pragma once

namespace st {

enum class CollectiveKind { AllGather, ReduceScatter, AllReduce, Broadcast };
inline constexpr int kCollectiveKinds = 4;

// "all_gather", "reduce_scatter", "all_reduce", "broadcast".
inline const char* collective_name(CollectiveKind k) {
  static const char* const names[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast"};
  return names[static_cast<int>(k)];
}

}  // namespace st

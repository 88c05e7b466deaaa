// data.source = "tokens": training batches drawn from prepared token directories
// (data/token_shards.h). make_token_shards_source (declared with the other sources in
// data/source.h) cuts the concatenated shards into windows of seq_len + 1 tokens and
// visits them in a keyed order that depends only on (seed, epoch): each epoch is one
// permutation of every window, so a global sample index names the same window at any
// world size. This header holds that permutation.
#pragma once
#include <cstdint>

namespace st {

// A bijection of [0, n) keyed by `key`: a 6-round Feistel network over the smallest
// even number of bits covering n, cycle-walked back into range (at most 4x the
// domain, so about 2 evaluations per call on average). Pure function of (n, key, i).
class WindowPermutation {
 public:
  WindowPermutation(uint64_t n, uint64_t key);
  uint64_t operator()(uint64_t i) const;
  uint64_t size() const { return n_; }

 private:
  uint64_t encrypt(uint64_t x) const;
  uint64_t n_, key_;
  int half_bits_;
  uint64_t half_mask_;
};

}  // namespace st

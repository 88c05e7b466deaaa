// Token sources. A micro-batch is B sequences of T+1 tokens: inputs are the first
// T, targets the last T. Every sample is a pure function of its global index
//   g = (step * grad_accum + micro) * (world * B) + rank * B + b,
// so the global batch of a step is the same set of sequences at any world size
// (ranks draw disjoint samples), and a run resumes at any step exactly.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/options.h"  // DataOptions, data_sources()

namespace st {

struct Batch {
  int B = 0, T = 0;
  std::vector<int32_t> inputs;   // (B, T)
  std::vector<int32_t> targets;  // (B, T)
};

struct BatchPosition {
  int64_t step = 0;
  int micro = 0, grad_accum = 1, rank = 0, world = 1;
  // Global index of row b of this micro-batch.
  uint64_t sample(int b, int B) const {
    return (static_cast<uint64_t>(step) * grad_accum + micro) * static_cast<uint64_t>(world) * B +
           static_cast<uint64_t>(rank) * B + b;
  }
};

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual void fill(Batch& batch, const BatchPosition& pos) const = 0;
  virtual std::string describe() const = 0;
};

// Uniform token ids in [0, vocab) — the recipe's synthetic data.
std::unique_ptr<TokenSource> make_random_source(int vocab_size, uint64_t seed);

// Byte-level tokens (ids 0..255) over local text files; directories are read
// recursively in name order. Each sample is a window of T+1 bytes at a seeded
// position in the concatenated corpus. Needs vocab_size >= 256 and a corpus of
// more than T+1 bytes; errors name the path.
std::unique_ptr<TokenSource> make_text_source(const std::vector<std::string>& paths, int vocab_size,
                                              uint64_t seed, int seq_len);

// Token shards written by `shardtrain data prepare` (data/token_shards.h): `paths` are
// prepared directories, their shards concatenated in order. The stream is cut into
// non-overlapping windows of T+1 tokens; sample g of the run is window
// perm_e(g mod W) of the W windows, where e = g div W is the epoch and perm_e a
// seeded Feistel permutation of [0, W) (a new one each epoch), so every window is
// seen once per epoch and g alone decides the sample. At open every shard's header
// and checksum are verified and every id checked below vocab_size (errors name the
// shard file, and the token offset of a bad id).
std::unique_ptr<TokenSource> make_token_shards_source(const std::vector<std::string>& paths, int vocab_size,
                                                      uint64_t seed, int seq_len);

// The source data.source names, for a model of `vocab_size` ids.
std::unique_ptr<TokenSource> make_token_source(const DataOptions& options, int vocab_size, uint64_t seed,
                                               int seq_len);

}  // namespace st

// data.source = "tokens" (token_shard_source.h): the window permutation and the source
// that reads training windows from prepared token directories.
#include "data/token_shard_source.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"
#include "data/source.h"
#include "data/token_shards.h"

namespace st {

// ---- permutation --------------------------------------------------------------------

WindowPermutation::WindowPermutation(uint64_t n, uint64_t key) : n_(n), key_(key) {
  ST_CHECK(n > 0, "a permutation of an empty range");
  int bits = n <= 1 ? 0 : 64 - std::countl_zero(n - 1);
  bits = std::max(2, bits + (bits & 1));
  half_bits_ = bits / 2;
  half_mask_ = half_bits_ == 32 ? 0xffffffffull : (1ull << half_bits_) - 1;
}

uint64_t WindowPermutation::encrypt(uint64_t x) const {
  uint64_t l = x >> half_bits_, r = x & half_mask_;
  for (uint64_t round = 0; round < 6; ++round) {
    const uint64_t f = counter_bits(hash_combine(key_, round), r) & half_mask_;
    const uint64_t nl = r;
    r = l ^ f;
    l = nl;
  }
  return (l << half_bits_) | r;
}

uint64_t WindowPermutation::operator()(uint64_t i) const {
  ST_CHECK(i < n_, "permutation index ", i, " out of range ", n_);
  uint64_t x = encrypt(i);
  while (x >= n_) x = encrypt(x);  // cycle-walking: the domain is at most 4n
  return x;
}

// ---- data.source = "tokens" ---------------------------------------------------------

namespace {

class TokenShardSource final : public TokenSource {
 public:
  TokenShardSource(std::vector<TokenDataset> sets, uint64_t seed, int seq_len)
      : sets_(std::move(sets)), key_(CounterRng(seed, hash_name("data.tokens")).key), seq_len_(seq_len) {
    for (const TokenDataset& d : sets_)
      for (const TokenShard& s : d.shards) {
        if (s.size() == 0) continue;
        starts_.push_back(total_);
        shards_.push_back(&s);
        total_ += s.size();
      }
  }

  void fill(Batch& batch, const BatchPosition& pos) const override {
    const int B = batch.B, T = batch.T;
    const uint64_t len = static_cast<uint64_t>(T) + 1;
    const uint64_t windows = total_ / len;
    ST_CHECK(windows > 0, "token data of ", total_, " tokens is too short for one sequence of ", len, " tokens");
    batch.inputs.resize(static_cast<size_t>(B) * T);
    batch.targets.resize(static_cast<size_t>(B) * T);
    std::vector<int32_t> w(len);
    for (int b = 0; b < B; ++b) {
      const uint64_t g = pos.sample(b, B);
      // Epoch e visits every window once, in the order of its own permutation.
      const WindowPermutation perm(windows, hash_combine(key_, g / windows));
      copy(perm(g % windows) * len, len, w.data());
      std::copy(w.begin(), w.end() - 1, batch.inputs.begin() + static_cast<ptrdiff_t>(b) * T);
      std::copy(w.begin() + 1, w.end(), batch.targets.begin() + static_cast<ptrdiff_t>(b) * T);
    }
  }

  std::string describe() const override {
    const TokenIndex& x = sets_.front().index;
    uint64_t docs = 0;
    for (const auto& d : sets_) docs += d.index.documents;
    const uint64_t windows = total_ / (static_cast<uint64_t>(seq_len_) + 1);
    return "tokens, " + human_count(static_cast<double>(total_)) + " tokens (" + human_count(static_cast<double>(docs)) +
           " documents, " + std::to_string(shards_.size()) + (shards_.size() == 1 ? " shard in " : " shards in ") + std::to_string(sets_.size()) +
           (sets_.size() == 1 ? " directory" : " directories") + "), " + human_count(static_cast<double>(windows)) +
           " windows of " + std::to_string(seq_len_ + 1) + " per epoch, tokenizer " + x.tokenizer;
  }

 private:
  void copy(uint64_t offset, uint64_t n, int32_t* out) const {
    size_t s = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), offset) - starts_.begin()) - 1;
    uint64_t at = offset - starts_[s];
    while (n > 0) {
      const TokenShard& shard = *shards_[s];
      const uint64_t take = std::min(n, shard.size() - at);
      std::memcpy(out, shard.data() + at, take * sizeof(int32_t));
      out += take;
      n -= take;
      at = 0;
      ++s;
    }
  }

  std::vector<TokenDataset> sets_;
  std::vector<const TokenShard*> shards_;
  std::vector<uint64_t> starts_;
  uint64_t total_ = 0, key_;
  int seq_len_;
};

}  // namespace

std::unique_ptr<TokenSource> make_token_shards_source(const std::vector<std::string>& paths, int vocab_size,
                                                      uint64_t seed, int seq_len) {
  ST_CHECK_CONFIG(!paths.empty(),
                  "data.paths is empty: name at least one directory prepared by `shardtrain data prepare` for "
                  "data.source 'tokens'");
  ST_CHECK_CONFIG(vocab_size > 0, "token data needs a positive vocab size, got ", vocab_size);
  std::vector<TokenDataset> sets;
  uint64_t total = 0;
  for (const std::string& p : paths) {
    try {
      sets.push_back(TokenDataset::open(p, vocab_size, true));
    } catch (const Error& e) {
      fail_as(e.kind(), "data.paths: ", e.what());
    }
    const TokenIndex& a = sets.front().index;
    const TokenIndex& b = sets.back().index;
    ST_CHECK_DATA(a.vocab_size == b.vocab_size && a.eos_id == b.eos_id, "data.paths: '", sets.front().dir,
             "' and '", p, "' were prepared with different tokenizers (vocab ", a.vocab_size, ", eos ", a.eos_id,
             " against vocab ", b.vocab_size, ", eos ", b.eos_id, ")");
    total += sets.back().tokens();
  }
  ST_CHECK_DATA(total > static_cast<uint64_t>(seq_len), "data.paths: the prepared data holds ", total,
           " tokens, fewer than one sequence of ", seq_len + 1, " tokens");
  return std::make_unique<TokenShardSource>(std::move(sets), seed, seq_len);
}

}  // namespace st

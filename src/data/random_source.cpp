#include "core/error.h"
#include "core/rng.h"
#include "data/source.h"

namespace st {
namespace {

class RandomSource final : public TokenSource {
 public:
  RandomSource(int vocab, uint64_t seed) : vocab_(vocab), rng_(seed, hash_name("data.random")) {}
  void fill(Batch& batch, const BatchPosition& pos) const override {
    const int B = batch.B, T = batch.T;
    batch.inputs.resize(static_cast<size_t>(B) * T);
    batch.targets.resize(static_cast<size_t>(B) * T);
    for (int b = 0; b < B; ++b) {
      const uint64_t base = pos.sample(b, B) * static_cast<uint64_t>(T + 1);
      for (int t = 0; t <= T; ++t) {
        const auto id = static_cast<int32_t>(rng_.below(base + t, static_cast<uint64_t>(vocab_)));
        if (t < T) batch.inputs[static_cast<size_t>(b) * T + t] = id;
        if (t > 0) batch.targets[static_cast<size_t>(b) * T + t - 1] = id;
      }
    }
  }
  std::string describe() const override { return "random token ids in [0, " + std::to_string(vocab_) + ")"; }

 private:
  int vocab_;
  CounterRng rng_;
};

}  // namespace

std::unique_ptr<TokenSource> make_random_source(int vocab_size, uint64_t seed) {
  ST_CHECK(vocab_size > 0, "random data needs a positive vocab size, got ", vocab_size);
  return std::make_unique<RandomSource>(vocab_size, seed);
}

}  // namespace st

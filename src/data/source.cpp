#include "data/source.h"

#include "core/error.h"

namespace st {

std::unique_ptr<TokenSource> make_token_source(const DataOptions& options, int vocab_size, uint64_t seed,
                                               int seq_len) {
  if (options.source == "random") return make_random_source(vocab_size, seed);
  if (options.source == "text") return make_text_source(options.paths, vocab_size, seed, seq_len);
  if (options.source == "tokens") return make_token_shards_source(options.paths, vocab_size, seed, seq_len);
  fail("data.source must be one of random, text, tokens, got '", options.source, "'");
}

}  // namespace st

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"
#include "data/prepare.h"
#include "data/source.h"
#include "data/token_shards.h"

namespace st {
namespace fs = std::filesystem;
namespace {

class TextSource final : public TokenSource {
 public:
  TextSource(std::vector<uint8_t> corpus, size_t files, uint64_t seed)
      : corpus_(std::move(corpus)), files_(files), rng_(seed, hash_name("data.text")) {}

  void fill(Batch& batch, const BatchPosition& pos) const override {
    const int B = batch.B, T = batch.T;
    ST_CHECK(corpus_.size() > static_cast<size_t>(T) + 1, "text corpus of ", corpus_.size(),
             " bytes is too short for sequences of ", T + 1, " tokens");
    batch.inputs.resize(static_cast<size_t>(B) * T);
    batch.targets.resize(static_cast<size_t>(B) * T);
    const uint64_t starts = corpus_.size() - T;  // windows [s, s + T] with s < starts
    for (int b = 0; b < B; ++b) {
      const size_t s = rng_.below(pos.sample(b, B), starts);
      for (int t = 0; t < T; ++t) {
        batch.inputs[static_cast<size_t>(b) * T + t] = corpus_[s + t];
        batch.targets[static_cast<size_t>(b) * T + t] = corpus_[s + t + 1];
      }
    }
  }
  std::string describe() const override {
    return "byte-level text, " + std::to_string(files_) + " files, " + human_bytes(static_cast<double>(corpus_.size()));
  }

 private:
  std::vector<uint8_t> corpus_;
  size_t files_;
  CounterRng rng_;
};

}  // namespace

std::unique_ptr<TokenSource> make_text_source(const std::vector<std::string>& paths, int vocab_size,
                                              uint64_t seed, int seq_len) {
  ST_CHECK_CONFIG(vocab_size >= 256, "text data is byte-level and needs a vocab of at least 256 ids; the model has ",
                  vocab_size);
  ST_CHECK_CONFIG(!paths.empty(), "data.paths is empty: name at least one file or directory for text data");
  const std::vector<std::string> files = collect_input_files(paths, "data.paths");
  ST_CHECK_DATA(!files.empty(), "data.paths: no regular files found under ", paths.front());
  std::vector<uint8_t> corpus;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    ST_CHECK_DATA(in, "data.paths: cannot read '", f, "'");
    const size_t begin = corpus.size();
    corpus.insert(corpus.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    ST_CHECK_CONFIG(corpus.size() - begin < sizeof kTokenShardMagic ||
                        std::memcmp(corpus.data() + begin, kTokenShardMagic, sizeof kTokenShardMagic) != 0,
                    "data.paths: '", f, "' is a shard of prepared tokens (shardtrain data prepare wrote it), not "
                    "text; train on its directory with --data.source=tokens");
    corpus.push_back('\n');  // files do not run into each other
  }
  ST_CHECK_DATA(corpus.size() > static_cast<size_t>(seq_len) + 1, "data.paths: the corpus has ", corpus.size(),
                " bytes, fewer than one sequence of ", seq_len + 1, " tokens");
  return std::make_unique<TextSource>(std::move(corpus), files.size(), seed);
}

}  // namespace st

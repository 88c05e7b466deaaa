// `shardtrain data prepare`: text files or JSONL lines in, a prepared directory of token
// shards (data/token_shards.h) out. The input files are read in order by the calling
// thread, tokenized by a pool of threads, and written in input order, so the output is
// the same bytes whatever the thread count. A failure or a signal leaves no output.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "data/token_shards.h"

namespace st {

// `data prepare`: tokenizes documents and writes a prepared directory.
struct PrepareOptions {
  std::vector<std::string> inputs;    // files or directories (recursive, name order)
  std::string format = "text";        // text: a file is a document; jsonl: a line is a document
  std::string text_field = "text";    // jsonl: the field holding the document's text
  std::string out;                    // the prepared directory
  uint64_t shard_tokens = 1ull << 27; // tokens per shard file (the last holds the rest)
  int threads = 1;
  bool force = false;                 // replace a non-empty out
  // jsonl: leave out lines that are not a JSON object with a string text field (invalid
  // JSON or UTF-8 included), counted in index.json and reported, instead of stopping.
  bool skip_bad_lines = false;
  // The tokenizer: encode must be safe to call from several threads at once.
  std::function<std::vector<int32_t>(std::string_view)> encode;
  std::string tokenizer, tokenizer_dir;
  int64_t vocab_size = 0;
  int32_t eos_id = 0;
};
struct PrepareProgress {
  uint64_t bytes_done = 0, bytes_total = 0, documents = 0, tokens = 0;
  double seconds = 0;
};
// Writes into <out>.tmp-<pid> and renames it into place at the end, so a failure or a
// signal (SIGINT/SIGTERM: st::Interrupted) leaves no output. The output is the same
// bytes whatever `threads`. `progress` is called from the calling thread.
TokenIndex prepare_token_shards(const PrepareOptions& options,
                                const std::function<void(const PrepareProgress&)>& progress = {});

// A directory of prepared tokens (is_prepared_token_dir) met among text inputs:
// Refuse: a usage error saying to train on it with --data.source=tokens (text data);
// Skip: a directory found inside an input is left out and added to `skipped`, and one
// named as an input itself is refused (data prepare: its own earlier output).
enum class PreparedDirs { Refuse, Skip };

// The regular files under `paths` (each itself, or recursively in name order), each
// once even when reached twice; errors name a missing path. `what` prefixes messages.
std::vector<std::string> collect_input_files(const std::vector<std::string>& paths, const std::string& what,
                                             PreparedDirs prepared = PreparedDirs::Refuse,
                                             std::vector<std::string>* skipped = nullptr);

}  // namespace st

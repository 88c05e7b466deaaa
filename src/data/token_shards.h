// Token shards: tokenized text on disk, as `shardtrain data prepare` writes it
// (data/prepare.h) and `data.source = "tokens"` reads it (data/token_shard_source.h).
// This file is the format only: writing and opening one shard, index.json, and a
// prepared directory opened whole.
//
// A prepared directory holds shard files and an index.json. A shard file is a
// 64-byte header followed by its token ids, each a little-endian uint32:
//
//   offset  size  field
//        0     8  magic "STTOKENS"
//        8     4  format version (1)
//       12     4  header size in bytes (64)
//       16     4  vocabulary size of the tokenizer: every id is below it
//       20     4  bytes per token (4)
//       24     8  token count N
//       32     8  XXH3-64 (seed 0) of the N*4 token bytes
//       40    24  zero
//       64   4*N  token ids
//
// index.json lists the tokenizer (description, directory, vocab size, eos id), the
// document and token counts, each shard (file, tokens, checksum) in order, and each
// input file. The token stream of a directory is its shards concatenated in index
// order: every document's tokens followed by eos, documents in input order.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace st {

inline constexpr char kTokenShardMagic[8] = {'S', 'T', 'T', 'O', 'K', 'E', 'N', 'S'};
inline constexpr uint32_t kTokenShardVersion = 1;
inline constexpr uint64_t kTokenShardHeaderBytes = 64;
inline constexpr const char* kTokenIndexName = "index.json";

std::string xxh3_64_hex(uint64_t h);  // 16 lowercase hex digits

// Writes one shard file: ids are appended (buffered, checksummed on the way), and
// finish() writes the header, fsyncs and closes. A writer destroyed before finish()
// leaves an incomplete file with a zero header, which no reader accepts.
class TokenShardWriter {
 public:
  TokenShardWriter(std::string path, uint32_t vocab_size);
  ~TokenShardWriter();
  TokenShardWriter(const TokenShardWriter&) = delete;
  TokenShardWriter& operator=(const TokenShardWriter&) = delete;

  // Every id must lie in [0, vocab_size): st::Error otherwise (naming the file and the offset).
  void append(const int32_t* ids, size_t n);
  uint64_t tokens() const { return tokens_; }
  const std::string& path() const { return path_; }
  // Header, flush, fsync, close; returns the XXH3-64 of the token bytes.
  uint64_t finish();

 private:
  void flush_buffer();
  std::string path_;
  uint32_t vocab_;
  int fd_ = -1;
  uint64_t tokens_ = 0;
  void* state_ = nullptr;  // XXH3_state_t
  std::vector<uint32_t> buffer_;
};

// One shard file, memory-mapped read-only. open() validates the header (magic,
// version, sizes against the file's size) and checks every id below
// min(vocab_limit, the header's vocab size) in one pass; errors name the file, and
// for a bad id its token offset. verify_checksum also recomputes the XXH3-64 in that
// pass, at no measurable cost: the pass is bound by reading the pages, not by the
// hash (docs/operations.md has the numbers), so every reader in shardtrain verifies.
class TokenShard {
 public:
  // vocab_limit <= 0: only the header's vocab size bounds the ids.
  static TokenShard open(const std::string& path, int64_t vocab_limit = 0, bool verify_checksum = true);
  TokenShard() = default;
  TokenShard(TokenShard&& o) noexcept;
  TokenShard& operator=(TokenShard&& o) noexcept;
  ~TokenShard();

  const std::string& path() const { return path_; }
  uint64_t size() const { return tokens_; }            // tokens
  uint32_t vocab_size() const { return vocab_; }       // from the header
  uint64_t checksum() const { return checksum_; }      // from the header
  const uint32_t* data() const { return ids_; }
  int32_t at(uint64_t i) const { return static_cast<int32_t>(ids_[i]); }
  // XXH3-64 of the token bytes as they are on disk now.
  uint64_t compute_checksum() const;

 private:
  std::string path_;
  void* map_ = nullptr;
  uint64_t map_bytes_ = 0;
  const uint32_t* ids_ = nullptr;
  uint64_t tokens_ = 0;
  uint32_t vocab_ = 0;
  uint64_t checksum_ = 0;
};

// index.json of a prepared directory.
struct TokenIndexShard {
  std::string file;  // name inside the directory
  uint64_t tokens = 0;
  std::string xxh3_64;
};
struct TokenIndexInput {
  std::string path;
  uint64_t bytes = 0, documents = 0, tokens = 0;
  uint64_t skipped_lines = 0;  // left out by --skip-bad-lines (in index.json only when > 0)
};
struct TokenIndex {
  std::string tokenizer;      // the tokenizer's describe()
  std::string tokenizer_dir;  // absolute path it was loaded from
  int64_t vocab_size = 0;
  int32_t eos_id = 0;
  std::string input_format;   // text | jsonl
  std::string text_field;     // jsonl only
  uint64_t documents = 0, tokens = 0, shard_tokens = 0;
  uint64_t skipped_lines = 0;  // JSONL lines left out by --skip-bad-lines (in index.json only when > 0)
  std::vector<TokenIndexShard> shards;
  std::vector<TokenIndexInput> inputs;
};
std::string token_index_json(const TokenIndex& index);
// Reads <dir>/index.json; errors name the file and the key.
TokenIndex read_token_index(const std::string& dir);
// Whether `dir` looks like what `data prepare` writes: an index.json that says
// "shardtrain-tokens" near its start, or one beside shard-00000.bin. Reads only a few
// bytes; says nothing of whether the directory is intact (read_token_index does).
bool is_prepared_token_dir(const std::string& dir);

// A prepared directory opened whole: its index and every shard, each checked
// against the index (token count, checksum in the header) and as TokenShard::open does.
struct TokenDataset {
  std::string dir;
  TokenIndex index;
  std::vector<TokenShard> shards;
  static TokenDataset open(const std::string& dir, int64_t vocab_limit = 0, bool verify_checksums = true);
  uint64_t tokens() const;  // over all shards
  // Tokens [offset, offset + n) of the concatenated shards (n within bounds).
  std::vector<int32_t> read(uint64_t offset, uint64_t n) const;
};

}  // namespace st

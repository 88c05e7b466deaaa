// The token shard format (token_shards.h): the shard writer and reader, index.json, and
// a prepared directory opened whole.
#include "data/token_shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/error.h"
#include "io/json_integer.h"

namespace st {
namespace fs = std::filesystem;

// Token ids are stored little-endian and read in place through the mapping.
static_assert(std::endian::native == std::endian::little, "token shards are read in place: a little-endian host is needed");

std::string xxh3_64_hex(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

namespace {

struct RawHeader {
  char magic[8];
  uint32_t version, header_bytes, vocab_size, token_bytes;
  uint64_t tokens, xxh3_64;
  uint8_t zero[24];
};
static_assert(sizeof(RawHeader) == kTokenShardHeaderBytes);

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) fail(path, ": write failed: ", std::strerror(errno), errno == ENOSPC ? " (disk full)" : "");
    p += w;
    n -= static_cast<size_t>(w);
  }
}

constexpr size_t kWriteBufferTokens = 1 << 18;  // 1 MiB
constexpr uint64_t kScanChunk = 1 << 16;        // tokens per pass chunk (256 KiB, stays in L2)

}  // namespace

// ---- writer -------------------------------------------------------------------------

TokenShardWriter::TokenShardWriter(std::string path, uint32_t vocab_size) : path_(std::move(path)), vocab_(vocab_size) {
  ST_CHECK(vocab_ > 0, path_, ": a token shard needs a positive vocabulary size");
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path_, ": cannot create: ", std::strerror(errno));
  const RawHeader zero{};
  write_all(fd_, &zero, sizeof zero, path_);  // a zero magic until finish()
  state_ = XXH3_createState();
  ST_CHECK(state_ != nullptr, "out of memory for a hash state");
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
  buffer_.reserve(kWriteBufferTokens);
}

TokenShardWriter::~TokenShardWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (state_) XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}

void TokenShardWriter::append(const int32_t* ids, size_t n) {
  ST_CHECK(fd_ >= 0, path_, ": append after finish");
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = ids[i];
    if (id < 0 || static_cast<uint32_t>(id) >= vocab_)
      fail(path_, ": token id ", id, " at token offset ", tokens_, " is outside the tokenizer's vocabulary [0, ", vocab_,
           ")");
    buffer_.push_back(static_cast<uint32_t>(id));
    ++tokens_;
    if (buffer_.size() == kWriteBufferTokens) flush_buffer();
  }
}

void TokenShardWriter::flush_buffer() {
  if (buffer_.empty()) return;
  const size_t bytes = buffer_.size() * sizeof(uint32_t);
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), buffer_.data(), bytes);
  write_all(fd_, buffer_.data(), bytes, path_);
  buffer_.clear();
}

uint64_t TokenShardWriter::finish() {
  ST_CHECK(fd_ >= 0, path_, ": finish called twice");
  flush_buffer();
  RawHeader h{};
  std::memcpy(h.magic, kTokenShardMagic, sizeof h.magic);
  h.version = kTokenShardVersion;
  h.header_bytes = static_cast<uint32_t>(kTokenShardHeaderBytes);
  h.vocab_size = vocab_;
  h.token_bytes = sizeof(uint32_t);
  h.tokens = tokens_;
  h.xxh3_64 = XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_));
  if (::pwrite(fd_, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h))
    fail(path_, ": cannot write the header: ", std::strerror(errno));
  if (::fsync(fd_) != 0) fail(path_, ": fsync failed: ", std::strerror(errno));
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) fail(path_, ": close failed: ", std::strerror(errno));
  return h.xxh3_64;
}

// ---- reader -------------------------------------------------------------------------

TokenShard::TokenShard(TokenShard&& o) noexcept { *this = std::move(o); }

TokenShard& TokenShard::operator=(TokenShard&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(map_, map_bytes_);
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
    ids_ = std::exchange(o.ids_, nullptr);
    tokens_ = std::exchange(o.tokens_, 0);
    vocab_ = o.vocab_;
    checksum_ = o.checksum_;
  }
  return *this;
}

TokenShard::~TokenShard() {
  if (map_) ::munmap(map_, map_bytes_);
}

TokenShard TokenShard::open(const std::string& path, int64_t vocab_limit, bool verify_checksum) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, ": cannot open token shard: ", std::strerror(errno));
  struct stat sb {};
  if (::fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    ::close(fd);
    fail(path, ": not a regular file");
  }
  const auto size = static_cast<uint64_t>(sb.st_size);
  if (size < kTokenShardHeaderBytes) {
    ::close(fd);
    fail(path, ": truncated: ", size, " bytes, shorter than the ", kTokenShardHeaderBytes,
         "-byte header of a token shard");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (map == MAP_FAILED) fail(path, ": cannot map: ", std::strerror(err));
  TokenShard s;
  s.path_ = path;
  s.map_ = map;
  s.map_bytes_ = size;

  RawHeader h;
  std::memcpy(&h, map, sizeof h);
  if (std::memcmp(h.magic, kTokenShardMagic, sizeof h.magic) != 0)
    fail(path, ": not a shardtrain token shard (the magic is not STTOKENS; an unfinished or foreign file)");
  if (h.version != kTokenShardVersion)
    fail(path, ": token shard format version ", h.version, "; this build reads version ", kTokenShardVersion);
  if (h.header_bytes != kTokenShardHeaderBytes || h.token_bytes != sizeof(uint32_t) || h.vocab_size == 0)
    fail(path, ": corrupt header (header size ", h.header_bytes, ", bytes per token ", h.token_bytes, ", vocab size ",
         h.vocab_size, ")");
  const uint64_t payload = size - kTokenShardHeaderBytes;
  if (h.tokens > payload / sizeof(uint32_t))
    fail(path, ": truncated: the header counts ", h.tokens, " tokens (",
         static_cast<long double>(h.tokens) * 4 + kTokenShardHeaderBytes, " bytes) but the file has ", size, " bytes");
  if (payload != h.tokens * sizeof(uint32_t))
    fail(path, ": ", payload - h.tokens * sizeof(uint32_t), " bytes after the ", h.tokens,
         " tokens its header counts (corrupt)");
  s.ids_ = reinterpret_cast<const uint32_t*>(static_cast<const char*>(map) + kTokenShardHeaderBytes);
  s.tokens_ = h.tokens;
  s.vocab_ = h.vocab_size;
  s.checksum_ = h.xxh3_64;

  // One pass: every id below the limit (and the checksum, when asked), chunk by chunk.
  const uint64_t limit = vocab_limit > 0 ? std::min<uint64_t>(static_cast<uint64_t>(vocab_limit), h.vocab_size)
                                         : h.vocab_size;
  ::madvise(map, size, MADV_SEQUENTIAL);
  XXH3_state_t* state = verify_checksum ? XXH3_createState() : nullptr;
  if (state) XXH3_64bits_reset(state);
  for (uint64_t begin = 0; begin < s.tokens_; begin += kScanChunk) {
    const uint64_t n = std::min(kScanChunk, s.tokens_ - begin);
    const uint32_t* p = s.ids_ + begin;
    uint32_t mx = 0;
    for (uint64_t i = 0; i < n; ++i) mx = std::max(mx, p[i]);
    if (mx >= limit) {
      if (state) XXH3_freeState(state);
      const uint64_t at = begin + static_cast<uint64_t>(std::find_if(p, p + n, [&](uint32_t v) { return v >= limit; }) - p);
      const uint32_t id = s.ids_[at];
      if (id >= h.vocab_size)
        fail(path, ": token id ", id, " at token offset ", at, " is not below the vocabulary size ", h.vocab_size,
             " in its header (corrupt)");
      fail(path, ": token id ", id, " at token offset ", at, " is not below the model's vocab_size ", vocab_limit,
           " (the data was tokenized with a vocabulary of ", h.vocab_size, " ids; the model needs at least that many)");
    }
    if (state) XXH3_64bits_update(state, p, n * sizeof(uint32_t));
  }
  ::madvise(map, size, MADV_NORMAL);
  if (state) {
    const uint64_t got = XXH3_64bits_digest(state);
    XXH3_freeState(state);
    if (got != s.checksum_)
      fail(path, ": the XXH3-64 of its tokens is ", xxh3_64_hex(got), ", its header says ", xxh3_64_hex(s.checksum_),
           " (corrupt)");
  }
  return s;
}

uint64_t TokenShard::compute_checksum() const { return XXH3_64bits(ids_, tokens_ * sizeof(uint32_t)); }

// ---- index.json ---------------------------------------------------------------------

std::string token_index_json(const TokenIndex& x) {
  nlohmann::json shards = nlohmann::json::array(), inputs = nlohmann::json::array();
  for (const auto& s : x.shards) shards.push_back({{"file", s.file}, {"tokens", s.tokens}, {"xxh3_64", s.xxh3_64}});
  for (const auto& i : x.inputs) {
    nlohmann::json in = {{"path", i.path}, {"bytes", i.bytes}, {"documents", i.documents}, {"tokens", i.tokens}};
    if (i.skipped_lines) in["skipped_lines"] = i.skipped_lines;
    inputs.push_back(in);
  }
  nlohmann::ordered_json j;
  j["format"] = "shardtrain-tokens";
  j["version"] = kTokenShardVersion;
  j["tokenizer"] = {{"description", x.tokenizer}, {"dir", x.tokenizer_dir}};
  j["vocab_size"] = x.vocab_size;
  j["eos_id"] = x.eos_id;
  j["input_format"] = x.input_format;
  if (x.input_format == "jsonl") j["text_field"] = x.text_field;
  j["documents"] = x.documents;
  j["tokens"] = x.tokens;
  j["shard_tokens"] = x.shard_tokens;
  if (x.skipped_lines) j["skipped_lines"] = x.skipped_lines;
  j["shards"] = shards;
  j["inputs"] = inputs;
  return j.dump(2) + "\n";
}

bool is_prepared_token_dir(const std::string& dir) {
  std::error_code ec;
  const fs::path index = fs::path(dir) / kTokenIndexName;
  if (!fs::is_regular_file(index, ec)) return false;
  if (fs::exists(fs::path(dir) / "shard-00000.bin", ec)) return true;
  std::ifstream in(index, std::ios::binary);
  std::string head(512, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  return head.find("\"shardtrain-tokens\"") != std::string::npos;
}

TokenIndex read_token_index(const std::string& dir) {
  const std::string path = (fs::path(dir) / kTokenIndexName).string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("'", dir, "' is not a directory of prepared tokens (shardtrain data prepare writes one)");
  if (!fs::exists(path, ec))
    fail(path, ": not found; '", dir, "' is not a directory of prepared tokens (shardtrain data prepare writes one)");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot read: ", std::strerror(errno));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    fail(path, ": invalid JSON: ", e.what());
  }
  TokenIndex x;
  try {
    if (!j.is_object() || j.value("format", "") != "shardtrain-tokens")
      fail(path, ": not a shardtrain token index (format is not 'shardtrain-tokens')");
    if (j.at("version") != kTokenShardVersion)
      fail(path, ": token index version ", j.at("version").dump(), "; this build reads version ", kTokenShardVersion);
    x.tokenizer = j.at("tokenizer").at("description").get<std::string>();
    x.tokenizer_dir = j.at("tokenizer").at("dir").get<std::string>();
    x.vocab_size = integer_at<int64_t>(j, "vocab_size", path);
    x.eos_id = integer_at<int32_t>(j, "eos_id", path);
    x.input_format = j.at("input_format").get<std::string>();
    x.text_field = j.value("text_field", "");
    x.documents = integer_at<uint64_t>(j, "documents", path);
    x.tokens = integer_at<uint64_t>(j, "tokens", path);
    x.shard_tokens = integer_at<uint64_t>(j, "shard_tokens", path);
    if (j.contains("skipped_lines")) x.skipped_lines = integer_at<uint64_t>(j, "skipped_lines", path);
    for (const auto& s : j.at("shards"))
      x.shards.push_back({s.at("file").get<std::string>(), integer_at<uint64_t>(s, "tokens", path),
                          s.at("xxh3_64").get<std::string>()});
    for (const auto& i : j.at("inputs"))
      x.inputs.push_back({i.at("path").get<std::string>(), integer_at<uint64_t>(i, "bytes", path),
                          integer_at<uint64_t>(i, "documents", path), integer_at<uint64_t>(i, "tokens", path),
                          i.contains("skipped_lines") ? integer_at<uint64_t>(i, "skipped_lines", path) : 0});
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string msg = e.what();  // "[json.exception.out_of_range.403] key 'x' not found"
    if (const auto p = msg.find("] "); msg.rfind("[json.", 0) == 0 && p != std::string::npos) msg = msg.substr(p + 2);
    fail(path, ": ", msg);
  }
  ST_CHECK(x.vocab_size > 0 && x.vocab_size <= (int64_t{1} << 32), path, ": vocab_size ", x.vocab_size, " is out of range");
  ST_CHECK(x.eos_id >= 0 && x.eos_id < x.vocab_size, path, ": eos_id ", x.eos_id, " is not below vocab_size ", x.vocab_size);
  uint64_t sum = 0;
  for (const auto& s : x.shards) {
    ST_CHECK(!s.file.empty() && s.file.find('/') == std::string::npos && s.file != "." && s.file != "..", path,
             ": shard file name '", s.file, "' is not a plain name inside the directory");
    sum += s.tokens;
  }
  ST_CHECK(sum == x.tokens, path, ": the shards hold ", sum, " tokens in all, 'tokens' says ", x.tokens);
  return x;
}

TokenDataset TokenDataset::open(const std::string& dir, int64_t vocab_limit, bool verify_checksums) {
  // Whatever is wrong with the index or a shard is a data error (exit 3).
  return classify_errors(ErrorKind::Data, [&] {
    TokenDataset d;
    d.dir = dir;
    d.index = read_token_index(dir);
    for (const TokenIndexShard& e : d.index.shards) {
      const std::string p = (fs::path(dir) / e.file).string();
      TokenShard s = TokenShard::open(p, vocab_limit, verify_checksums);
      ST_CHECK(s.size() == e.tokens, p, ": holds ", s.size(), " tokens, ", kTokenIndexName, " says ", e.tokens);
      ST_CHECK(xxh3_64_hex(s.checksum()) == e.xxh3_64, p, ": checksum ", xxh3_64_hex(s.checksum()), " in its header, ",
               kTokenIndexName, " says ", e.xxh3_64, " (a shard from another preparation?)");
      ST_CHECK(static_cast<int64_t>(s.vocab_size()) == d.index.vocab_size, p, ": vocabulary size ", s.vocab_size(),
               " in its header, ", kTokenIndexName, " says ", d.index.vocab_size);
      d.shards.push_back(std::move(s));
    }
    return d;
  });
}

uint64_t TokenDataset::tokens() const {
  uint64_t n = 0;
  for (const auto& s : shards) n += s.size();
  return n;
}

std::vector<int32_t> TokenDataset::read(uint64_t offset, uint64_t n) const {
  std::vector<int32_t> out;
  out.reserve(n);
  for (const TokenShard& s : shards) {
    if (n == 0) break;
    if (offset >= s.size()) {
      offset -= s.size();
      continue;
    }
    const uint64_t take = std::min(n, s.size() - offset);
    for (uint64_t i = 0; i < take; ++i) out.push_back(s.at(offset + i));
    offset = 0;
    n -= take;
  }
  ST_CHECK(n == 0, dir, ": a read past the end of its ", tokens(), " tokens");
  return out;
}

}  // namespace st

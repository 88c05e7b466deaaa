#include "data/token_shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"
#include "data/source.h"
#include "core/files.h"
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
  for (const auto& i : x.inputs)
    inputs.push_back({{"path", i.path}, {"bytes", i.bytes}, {"documents", i.documents}, {"tokens", i.tokens}});
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
  j["shards"] = shards;
  j["inputs"] = inputs;
  return j.dump(2) + "\n";
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
    for (const auto& s : j.at("shards"))
      x.shards.push_back({s.at("file").get<std::string>(), integer_at<uint64_t>(s, "tokens", path),
                          s.at("xxh3_64").get<std::string>()});
    for (const auto& i : j.at("inputs"))
      x.inputs.push_back({i.at("path").get<std::string>(), integer_at<uint64_t>(i, "bytes", path),
                          integer_at<uint64_t>(i, "documents", path), integer_at<uint64_t>(i, "tokens", path)});
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

// ---- inputs -------------------------------------------------------------------------

namespace {

// `open`: the canonical paths of the directories being listed, so that a link back
// into one of them is named as a loop instead of recursing until the path is too long.
void collect(const fs::path& path, std::vector<std::string>& out, std::set<fs::path>& seen, std::vector<fs::path>& open,
             const std::string& what) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec.value() == ELOOP) fail_data(what, ": '", path.string(), "' is a symbolic link loop (", ec.message(), ")");
  if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory)
    fail_data(what, ": cannot read '", path.string(), "': ", ec.message());
  ST_CHECK_DATA(fs::exists(st), what, ": '", path.string(), "' does not exist");
  if (fs::is_directory(st)) {
    const fs::path canon = fs::canonical(path, ec);
    ST_CHECK_DATA(!ec, what, ": cannot resolve '", path.string(), "': ", ec.message());
    if (std::find(open.begin(), open.end(), canon) != open.end())
      fail_data(what, ": '", path.string(), "' leads back to '", canon.string(),
                "', a directory that contains it: a symbolic link loop (", std::strerror(ELOOP), ")");
    std::vector<fs::path> entries;
    for (const auto& e : fs::directory_iterator(path, ec)) entries.push_back(e.path());
    ST_CHECK_DATA(!ec, what, ": cannot list '", path.string(), "': ", ec.message());
    std::sort(entries.begin(), entries.end());
    open.push_back(canon);
    for (const auto& e : entries) collect(e, out, seen, open, what);
    open.pop_back();
    return;
  }
  if (!fs::is_regular_file(st)) return;
  const fs::path canon = fs::canonical(path, ec);
  if (seen.insert(ec ? path : canon).second) out.push_back(path.string());
}

}  // namespace

std::vector<std::string> collect_input_files(const std::vector<std::string>& paths, const std::string& what) {
  std::vector<std::string> files;
  std::set<fs::path> seen;
  std::vector<fs::path> open;
  for (const auto& p : paths) collect(p, files, seen, open, what);
  return files;
}

// ---- prepare ------------------------------------------------------------------------

namespace {

volatile std::sig_atomic_t g_prepare_signal = 0;
void on_prepare_signal(int sig) {
  if (g_prepare_signal != 0) std::signal(sig, SIG_DFL);  // a second signal kills
  g_prepare_signal = sig;
}

struct SignalGuard {
  void (*term)(int), (*intr)(int);
  SignalGuard() {
    g_prepare_signal = 0;
    term = std::signal(SIGTERM, on_prepare_signal);
    intr = std::signal(SIGINT, on_prepare_signal);
  }
  ~SignalGuard() {
    std::signal(SIGTERM, term);
    std::signal(SIGINT, intr);
  }
};

void check_signal() {
  if (const int sig = g_prepare_signal)
    throw Interrupted("data prepare: stopped by signal " + std::to_string(sig) + "; no output was written", sig);
}

struct Document {
  size_t input = 0;
  uint64_t line = 0;  // jsonl: 1-based line; text: 0
  uint64_t bytes = 0;
  std::string text;  // text: the file; jsonl: the raw line, parsed by a tokenizer thread
  std::vector<int32_t> ids;
  std::string error;  // the whole message, when the document failed
};

std::string where(const std::vector<std::string>& files, const Document& d) {
  return d.line ? files[d.input] + ":" + std::to_string(d.line) : files[d.input];
}

// The text of a JSONL line's field; errors name file:line.
std::string field_of(const std::string& line, const std::string& f, uint64_t n, const std::string& field) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    std::string msg = e.what();
    if (const auto p = msg.find("] "); p != std::string::npos) msg = msg.substr(p + 2);
    fail(f, ":", n, ": invalid JSON line: ", msg);
  }
  if (!j.is_object()) fail(f, ":", n, ": the line is not a JSON object");
  const auto it = j.find(field);
  if (it == j.end()) fail(f, ":", n, ": no field \"", field, "\" (--text-field names the document's text)");
  if (!it->is_string()) fail(f, ":", n, ": field \"", field, "\" is ", it->type_name(), ", not a string");
  return it->get<std::string>();
}

// Documents in input order: a text file is one; a JSONL line is one (blank lines skipped).
class DocumentReader {
 public:
  DocumentReader(const std::vector<std::string>& files, const PrepareOptions& o) : files_(files), o_(o) {}

  bool next(Document& d) {
    for (;;) {
      if (file_ >= files_.size()) return false;
      const std::string& f = files_[file_];
      if (o_.format == "text") {
        d.input = file_;
        d.line = 0;
        d.text = read_file(f);
        d.bytes = d.text.size();
        ++file_;
        return true;
      }
      if (!in_.is_open()) {
        in_.open(f, std::ios::binary);
        if (!in_) fail("data prepare: cannot read '", f, "': ", std::strerror(errno));
        line_ = 0;
      }
      std::string line;
      if (!std::getline(in_, line)) {
        if (in_.bad()) fail("data prepare: read error in '", f, "' after line ", line_);
        in_.close();
        in_.clear();
        ++file_;
        continue;
      }
      ++line_;
      const uint64_t raw = line.size() + 1;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t\r\n") == std::string::npos) {
        skipped_bytes_ += raw;
        continue;
      }
      d.input = file_;
      d.line = line_;
      d.bytes = raw + std::exchange(skipped_bytes_, 0);
      d.text = std::move(line);
      return true;
    }
  }

 private:
  static std::string read_file(const std::string& f) {
    std::ifstream in(f, std::ios::binary);
    if (!in) fail("data prepare: cannot read '", f, "': ", std::strerror(errno));
    std::string s;
    in.seekg(0, std::ios::end);
    const auto n = in.tellg();
    if (n > 0) {
      s.resize(static_cast<size_t>(n));
      in.seekg(0);
      in.read(s.data(), n);
    }
    if (!in) fail("data prepare: cannot read '", f, "': ", std::strerror(errno));
    return s;
  }

  const std::vector<std::string>& files_;
  const PrepareOptions& o_;
  size_t file_ = 0;
  std::ifstream in_;
  uint64_t line_ = 0, skipped_bytes_ = 0;
};

// Tokenizer threads that live for the whole preparation (so their caches stay warm):
// batches of documents go in, in order; the oldest comes out once all of its documents
// are encoded, while the calling thread reads the next batches and writes the last.
class EncoderPool {
 public:
  EncoderPool(int threads, const PrepareOptions& o, const std::vector<std::string>& files) : o_(o), files_(files) {
    for (int t = 0; t < threads; ++t) workers_.emplace_back([this] { work(); });
  }
  ~EncoderPool() {
    {
      std::lock_guard lk(m_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  size_t in_flight() const { return queue_.size(); }  // the caller's thread only
  void submit(std::vector<Document> docs, uint64_t bytes) {
    auto b = std::make_unique<Work>();
    b->docs = std::move(docs);
    b->bytes = bytes;
    {
      std::lock_guard lk(m_);
      queue_.push_back(std::move(b));
    }
    work_cv_.notify_all();
  }
  // The oldest batch, once encoded; st::Interrupted on a signal while waiting.
  std::vector<Document> take(uint64_t& bytes) {
    std::unique_lock lk(m_);
    Work& front = *queue_.front();
    while (front.done < front.docs.size()) {
      lk.unlock();
      check_signal();
      lk.lock();
      done_cv_.wait_for(lk, std::chrono::milliseconds(100), [&] { return front.done == front.docs.size(); });
    }
    std::vector<Document> docs = std::move(front.docs);
    bytes = front.bytes;
    queue_.pop_front();
    return docs;
  }

 private:
  struct Work {
    std::vector<Document> docs;
    uint64_t bytes = 0;
    size_t next = 0, done = 0;
  };
  void work() {
    std::unique_lock lk(m_);
    for (;;) {
      Work* w = nullptr;
      work_cv_.wait(lk, [&] {
        if (stop_) return true;
        for (auto& b : queue_)
          if (b->next < b->docs.size()) {
            w = b.get();
            return true;
          }
        return false;
      });
      if (stop_) return;
      Document& d = w->docs[w->next++];
      lk.unlock();
      if (!g_prepare_signal) encode(d);
      lk.lock();
      if (++w->done == w->docs.size()) done_cv_.notify_all();
    }
  }

  void encode(Document& d) const {
    try {
      if (d.line) d.text = field_of(d.text, files_[d.input], d.line, o_.text_field);
    } catch (const std::exception& e) {
      d.error = e.what();
      return;
    }
    try {
      d.ids = o_.encode(d.text);
    } catch (const std::exception& e) {
      d.error = where(files_, d) + ": cannot tokenize: " + e.what();
    } catch (...) {
      d.error = where(files_, d) + ": cannot tokenize (unknown error)";
    }
    std::string().swap(d.text);
  }

  const PrepareOptions& o_;
  const std::vector<std::string>& files_;
  std::mutex m_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<std::unique_ptr<Work>> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

bool inside(const fs::path& child, const fs::path& parent) {
  auto c = child.begin(), p = parent.begin();
  for (; p != parent.end(); ++p, ++c)
    if (c == child.end() || *c != *p) return false;
  return true;
}

// The prepared files: shards split every shard_tokens tokens, no empty shard.
class ShardSink {
 public:
  ShardSink(std::string dir, const PrepareOptions& o, TokenIndex& index) : dir_(std::move(dir)), o_(o), index_(index) {}
  void append(const int32_t* ids, size_t n) {
    while (n > 0) {
      if (!writer_) {
        char name[32];
        std::snprintf(name, sizeof name, "shard-%05zu.bin", index_.shards.size());
        index_.shards.push_back({name, 0, ""});
        writer_ = std::make_unique<TokenShardWriter>((fs::path(dir_) / name).string(),
                                                     static_cast<uint32_t>(o_.vocab_size));
      }
      const size_t take = static_cast<size_t>(std::min<uint64_t>(n, o_.shard_tokens - writer_->tokens()));
      writer_->append(ids, take);
      ids += take;
      n -= take;
      if (writer_->tokens() == o_.shard_tokens) close();
    }
  }
  void close() {
    if (!writer_) return;
    index_.shards.back().tokens = writer_->tokens();
    index_.shards.back().xxh3_64 = xxh3_64_hex(writer_->finish());
    writer_.reset();
  }

 private:
  std::string dir_;
  const PrepareOptions& o_;
  TokenIndex& index_;
  std::unique_ptr<TokenShardWriter> writer_;
};

void write_prepared(const std::string& stage, const std::vector<std::string>& files, const PrepareOptions& o,
                    TokenIndex& index, const std::function<void(const PrepareProgress&)>& progress,
                    PrepareProgress& prog) {
  constexpr uint64_t kBatchBytes = 8ull << 20;
  constexpr size_t kBatchDocs = 8192;
  constexpr size_t kInFlight = 3;  // batches read ahead of the writer
  DocumentReader reader(files, o);
  ShardSink sink(stage, o, index);
  const double t0 = now_seconds();
  EncoderPool pool(o.threads, o, files);
  bool more = true;
  for (;;) {
    check_signal();
    while (more && pool.in_flight() < kInFlight) {
      std::vector<Document> batch;
      uint64_t bytes = 0;
      while (bytes < kBatchBytes && batch.size() < kBatchDocs) {
        Document d;
        if (!reader.next(d)) {
          more = false;
          break;
        }
        bytes += d.bytes;
        batch.push_back(std::move(d));
      }
      if (!batch.empty()) pool.submit(std::move(batch), bytes);
    }
    if (pool.in_flight() == 0) break;
    uint64_t bytes = 0;
    std::vector<Document> batch = pool.take(bytes);
    for (Document& d : batch) {
      if (!d.error.empty()) fail_data(d.error);
      d.ids.push_back(o.eos_id);
      try {
        sink.append(d.ids.data(), d.ids.size());
      } catch (const Error& e) {
        fail_as(e.kind(), where(files, d), ": ", e.what());
      }
      TokenIndexInput& in = index.inputs[d.input];
      ++in.documents;
      in.tokens += d.ids.size();
      ++index.documents;
      index.tokens += d.ids.size();
    }
    prog.bytes_done += bytes;
    prog.documents = index.documents;
    prog.tokens = index.tokens;
    prog.seconds = now_seconds() - t0;
    if (progress) progress(prog);
  }
  sink.close();
}

}  // namespace

TokenIndex prepare_token_shards(const PrepareOptions& o, const std::function<void(const PrepareProgress&)>& progress) {
  ST_CHECK_CONFIG(!o.inputs.empty(), "data prepare: give at least one --input file or directory");
  ST_CHECK_CONFIG(o.format == "text" || o.format == "jsonl", "data prepare: --format must be text or jsonl, got '", o.format, "'");
  ST_CHECK_CONFIG(!o.text_field.empty(), "data prepare: --text-field must not be empty");
  ST_CHECK_CONFIG(o.shard_tokens > 0, "data prepare: --shard-tokens must be positive");
  ST_CHECK_CONFIG(o.threads >= 1, "data prepare: --threads must be at least 1, got ", o.threads);
  ST_CHECK(static_cast<bool>(o.encode), "data prepare: no tokenizer");
  ST_CHECK(o.vocab_size > 0 && o.vocab_size <= (int64_t{1} << 32), "data prepare: the tokenizer's vocabulary size ",
           o.vocab_size, " is out of range");
  ST_CHECK(o.eos_id >= 0 && o.eos_id < o.vocab_size, "data prepare: the tokenizer's eos id ", o.eos_id,
           " is not below its vocabulary size ", o.vocab_size);
  ST_CHECK_CONFIG(!o.out.empty(), "data prepare: --out must name a directory");

  std::error_code ec;
  const fs::path final_dir = fs::absolute(o.out, ec).lexically_normal();
  const bool had = fs::exists(final_dir, ec);
  if (had) {
    ST_CHECK_CONFIG(fs::is_directory(final_dir, ec), "data prepare: '", o.out, "' exists and is not a directory");
    ST_CHECK_CONFIG(fs::is_empty(final_dir, ec) || o.force, "data prepare: '", o.out,
             "' is not empty; choose another directory or pass --force to replace it");
  }
  const std::vector<std::string> files = collect_input_files(o.inputs, "data prepare: --input");
  ST_CHECK_DATA(!files.empty(), "data prepare: no regular files found under --input ", o.inputs.front());
  if (had) {
    const fs::path out_canon = fs::canonical(final_dir, ec);
    for (const auto& f : files)
      ST_CHECK_CONFIG(!inside(fs::canonical(f, ec), out_canon), "data prepare: input '", f, "' lies inside --out '", o.out,
               "', which would be replaced");
  }

  TokenIndex index;
  index.tokenizer = o.tokenizer;
  index.tokenizer_dir = o.tokenizer_dir;
  index.vocab_size = o.vocab_size;
  index.eos_id = o.eos_id;
  index.input_format = o.format;
  index.text_field = o.text_field;
  index.shard_tokens = o.shard_tokens;
  PrepareProgress prog;
  for (const auto& f : files) {
    const uint64_t bytes = fs::file_size(f, ec);
    index.inputs.push_back({f, ec ? 0 : bytes, 0, 0});
    prog.bytes_total += ec ? 0 : bytes;
  }

  // Everything goes into a new directory beside `out`, which then takes its place.
  SignalGuard guard;
  replace_directory(o.out, "data prepare", [&](const std::string& stage) {
    write_prepared(stage, files, o, index, progress, prog);
    ST_CHECK_DATA(index.documents > 0, "data prepare: no documents in the inputs (", files.size(), " files)");
    write_text_atomic((fs::path(stage) / kTokenIndexName).string(), token_index_json(index));
  });
  return index;
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

// `data prepare` (prepare.h): the input files, the documents in them, the tokenizer
// threads and the shard files they fill, all staged beside `out` until they are complete.
#include "data/prepare.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/files.h"
#include "core/strings.h"

namespace st {
namespace fs = std::filesystem;

// ---- inputs -------------------------------------------------------------------------

namespace {

// `open`: the canonical paths of the directories being listed, so that a link back
// into one of them is named as a loop instead of recursing until the path is too long.
struct Walk {
  std::vector<std::string>& out;
  std::set<fs::path>& seen;
  std::vector<fs::path>& open;
  const std::string& what;
  PreparedDirs prepared;
  std::vector<std::string>* skipped;
};

void collect(const fs::path& path, Walk& w, bool named) {
  std::vector<std::string>& out = w.out;
  std::set<fs::path>& seen = w.seen;
  std::vector<fs::path>& open = w.open;
  const std::string& what = w.what;
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
    if (is_prepared_token_dir(path.string())) {
      if (w.prepared == PreparedDirs::Refuse)
        fail_config(what, ": '", path.string(), "' is a directory of prepared tokens (its ", kTokenIndexName,
                    " was written by shardtrain data prepare), not text; train on it with --data.source=tokens "
                    "(and a --model.vocab_size that holds its tokenizer's ids)");
      ST_CHECK_CONFIG(!named, what, " '", path.string(), "' is a directory of prepared tokens (its ", kTokenIndexName,
                      " was written by shardtrain data prepare), not text to tokenize");
      if (w.skipped) w.skipped->push_back(path.string());
      return;
    }
    std::vector<fs::path> entries;
    for (const auto& e : fs::directory_iterator(path, ec)) entries.push_back(e.path());
    ST_CHECK_DATA(!ec, what, ": cannot list '", path.string(), "': ", ec.message());
    std::sort(entries.begin(), entries.end());
    open.push_back(canon);
    for (const auto& e : entries) collect(e, w, false);
    open.pop_back();
    return;
  }
  if (!fs::is_regular_file(st)) return;
  const fs::path canon = fs::canonical(path, ec);
  if (seen.insert(ec ? path : canon).second) out.push_back(path.string());
}

}  // namespace

std::vector<std::string> collect_input_files(const std::vector<std::string>& paths, const std::string& what,
                                             PreparedDirs prepared, std::vector<std::string>* skipped) {
  std::vector<std::string> files;
  std::set<fs::path> seen;
  std::vector<fs::path> open;
  Walk w{files, seen, open, what, prepared, skipped};
  for (const auto& p : paths) collect(p, w, true);
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

// A JSONL line that --skip-bad-lines may leave out: the message, and the kind of fault
// it is counted under.
struct BadLine : std::runtime_error {
  std::string reason;
  BadLine(std::string why, const std::string& message) : std::runtime_error(message), reason(std::move(why)) {}
};

struct Document {
  size_t input = 0;
  uint64_t line = 0;  // jsonl: 1-based line; text: 0
  uint64_t bytes = 0;
  std::string text;  // text: the file; jsonl: the raw line, parsed by a tokenizer thread
  std::vector<int32_t> ids;
  std::string error;  // the whole message, when the document failed
  std::string bad;    // a line --skip-bad-lines may leave out: the kind of fault (BadLine)
};

std::string where(const std::vector<std::string>& files, const Document& d) {
  return d.line ? files[d.input] + ":" + std::to_string(d.line) : files[d.input];
}

// The text of a JSONL line's field; errors (BadLine) name file:line.
std::string field_of(const std::string& line, const std::string& f, uint64_t n, const std::string& field) {
  const std::string at = f + ":" + std::to_string(n) + ": ";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    std::string msg = e.what();
    if (const auto p = msg.find("] "); p != std::string::npos) msg = msg.substr(p + 2);
    throw BadLine(msg.find("UTF-8") != std::string::npos ? "invalid UTF-8" : "invalid JSON",
                  at + "invalid JSON line: " + msg);
  }
  if (!j.is_object()) throw BadLine("not a JSON object", at + "the line is not a JSON object");
  const auto it = j.find(field);
  if (it == j.end())
    throw BadLine("no field \"" + field + "\"",
                  at + "no field \"" + field + "\" (--text-field names the document's text)");
  if (!it->is_string())
    throw BadLine("field \"" + field + "\" not a string",
                  at + "field \"" + field + "\" is " + it->type_name() + ", not a string");
  return it->get<std::string>();
}

// What --skip-bad-lines left out: a count per kind of fault, and the first one's message.
struct Skips {
  std::map<std::string, uint64_t> by_reason;
  std::string first;
  void add(const Document& d) {
    ++by_reason[d.bad];
    if (first.empty()) first = d.error;
  }
  std::string summary(uint64_t total) const {
    std::vector<std::string> parts;
    for (const auto& [reason, n] : by_reason) parts.push_back(std::to_string(n) + " " + reason);
    return "data prepare: --skip-bad-lines left out " + std::to_string(total) + " line" + (total == 1 ? "" : "s") +
           " (" + join(parts, ", ") + "; counted in index.json); the first: " + first;
  }
};

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
    } catch (const BadLine& e) {
      d.error = e.what();
      d.bad = e.reason;
      std::string().swap(d.text);
      return;
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
                    PrepareProgress& prog, Skips& skips) {
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
      if (!d.error.empty() && !d.bad.empty() && o.skip_bad_lines) {
        skips.add(d);
        ++index.inputs[d.input].skipped_lines;
        ++index.skipped_lines;
        continue;
      }
      if (!d.error.empty())
        fail_data(d.error, d.bad.empty() ? "" : " (--skip-bad-lines leaves such lines out, counted)");
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

// A .jsonl file under --format text becomes one document holding JSON syntax: say so.
void warn_jsonl_as_text(const std::vector<std::string>& files, const std::string& format) {
  if (format != "text") return;
  std::vector<std::string> jsonl;
  for (const auto& f : files) {
    const std::string ext = fs::path(f).extension().string();
    if (ext == ".jsonl" || ext == ".ndjson") jsonl.push_back(f);
  }
  if (jsonl.empty()) return;
  log_warn("data prepare: " + std::to_string(jsonl.size()) + " input file" + (jsonl.size() == 1 ? "" : "s") +
           " named like JSON Lines ('" + jsonl.front() + "'" + (jsonl.size() > 1 ? ", ..." : "") +
           ") read under --format text: each file is one document, JSON syntax and all; pass --format jsonl "
           "to take one document per line (its --text-field)");
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
  // An --out inside an input directory would be read back by the next prepare over it.
  const fs::path out_canon = fs::weakly_canonical(final_dir, ec);
  for (const auto& in : o.inputs) {
    if (!fs::is_directory(in, ec)) continue;
    const fs::path in_canon = fs::canonical(in, ec);
    ST_CHECK_CONFIG(ec || out_canon == in_canon || !path_within(out_canon, in_canon), "data prepare: --out '", o.out, "' lies inside --input '", in,
                    "'; choose an --out outside the input directories");
  }
  std::vector<std::string> skipped;
  const std::vector<std::string> files =
      collect_input_files(o.inputs, "data prepare: --input", PreparedDirs::Skip, &skipped);
  for (const auto& d : skipped)
    log_info("data prepare: skipping '" + d + "', a directory of prepared tokens (" + kTokenIndexName + ")");
  ST_CHECK_DATA(!files.empty(), "data prepare: no regular files found under --input ", o.inputs.front());
  if (had) {
    for (const auto& f : files)
      ST_CHECK_CONFIG(!path_within(fs::canonical(f, ec), out_canon), "data prepare: input '", f, "' lies inside --out '", o.out,
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

  warn_jsonl_as_text(files, o.format);
  // What an earlier prepare to the same --out left when it was killed (kill -9).
  std::vector<std::string> removed, live;
  clean_stale_stages(o.out, removed, live);
  for (const auto& d : removed)
    log_info("data prepare: removed '" + d + "', left by an earlier prepare to this --out that was killed");
  for (const auto& d : live)
    log_warn("data prepare: leaving '" + d + "': its process is still running (another prepare to this --out?)");

  // Everything goes into a new directory beside `out`, which then takes its place.
  SignalGuard guard;
  Skips skips;
  replace_directory(o.out, "data prepare", [&](const std::string& stage) {
    write_prepared(stage, files, o, index, progress, prog, skips);
    ST_CHECK_DATA(index.documents > 0, "data prepare: no documents in the inputs (", files.size(), " files",
                  index.skipped_lines ? ", " + std::to_string(index.skipped_lines) + " bad lines left out" : "", ")");
    write_text_atomic((fs::path(stage) / kTokenIndexName).string(), token_index_json(index));
  });
  if (index.skipped_lines) log_warn(skips.summary(index.skipped_lines));
  return index;
}

}  // namespace st

// shardtrain data prepare | inspect: text -> token shards (data/prepare.h), and
// a look at what a prepared directory holds (data/token_shards.h).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "data/prepare.h"
#include "data/token_shards.h"
#include "data/tokenizer.h"

namespace st {
namespace {
namespace fs = std::filesystem;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// A one-line bar on a terminal: bytes of input read, MB/s, documents and tokens.
class PrepareBar {
 public:
  PrepareBar() : enabled_(isatty(STDOUT_FILENO) != 0) {}
  void update(const PrepareProgress& p) {
    if (!enabled_) return;
    const double now = now_seconds();
    if (drawn_ && now - last_ < 0.1 && p.bytes_done < p.bytes_total) return;
    last_ = now;
    constexpr int kWidth = 30;
    const double frac = p.bytes_total ? std::min(1.0, static_cast<double>(p.bytes_done) / p.bytes_total) : 1.0;
    const int filled = static_cast<int>(frac * kWidth);
    std::string bar(filled, '#');
    bar.append(kWidth - filled, '.');
    const double mbs = p.seconds > 0 ? p.bytes_done / 1e6 / p.seconds : 0;
    const double eta = mbs > 0 ? (p.bytes_total - p.bytes_done) / 1e6 / mbs : 0;
    std::printf("\r\033[K[%s] %.1f/%.1f MB %.2f MB/s %s docs %s tokens eta %.0fs", bar.c_str(), p.bytes_done / 1e6,
                p.bytes_total / 1e6, mbs, human_count(static_cast<double>(p.documents)).c_str(),
                human_count(static_cast<double>(p.tokens)).c_str(), eta);
    std::fflush(stdout);
    drawn_ = true;
  }
  void clear() {
    if (!drawn_) return;
    std::printf("\r\033[K");
    std::fflush(stdout);
    drawn_ = false;
  }
  ~PrepareBar() { clear(); }

 private:
  bool enabled_, drawn_ = false;
  double last_ = 0;
};

int run_prepare(PrepareOptions o, const std::string& tokenizer_dir) {
  if (o.threads <= 0) o.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const double t_load = now_seconds();
  const Tokenizer tok = Tokenizer::load(tokenizer_dir);
  std::error_code ec;
  o.tokenizer = tok.describe();
  o.tokenizer_dir = fs::absolute(tokenizer_dir, ec).lexically_normal().string();
  o.vocab_size = tok.vocab_size();
  o.eos_id = tok.eos_id();
  o.encode = [&tok](std::string_view text) { return tok.encode(text); };
  std::printf("tokenizer: %s (loaded in %.2fs), eos %d\n", o.tokenizer.c_str(), now_seconds() - t_load, o.eos_id);
  std::fflush(stdout);
  PrepareBar bar;
  PrepareProgress last;
  const TokenIndex x = prepare_token_shards(o, [&](const PrepareProgress& p) {
    last = p;
    bar.update(p);
  });
  bar.clear();
  const double mbs = last.seconds > 0 ? last.bytes_done / 1e6 / last.seconds : 0;
  const std::string skipped =
      x.skipped_lines ? ", " + std::to_string(x.skipped_lines) + " bad line" + (x.skipped_lines == 1 ? "" : "s") + " left out"
                      : "";
  std::printf("prepared %s: %llu documents from %zu files%s, %llu tokens in %zu shard%s (%s of text in %.2fs, "
              "%.2f MB/s, %s tokens/s, %d thread%s)\n",
              o.out.c_str(), static_cast<unsigned long long>(x.documents), x.inputs.size(), skipped.c_str(),
              static_cast<unsigned long long>(x.tokens), x.shards.size(), x.shards.size() == 1 ? "" : "s",
              human_bytes(static_cast<double>(last.bytes_done)).c_str(), last.seconds, mbs,
              human_count(last.seconds > 0 ? x.tokens / last.seconds : 0).c_str(), o.threads, o.threads == 1 ? "" : "s");
  return 0;
}

struct InspectOptions {
  std::string dir, tokenizer;
  bool verify = false;
  int64_t sample = 0;
  uint64_t offset = 0;
};

int run_inspect(const InspectOptions& o) {
  const double t0 = now_seconds();
  const TokenDataset d = TokenDataset::open(o.dir, 0, true);
  const double open_s = now_seconds() - t0;
  const TokenIndex& x = d.index;
  uint64_t input_bytes = 0;
  for (const auto& in : x.inputs) input_bytes += in.bytes;
  std::printf("%s\n", o.dir.c_str());
  std::printf("  tokenizer   %s\n", x.tokenizer.c_str());
  std::printf("  vocab       %lld ids, eos %d\n", static_cast<long long>(x.vocab_size), x.eos_id);
  std::printf("  inputs      %zu files, %s, format %s%s\n", x.inputs.size(),
              human_bytes(static_cast<double>(input_bytes)).c_str(), x.input_format.c_str(),
              x.input_format == "jsonl" ? (" (field \"" + x.text_field + "\")").c_str() : "");
  std::printf("  documents   %llu (%.1f tokens each on average, eos included)\n",
              static_cast<unsigned long long>(x.documents),
              x.documents ? static_cast<double>(x.tokens) / x.documents : 0.0);
  std::printf("  tokens      %llu (%s), %s per input byte\n", static_cast<unsigned long long>(x.tokens),
              human_count(static_cast<double>(x.tokens)).c_str(),
              input_bytes ? fmt("%.3f", static_cast<double>(x.tokens) / input_bytes).c_str() : "-");
  std::printf("  shards      %zu of at most %llu tokens\n", d.shards.size(),
              static_cast<unsigned long long>(x.shard_tokens));
  for (size_t i = 0; i < d.shards.size(); ++i)
    std::printf("    %-18s %12llu tokens  %10s  xxh3-64 %s\n", x.shards[i].file.c_str(),
                static_cast<unsigned long long>(d.shards[i].size()),
                human_bytes(static_cast<double>(d.shards[i].size() * 4 + kTokenShardHeaderBytes)).c_str(),
                x.shards[i].xxh3_64.c_str());
  const double gb = d.tokens() * 4 / 1e9;
  std::printf("  checked     every header, id (below %lld) and XXH3-64 checksum: %.2f GB in %.2fs (%.2f GB/s)\n",
              static_cast<long long>(x.vocab_size), gb, open_s, open_s > 0 ? gb / open_s : 0.0);
  if (o.verify) {
    // The documents: each ends with eos (a document's text may hold the eos token's
    // own text, which the tokenizer turns into eos too: more eos than documents is fine).
    uint64_t eos = 0, in_docs = 0, in_tokens = 0;
    for (const TokenShard& s : d.shards)
      for (uint64_t i = 0; i < s.size(); ++i) eos += s.data()[i] == static_cast<uint32_t>(x.eos_id);
    for (const auto& in : x.inputs) {
      in_docs += in.documents;
      in_tokens += in.tokens;
    }
    ST_CHECK(in_docs == x.documents && in_tokens == x.tokens, o.dir, "/", kTokenIndexName, ": its inputs hold ",
             in_docs, " documents and ", in_tokens, " tokens, its totals say ", x.documents, " and ", x.tokens);
    ST_CHECK(d.tokens() > 0 && d.read(d.tokens() - 1, 1)[0] == x.eos_id, o.dir, ": the last token is not eos");
    ST_CHECK(eos >= x.documents, o.dir, ": ", eos, " eos tokens, fewer than the ", x.documents, " documents");
    std::printf("  verified    %llu eos tokens for %llu documents (%llu inside documents), the inputs' counts\n",
                static_cast<unsigned long long>(eos), static_cast<unsigned long long>(x.documents),
                static_cast<unsigned long long>(eos - x.documents));
  }

  if (o.sample > 0) {
    const std::string tdir = o.tokenizer.empty() ? x.tokenizer_dir : o.tokenizer;
    ST_CHECK(o.offset < d.tokens(), "data inspect: --offset ", o.offset, " is past the end of the ", d.tokens(),
             " tokens");
    const uint64_t n = std::min<uint64_t>(static_cast<uint64_t>(o.sample), d.tokens() - o.offset);
    const std::vector<int32_t> ids = d.read(o.offset, n);
    Tokenizer tok = [&] {
      try {
        return Tokenizer::load(tdir);
      } catch (const Error& e) {
        fail("data inspect: cannot load the tokenizer to decode the sample (", e.what(),
             "); give another with --tokenizer DIR");
      }
    }();
    if (tok.vocab_size() != x.vocab_size)
      log_warn("the tokenizer in " + tdir + " has " + std::to_string(tok.vocab_size()) + " ids, the data was prepared with " +
               std::to_string(x.vocab_size));
    std::printf("\ntokens [%llu, %llu):", static_cast<unsigned long long>(o.offset),
                static_cast<unsigned long long>(o.offset + n));
    for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i % 16 == 0 ? "\n  " : " ", ids[i]);
    std::printf("\ndecoded (%s):\n-----\n%s\n-----\n", tdir.c_str(), tok.decode(ids).c_str());
  }
  return 0;
}

}  // namespace

Command add_data_command(CLI::App& root) {
  CLI::App* app = root.add_subcommand(
      "data",
      "Real data: tokenize text into token shards (`data prepare`) for data.source = \"tokens\",\n"
      "and look at a prepared directory (`data inspect`). docs/operations.md describes the format.");
  app->require_subcommand(1);

  auto p = std::make_shared<PrepareOptions>();
  p->threads = 0;
  auto tokenizer_dir = std::make_shared<std::string>();
  CLI::App* prep = app->add_subcommand(
      "prepare",
      "Tokenize documents into token shards. A text file is one document (--format text); a JSONL\n"
      "line is one document, its --text-field (--format jsonl). Each document is followed by the\n"
      "tokenizer's eos. Directories are read recursively in name order. The output is the same\n"
      "bytes whatever --threads; it is written beside --out and renamed into place at the end.");
  prep->add_option("--tokenizer", *tokenizer_dir, "Hugging Face tokenizer directory (tokenizer.json, or vocab.json + merges.txt)")
      ->required()
      ->check(CLI::ExistingDirectory);
  prep->add_option("--input", p->inputs, "input files or directories (several allowed)")->required()->expected(1, -1);
  prep->add_option("--format", p->format, "text: a file is a document; jsonl: a line is a document")
      ->check(CLI::IsMember({"text", "jsonl"}))
      ->capture_default_str();
  prep->add_option("--text-field", p->text_field, "jsonl: the field holding a document's text")->capture_default_str();
  prep->add_option("--out", p->out, "output directory (must be new or empty, unless --force)")->required();
  prep->add_option("--shard-tokens", p->shard_tokens, "tokens per shard file")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  prep->add_option("--threads", p->threads, "tokenizer threads; 0 = one per core")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  prep->add_flag("--force", p->force, "replace a non-empty --out whole");
  prep->add_flag("--skip-bad-lines", p->skip_bad_lines,
                 "jsonl: leave out lines that are not a JSON object with a string --text-field (invalid JSON or "
                 "UTF-8 included), counted in index.json and reported, instead of stopping at the first");

  auto in = std::make_shared<InspectOptions>();
  CLI::App* insp = app->add_subcommand(
      "inspect",
      "Counts of a prepared directory (tokenizer, documents, tokens, shards). Every header, id\n"
      "and checksum is checked, as training does at open; --verify also counts the eos tokens\n"
      "against the documents. --sample K decodes K tokens from --offset with the tokenizer\n"
      "recorded in index.json (or --tokenizer).");
  insp->add_option("dir", in->dir, "prepared directory")->required();
  insp->add_flag("--verify", in->verify, "also count eos tokens against the documents and the inputs' counts");
  insp->add_option("--sample", in->sample, "decode this many tokens")->check(CLI::NonNegativeNumber);
  insp->add_option("--offset", in->offset, "where the sample starts (token offset in the concatenated shards)")
      ->capture_default_str();
  insp->add_option("--tokenizer", in->tokenizer, "tokenizer directory for the sample (default: the one in index.json)");

  return {app, [=] {
            if (prep->parsed()) return run_prepare(*p, *tokenizer_dir);
            return run_inspect(*in);
          }};
}

}  // namespace st

// Token shards (data/token_shards.h), `data prepare` / `data inspect`, and
// data.source = "tokens". The library tests use a byte-level encoder (id = byte,
// eos = 256); the CLI tests use the real Qwen2.5 tokenizer from ../shared and skip
// where it is absent.
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "data/source.h"
#include "data/token_shards.h"
#include "support/shell.h"

namespace st {
namespace {
namespace fs = std::filesystem;

// Removes the test directories when the process ends.
class TempDirs : public ::testing::Environment {
 public:
  static std::vector<fs::path>& made() {
    static std::vector<fs::path> v;
    return v;
  }
  void TearDown() override {
    std::error_code ec;
    for (const auto& p : made()) fs::remove_all(p, ec);
  }
};
const auto* const kTempDirs = ::testing::AddGlobalTestEnvironment(new TempDirs);

fs::path temp_dir(const std::string& name) {
  // One directory per process: ctest runs the tests of this file in parallel.
  fs::path p = fs::path(::testing::TempDir()) / ("st_tokens_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  TempDirs::made().push_back(p);
  return p;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void spit(const fs::path& p, const std::string& s) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << s;
}

// Expects `f` to throw st::Error whose message holds every one of `parts`.
template <class F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << "\nmissing: " << p;
  }
}

void write_shard(const fs::path& p, const std::vector<int32_t>& ids, uint32_t vocab) {
  TokenShardWriter w(p.string(), vocab);
  w.append(ids.data(), ids.size());
  w.finish();
}

void patch(const fs::path& p, size_t offset, const void* bytes, size_t n) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(n));
}

// ---- the format ------------------------------------------------------------------

TEST(TokenShard, RoundTrip) {
  const fs::path dir = temp_dir("roundtrip");
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < 300000; ++i) ids.push_back(static_cast<int32_t>((i * 7919) % 1000));
  write_shard(dir / "a.bin", ids, 1000);
  EXPECT_EQ(fs::file_size(dir / "a.bin"), 64 + 4 * ids.size());
  const std::string raw = slurp(dir / "a.bin");
  EXPECT_EQ(raw.substr(0, 8), "STTOKENS");
  // Little-endian uint32 ids right after the header.
  EXPECT_EQ(static_cast<uint8_t>(raw[64 + 4 * 3]), (3 * 7919) % 1000 & 0xff);

  for (bool verify : {false, true}) {
    const TokenShard s = TokenShard::open((dir / "a.bin").string(), 0, verify);
    EXPECT_EQ(s.size(), ids.size());
    EXPECT_EQ(s.vocab_size(), 1000u);
    EXPECT_EQ(s.compute_checksum(), s.checksum());
    for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(s.at(i), ids[i]) << i;
  }
  // An empty shard is valid too.
  write_shard(dir / "empty.bin", {}, 5);
  EXPECT_EQ(TokenShard::open((dir / "empty.bin").string(), 0, true).size(), 0u);
  EXPECT_EQ(xxh3_64_hex(0x1234), "0000000000001234");
}

TEST(TokenShard, BadFilesAreErrorsNamingTheFile) {
  const fs::path dir = temp_dir("bad");
  std::vector<int32_t> ids(1000);
  for (int i = 0; i < 1000; ++i) ids[i] = i % 100;
  const fs::path good = dir / "good.bin";
  write_shard(good, ids, 100);
  const auto open = [](const fs::path& p, int64_t limit = 0, bool verify = false) {
    return [=] { TokenShard::open(p.string(), limit, verify); };
  };

  // Truncated in the tokens, and inside the header.
  fs::copy_file(good, dir / "cut.bin");
  fs::resize_file(dir / "cut.bin", fs::file_size(good) - 2);
  expect_error(open(dir / "cut.bin"), {"cut.bin", "truncated", "1000 tokens"});
  fs::copy_file(good, dir / "stub.bin");
  fs::resize_file(dir / "stub.bin", 10);
  expect_error(open(dir / "stub.bin"), {"stub.bin", "truncated", "10 bytes"});
  // Bytes after the tokens.
  fs::copy_file(good, dir / "long.bin");
  { std::ofstream(dir / "long.bin", std::ios::app | std::ios::binary) << "xyzw"; }
  expect_error(open(dir / "long.bin"), {"long.bin", "4 bytes after"});
  // Wrong magic; a writer that never finished leaves a zero header, refused the same way.
  fs::copy_file(good, dir / "magic.bin");
  patch(dir / "magic.bin", 0, "NOTTOKEN", 8);
  expect_error(open(dir / "magic.bin"), {"magic.bin", "not a shardtrain token shard"});
  {
    TokenShardWriter w((dir / "unfinished.bin").string(), 100);
    w.append(ids.data(), ids.size());
  }
  expect_error(open(dir / "unfinished.bin"), {"unfinished.bin", "not a shardtrain token shard"});
  // Version.
  fs::copy_file(good, dir / "version.bin");
  const uint32_t v7 = 7;
  patch(dir / "version.bin", 8, &v7, 4);
  expect_error(open(dir / "version.bin"), {"version.bin", "version 7"});
  // An id at or above the model's vocabulary: file and token offset.
  expect_error(open(good, 50), {"good.bin", "token id 50 at token offset 50", "vocab_size 50"});
  EXPECT_NO_THROW(TokenShard::open(good.string(), 100));
  EXPECT_NO_THROW(TokenShard::open(good.string(), 5000));  // the header's vocab bounds it anyway
  // An id at or above the header's own vocabulary: corrupt.
  fs::copy_file(good, dir / "id.bin");
  const uint32_t big = 100;
  patch(dir / "id.bin", 64 + 4 * 777, &big, 4);
  expect_error(open(dir / "id.bin"), {"id.bin", "token id 100 at token offset 777", "corrupt"});
  // A changed id still in range: only the checksum sees it.
  fs::copy_file(good, dir / "flip.bin");
  const uint32_t other = 3;
  patch(dir / "flip.bin", 64 + 4 * 10, &other, 4);
  EXPECT_NO_THROW(TokenShard::open((dir / "flip.bin").string(), 0, false));
  expect_error(open(dir / "flip.bin", 0, true), {"flip.bin", "XXH3-64", "corrupt"});
  // Missing file.
  expect_error(open(dir / "nope.bin"), {"nope.bin", "cannot open"});
  // The writer refuses ids outside the vocabulary.
  TokenShardWriter w((dir / "w.bin").string(), 10);
  const int32_t bad[] = {1, 2, 10};
  expect_error([&] { w.append(bad, 3); }, {"w.bin", "token id 10 at token offset 2"});
}

TEST(WindowPermutation, IsABijectionKeyedBySeed) {
  for (uint64_t n : {1ull, 2ull, 3ull, 5ull, 17ull, 1000ull, 4097ull, 65536ull}) {
    const WindowPermutation p(n, 42);
    std::vector<bool> hit(n, false);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t v = p(i);
      ASSERT_LT(v, n);
      ASSERT_FALSE(hit[v]) << "n=" << n << " i=" << i;
      hit[v] = true;
    }
  }
  const WindowPermutation a(1000, 1), b(1000, 2);
  int same = 0, fixed = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    same += a(i) == b(i);
    fixed += a(i) == i;
  }
  EXPECT_LT(same, 20);
  EXPECT_LT(fixed, 20);
  EXPECT_EQ(WindowPermutation(1ull << 40, 9)(123456789), WindowPermutation(1ull << 40, 9)(123456789));
}

// ---- prepare (library, byte-level encoder) -----------------------------------------

PrepareOptions byte_options(const fs::path& out, std::vector<std::string> inputs) {
  PrepareOptions o;
  o.inputs = std::move(inputs);
  o.out = out.string();
  o.encode = [](std::string_view s) {
    std::vector<int32_t> ids;
    for (unsigned char c : s) ids.push_back(c);
    return ids;
  };
  o.tokenizer = "bytes";
  o.tokenizer_dir = "/nowhere";
  o.vocab_size = 257;
  o.eos_id = 256;
  return o;
}

std::vector<int32_t> stream_of(const TokenDataset& d) { return d.read(0, d.tokens()); }

TEST(Prepare, TextFilesAreDocumentsInNameOrder) {
  const fs::path dir = temp_dir("prep_text");
  spit(dir / "in" / "b.txt", "bravo");
  spit(dir / "in" / "a.txt", "alpha");
  spit(dir / "in" / "sub" / "c.txt", "charlie!");
  spit(dir / "extra.txt", "zz");
  PrepareOptions o = byte_options(dir / "out", {(dir / "in").string(), (dir / "extra.txt").string()});
  o.shard_tokens = 7;
  const TokenIndex x = prepare_token_shards(o);
  EXPECT_EQ(x.documents, 4u);
  EXPECT_EQ(x.tokens, 5u + 5 + 8 + 2 + 4);
  EXPECT_EQ(x.shards.size(), 4u);  // 24 tokens in shards of 7: 7 7 7 3
  const TokenDataset d = TokenDataset::open((dir / "out").string(), 0, true);
  std::vector<int32_t> want;
  for (std::string s : {"alpha", "bravo", "charlie!", "zz"}) {
    for (unsigned char c : s) want.push_back(c);
    want.push_back(256);
  }
  EXPECT_EQ(stream_of(d), want);
  EXPECT_EQ(d.index.inputs.size(), 4u);
  EXPECT_EQ(d.index.inputs[2].path, (dir / "in" / "sub" / "c.txt").string());
  EXPECT_EQ(d.index.inputs[2].tokens, 9u);
  EXPECT_EQ(d.index.tokenizer, "bytes");
  EXPECT_EQ(d.index.eos_id, 256);
  // Nothing but the shards and the index, and no staging directory beside it.
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir / "out")) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"index.json", "shard-00000.bin", "shard-00001.bin", "shard-00002.bin",
                                          "shard-00003.bin"}));
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

TEST(Prepare, JsonlLinesAreDocumentsAndBadLinesAreNamed) {
  const fs::path dir = temp_dir("prep_jsonl");
  spit(dir / "in" / "a.jsonl", "{\"text\": \"hi\", \"id\": 1}\n\n{\"text\": \"yo\\n\"}\r\n");
  spit(dir / "in" / "b.jsonl", "{\"body\": \"x\", \"text\": \"\"}");  // no final newline
  PrepareOptions o = byte_options(dir / "out", {(dir / "in").string()});
  o.format = "jsonl";
  const TokenIndex x = prepare_token_shards(o);
  EXPECT_EQ(x.documents, 3u);
  const TokenDataset d = TokenDataset::open((dir / "out").string());
  EXPECT_EQ(stream_of(d), (std::vector<int32_t>{'h', 'i', 256, 'y', 'o', '\n', 256, 256}));
  EXPECT_EQ(d.index.inputs[0].documents, 2u);

  // Another field.
  o.text_field = "body";
  o.out = (dir / "out2").string();
  expect_error([&] { prepare_token_shards(o); }, {"a.jsonl:1", "no field \"body\""});
}

TEST(Prepare, BadJsonlLeavesNoOutput) {
  const fs::path dir = temp_dir("prep_badjsonl");
  spit(dir / "a.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"fine\"}\n{\"text\": oops}\n");
  spit(dir / "b.jsonl", "{\"text\": \"ok\"}\n[1, 2]\n");
  spit(dir / "c.jsonl", "{\"content\": \"ok\"}\n");
  spit(dir / "d.jsonl", "{\"text\": 5}\n");
  const auto run = [&](const std::string& file) {
    return [&, file] {
      PrepareOptions o = byte_options(dir / "out", {(dir / file).string()});
      o.format = "jsonl";
      o.shard_tokens = 2;  // shards already written when the error comes
      prepare_token_shards(o);
    };
  };
  expect_error(run("a.jsonl"), {"a.jsonl:3", "invalid JSON"});
  expect_error(run("b.jsonl"), {"b.jsonl:2", "not a JSON object"});
  expect_error(run("c.jsonl"), {"c.jsonl:1", "no field \"text\""});
  expect_error(run("d.jsonl"), {"d.jsonl:1", "\"text\" is number"});
  EXPECT_FALSE(fs::exists(dir / "out"));
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  // A missing input is named.
  PrepareOptions o = byte_options(dir / "out", {(dir / "missing.txt").string()});
  expect_error([&] { prepare_token_shards(o); }, {"missing.txt", "does not exist"});
  // A tokenizer error names the document.
  o = byte_options(dir / "out", {(dir / "a.jsonl").string()});
  o.encode = [](std::string_view s) -> std::vector<int32_t> {
    if (s.find("oops") != std::string_view::npos) throw Error("cannot");
    return {1};
  };
  expect_error([&] { prepare_token_shards(o); }, {"a.jsonl", "cannot tokenize"});
  // An encoder that returns an id outside its vocabulary names the document and the shard.
  o.encode = [](std::string_view) { return std::vector<int32_t>{300}; };
  expect_error([&] { prepare_token_shards(o); }, {"a.jsonl", "token id 300", "shard-00000.bin"});
  EXPECT_FALSE(fs::exists(dir / "out"));
}

TEST(Prepare, RefusesANonEmptyOutUnlessForcedThenReplacesItWhole) {
  const fs::path dir = temp_dir("prep_force");
  spit(dir / "in.txt", "some text");
  spit(dir / "out" / "old.txt", "old");
  PrepareOptions o = byte_options(dir / "out", {(dir / "in.txt").string()});
  expect_error([&] { prepare_token_shards(o); }, {"out", "not empty", "--force"});
  EXPECT_TRUE(fs::exists(dir / "out" / "old.txt"));
  o.force = true;
  prepare_token_shards(o);
  EXPECT_FALSE(fs::exists(dir / "out" / "old.txt"));
  EXPECT_TRUE(fs::exists(dir / "out" / "index.json"));
  // An input inside --out is refused even with --force.
  o.inputs = {(dir / "out").string()};
  expect_error([&] { prepare_token_shards(o); }, {"inside --out"});
  // An existing empty directory is fine.
  fs::create_directories(dir / "empty");
  o = byte_options(dir / "empty", {(dir / "in.txt").string()});
  EXPECT_NO_THROW(prepare_token_shards(o));
}

TEST(Prepare, OutputIsTheSameBytesForAnyThreadCount) {
  const fs::path dir = temp_dir("prep_threads");
  std::string big;
  for (int f = 0; f < 40; ++f) {
    std::string s;
    for (int i = 0; i < 1000 + f * 97; ++i) s += static_cast<char>('a' + (i * f) % 26);
    spit(dir / "in" / ("f" + std::to_string(100 + f) + ".txt"), s);
  }
  std::map<int, std::map<std::string, std::string>> files;
  for (int threads : {1, 4}) {
    PrepareOptions o = byte_options(dir / ("out" + std::to_string(threads)), {(dir / "in").string()});
    o.threads = threads;
    o.shard_tokens = 10000;
    prepare_token_shards(o);
    for (const auto& e : fs::directory_iterator(o.out)) files[threads][e.path().filename().string()] = slurp(e.path());
  }
  EXPECT_GT(files[1].size(), 3u);
  EXPECT_EQ(files[1], files[4]);
}

// ---- data.source = "tokens" --------------------------------------------------------

class TokensSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = temp_dir("source");
    // Two prepared directories, several shards each: a stream of distinct values so that
    // a window's position can be read back from its first token.
    for (int part = 0; part < 2; ++part) {
      spit(dir / ("in" + std::to_string(part)) / "doc.txt", "x");
      PrepareOptions o = byte_options(dir / ("p" + std::to_string(part)), {(dir / ("in" + std::to_string(part))).string()});
      const int base = part * 1500;
      o.encode = [base](std::string_view) {
        std::vector<int32_t> ids;
        for (int i = 0; i < 1500 - 1; ++i) ids.push_back(base + i);
        return ids;
      };
      o.vocab_size = 3001;
      o.eos_id = 3000;
      o.shard_tokens = 333;
      prepare_token_shards(o);
    }
    // The stream: 0..1498, eos, 1500..2998, eos.
    for (int i = 0; i < 1499; ++i) stream.push_back(i);
    stream.push_back(3000);
    for (int i = 1500; i < 2999; ++i) stream.push_back(i);
    stream.push_back(3000);
  }
  std::unique_ptr<TokenSource> source(int vocab = 3001, uint64_t seed = 7) {
    DataOptions d;
    d.source = "tokens";
    d.paths = {(dir / "p0").string(), (dir / "p1").string()};
    return make_token_source(d, vocab, seed, T);
  }
  Batch fill(const TokenSource& s, int B, const BatchPosition& pos) {
    Batch b;
    b.B = B;
    b.T = T;
    s.fill(b, pos);
    return b;
  }
  static constexpr int T = 15;  // windows of 16: 3000 tokens -> 187 windows
  fs::path dir;
  std::vector<int32_t> stream;
};

TEST_F(TokensSourceTest, GlobalBatchIsTheSameAtAnyWorldSize) {
  auto src = source();
  EXPECT_NE(src->describe().find("tokens"), std::string::npos) << src->describe();
  for (int64_t step : {0, 3, 40}) {
    // World 1, micro-batch 4, accumulation 2 == world 2, micro-batch 2, accumulation 2:
    // rank 0's rows then rank 1's are the world-1 micro-batch's rows.
    for (int micro = 0; micro < 2; ++micro) {
      const Batch one = fill(*src, 4, {step, micro, 2, 0, 1});
      const Batch r0 = fill(*src, 2, {step, micro, 2, 0, 2});
      const Batch r1 = fill(*src, 2, {step, micro, 2, 1, 2});
      std::vector<int32_t> both = r0.inputs, both_t = r0.targets;
      both.insert(both.end(), r1.inputs.begin(), r1.inputs.end());
      both_t.insert(both_t.end(), r1.targets.begin(), r1.targets.end());
      EXPECT_EQ(both, one.inputs);
      EXPECT_EQ(both_t, one.targets);
      // Deterministic: a new source draws the same.
      EXPECT_EQ(fill(*source(), 4, {step, micro, 2, 0, 1}).inputs, one.inputs);
    }
  }
  // Another seed, another order.
  EXPECT_NE(fill(*source(3001, 8), 4, {0, 0, 1, 0, 1}).inputs, fill(*src, 4, {0, 0, 1, 0, 1}).inputs);
}

TEST_F(TokensSourceTest, WindowsAreInBoundsAndEachEpochVisitsEveryWindowOnce) {
  auto src = source();
  const size_t W = stream.size() / (T + 1);
  // One micro-batch of W rows is exactly one epoch.
  for (int epoch = 0; epoch < 2; ++epoch) {
    const Batch b = fill(*src, static_cast<int>(W), {epoch, 0, 1, 0, 1});
    std::set<size_t> seen;
    for (size_t r = 0; r < W; ++r) {
      const int32_t* in = b.inputs.data() + r * T;
      // Find the window by its content: starts at a multiple of T+1, and T+1 tokens long.
      size_t start = std::find(stream.begin(), stream.end(), in[0]) - stream.begin();
      ASSERT_EQ(start % (T + 1), 0u) << r;
      ASSERT_LE(start + T + 1, stream.size());
      for (int t = 0; t < T; ++t) {
        ASSERT_EQ(in[t], stream[start + t]);
        ASSERT_EQ(b.targets[r * T + t], stream[start + t + 1]);
      }
      seen.insert(start / (T + 1));
    }
    EXPECT_EQ(seen.size(), W);
  }
}

TEST_F(TokensSourceTest, VocabularyIsCheckedAtOpen) {
  expect_error([&] { source(2000); }, {"p0", "shard-00004.bin", "token id 3000 at token offset 167", "vocab_size 2000"});
  DataOptions d;
  d.source = "tokens";
  d.paths = {(dir / "in0").string()};
  expect_error([&] { make_token_source(d, 3001, 1, T); }, {"in0", "index.json", "data prepare"});
  d.paths = {};
  expect_error([&] { make_token_source(d, 3001, 1, T); }, {"data.paths"});
  d.paths = {(dir / "p0").string()};
  expect_error([&] { make_token_source(d, 3001, 1, 5000); }, {"fewer than one sequence"});
  // A token changed in place (still in range): the checksum, verified at open, sees it.
  const fs::path shard = dir / "p1" / "shard-00002.bin";
  std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(64 + 4 * 100);
  const uint32_t seven = 7;
  f.write(reinterpret_cast<const char*>(&seven), 4);
  f.close();
  d.paths = {(dir / "p0").string(), (dir / "p1").string()};
  expect_error([&] { make_token_source(d, 3001, 1, T); }, {"p1", "shard-00002.bin", "XXH3-64", "corrupt"});
  d.paths = {(dir / "p0").string()};
  // A shard changed behind the index's back.
  fs::copy_file(dir / "p0" / "shard-00000.bin", dir / "p0" / "shard-00001.bin", fs::copy_options::overwrite_existing);
  expect_error([&] { make_token_source(d, 3001, 1, T); }, {"shard-00001.bin", "index.json"});
}

// ---- the CLI, with the real tokenizer ------------------------------------------------

const fs::path kTokenizer = fs::path(SHARDTRAIN_SHARED_DIR) / "tokenizers" / "qwen2.5";

#define SKIP_WITHOUT_TOKENIZER()                                                                 \
  if (!fs::exists(kTokenizer / "tokenizer.json"))                                                \
  GTEST_SKIP() << "no Qwen2.5 tokenizer in " << kTokenizer.string() << " (../shared is absent)"

testing::ShellResult sh(const std::string& args) {
  return testing::run_shell(std::string(SHARDTRAIN_BINARY) + " " + args);
}

void make_corpus(const fs::path& in) {
  spit(in / "a.txt", "The quick brown fox jumps over the lazy dog.\nNaïve café — 日本語のテキスト.\n");
  spit(in / "sub" / "b.txt", "Permission is hereby granted, free of charge, to any person obtaining a copy.\n");
  std::string long_text;
  for (int i = 0; i < 200; ++i) long_text += "Line " + std::to_string(i) + ": the licence grants rights.\n";
  spit(in / "c.txt", long_text);
}

std::map<std::string, std::string> dir_bytes(const fs::path& d) {
  std::map<std::string, std::string> m;
  for (const auto& e : fs::directory_iterator(d)) m[e.path().filename().string()] = slurp(e.path());
  return m;
}

TEST(DataCli, PrepareTextAndInspect) {
  SKIP_WITHOUT_TOKENIZER();
  const fs::path dir = temp_dir("cli_text");
  make_corpus(dir / "in");
  auto r = sh("data prepare --tokenizer " + kTokenizer.string() + " --input " + (dir / "in").string() + " --out " +
              (dir / "t1").string() + " --threads 1 --shard-tokens 1000");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("3 documents"), std::string::npos) << r.out;
  r = sh("data prepare --tokenizer " + kTokenizer.string() + " --input " + (dir / "in").string() + " --out " +
         (dir / "t4").string() + " --threads 4 --shard-tokens 1000");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto one = dir_bytes(dir / "t1"), four = dir_bytes(dir / "t4");
  EXPECT_GE(one.size(), 3u);  // index + at least 2 shards
  EXPECT_EQ(one, four);

  const TokenDataset d = TokenDataset::open((dir / "t1").string(), 0, true);
  EXPECT_EQ(d.index.vocab_size, 151665);
  EXPECT_EQ(d.index.eos_id, 151643);
  EXPECT_EQ(d.index.documents, 3u);
  const std::vector<int32_t> all = stream_of(d);
  EXPECT_EQ(std::count(all.begin(), all.end(), 151643), 3);
  EXPECT_EQ(all.back(), 151643);

  r = sh("data inspect " + (dir / "t1").string() + " --verify --sample 12");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("verified"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("The quick brown fox"), std::string::npos) << r.out;  // decoded, a.txt first
  // A corrupt shard: inspect names it.
  const fs::path shard = dir / "t1" / "shard-00000.bin";
  const uint32_t zero = 0;
  patch(shard, 64 + 4 * 5, &zero, 4);
  r = sh("data inspect " + (dir / "t1").string());
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("XXH3-64"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("shard-00000.bin"), std::string::npos) << r.out;
  // An existing output is refused without --force.
  r = sh("data prepare --tokenizer " + kTokenizer.string() + " --input " + (dir / "in").string() + " --out " +
         (dir / "t4").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--force"), std::string::npos) << r.out;
}

TEST(DataCli, PrepareJsonlNamesABadLineAndLeavesNothing) {
  SKIP_WITHOUT_TOKENIZER();
  const fs::path dir = temp_dir("cli_jsonl");
  spit(dir / "good.jsonl", "{\"text\": \"Hello world\"}\n{\"text\": \"Second doc\"}\n");
  auto r = sh("data prepare --tokenizer " + kTokenizer.string() + " --format jsonl --input " +
              (dir / "good.jsonl").string() + " --out " + (dir / "ok").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("2 documents"), std::string::npos) << r.out;
  spit(dir / "bad.jsonl", "{\"text\": \"Hello\"}\n{\"text\": \"fine\"}\n{\"txt\": \"wrong field\"}\n");
  r = sh("data prepare --tokenizer " + kTokenizer.string() + " --format jsonl --input " + (dir / "good.jsonl").string() +
         " " + (dir / "bad.jsonl").string() + " --out " + (dir / "out").string());
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("bad.jsonl:3"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "out"));
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  // An unreadable input is named.
  spit(dir / "locked.txt", "x");
  fs::permissions(dir / "locked.txt", fs::perms::none);
  if (::access((dir / "locked.txt").c_str(), R_OK) != 0) {  // root reads anyway
    r = sh("data prepare --tokenizer " + kTokenizer.string() + " --input " + (dir / "locked.txt").string() +
           " --out " + (dir / "out").string());
    EXPECT_EQ(r.code, 3) << r.out;
    EXPECT_NE(r.out.find("locked.txt"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(dir / "out"));
  }
}

TEST(DataCli, TrainTinyOnPreparedTokensAndLossFalls) {
  SKIP_WITHOUT_TOKENIZER();
  const fs::path dir = temp_dir("cli_train");
  std::string text;
  for (int i = 0; i < 300; ++i)
    text += "The cat sat on the mat. The dog sat on the log. The bird sat on the branch.\n";
  spit(dir / "in" / "corpus.txt", text);
  auto r = sh("data prepare --tokenizer " + kTokenizer.string() + " --input " + (dir / "in").string() + " --out " +
              (dir / "tok").string());
  ASSERT_EQ(r.code, 0) << r.out;
  r = sh("train --data.source=tokens --data.paths=" + (dir / "tok").string() +
         " --model.preset=tiny --model.vocab_size=151665 --train.steps=12 --train.seq_len=64 --train.micro_batch=4"
         " --train.log_every=1 --optim.lr=3e-3 --optim.warmup_steps=2 --run.out_dir=" + (dir / "run").string());
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(dir / "run" / "metrics.jsonl");
  std::vector<double> loss;
  for (std::string line; std::getline(in, line);) {
    const auto p = line.find("\"loss\":");
    ASSERT_NE(p, std::string::npos) << line;
    loss.push_back(std::stod(line.substr(p + 7)));
  }
  ASSERT_EQ(loss.size(), 12u) << r.out;
  EXPECT_GT(loss.front(), 10.0);  // about ln(151665) = 11.9 at the start
  EXPECT_LT(loss.back(), loss.front() - 2.0) << r.out;
  // A model vocabulary below the tokenizer's: refused at open, naming the shard and the offset.
  r = sh("train --data.source=tokens --data.paths=" + (dir / "tok").string() +
         " --model.preset=tiny --train.steps=1 --run.out_dir=" + (dir / "run2").string());
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("shard-00000.bin"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("token offset"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace st

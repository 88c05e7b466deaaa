// Token shards (data/token_shards.h), their window permutation and data.source =
// "tokens" (data/token_shard_source.h), and training on prepared tokens through the CLI.
// The library tests prepare with a byte-level encoder (id = byte, eos = 256); the CLI
// test uses the real Qwen2.5 tokenizer from ../shared and skips where it is absent.
// `data prepare` itself: test_prepare.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "data/prepare.h"
#include "data/source.h"
#include "data/token_shard_source.h"
#include "data/token_shards.h"
#include "support/data_files.h"
#include "support/qwen_tokenizer.h"
#include "support/shell.h"

namespace st {
namespace {
namespace fs = std::filesystem;
using namespace st::testing;  // the helpers of support/

void write_shard(const fs::path& p, const std::vector<int32_t>& ids, uint32_t vocab) {
  TokenShardWriter w(p.string(), vocab);
  w.append(ids.data(), ids.size());
  w.finish();
}

// ---- the format ------------------------------------------------------------------

TEST(TokenShard, RoundTrip) {
  const fs::path dir = temp_dir("roundtrip");
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < 300000; ++i) ids.push_back(static_cast<int32_t>((i * 7919) % 1000));
  write_shard(dir / "a.bin", ids, 1000);
  EXPECT_EQ(fs::file_size(dir / "a.bin"), 64 + 4 * ids.size());
  const std::string raw = read_file(dir / "a.bin");
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

// ---- data.source = "tokens" --------------------------------------------------------

class TokensSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = temp_dir("source");
    // Two prepared directories, several shards each: a stream of distinct values so that
    // a window's position can be read back from its first token.
    for (int part = 0; part < 2; ++part) {
      write_file(dir / ("in" + std::to_string(part)) / "doc.txt", "x");
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

// ---- training on prepared tokens, with the real tokenizer ----------------------------

testing::ShellResult sh(const std::string& args) {
  return testing::run_shell(std::string(SHARDTRAIN_BINARY) + " " + args);
}

TEST(DataCli, TrainTinyOnPreparedTokensAndLossFalls) {
  SKIP_WITHOUT_QWEN();
  const fs::path dir = temp_dir("cli_train");
  std::string text;
  for (int i = 0; i < 300; ++i)
    text += "The cat sat on the mat. The dog sat on the log. The bird sat on the branch.\n";
  write_file(dir / "in" / "corpus.txt", text);
  auto r = sh("data prepare --tokenizer " + kQwenDir.string() + " --input " + (dir / "in").string() + " --out " +
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

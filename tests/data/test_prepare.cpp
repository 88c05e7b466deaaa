// `data prepare` (data/prepare.h) and `data inspect`: documents from text and JSONL
// files, refusals that leave no output, the same bytes at any thread count. The library
// tests use a byte-level encoder (id = byte, eos = 256); the CLI tests use the real
// Qwen2.5 tokenizer from ../shared and skip where it is absent.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "core/error.h"
#include "data/prepare.h"
#include "data/token_shards.h"
#include "support/data_files.h"
#include "support/qwen_tokenizer.h"
#include "support/shell.h"

namespace st {
namespace {
namespace fs = std::filesystem;
using namespace st::testing;  // the helpers of support/

// ---- prepare (library, byte-level encoder) -----------------------------------------

std::vector<int32_t> stream_of(const TokenDataset& d) { return d.read(0, d.tokens()); }

TEST(Prepare, TextFilesAreDocumentsInNameOrder) {
  const fs::path dir = temp_dir("prep_text");
  write_file(dir / "in" / "b.txt", "bravo");
  write_file(dir / "in" / "a.txt", "alpha");
  write_file(dir / "in" / "sub" / "c.txt", "charlie!");
  write_file(dir / "extra.txt", "zz");
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
  write_file(dir / "in" / "a.jsonl", "{\"text\": \"hi\", \"id\": 1}\n\n{\"text\": \"yo\\n\"}\r\n");
  write_file(dir / "in" / "b.jsonl", "{\"body\": \"x\", \"text\": \"\"}");  // no final newline
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
  write_file(dir / "a.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"fine\"}\n{\"text\": oops}\n");
  write_file(dir / "b.jsonl", "{\"text\": \"ok\"}\n[1, 2]\n");
  write_file(dir / "c.jsonl", "{\"content\": \"ok\"}\n");
  write_file(dir / "d.jsonl", "{\"text\": 5}\n");
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

// What f() writes to stdout and stderr; an exception from it fails the test (after the
// capture ends, so that the next test can capture too).
struct Output {
  std::string out, err;
};
template <class F>
Output output_of(F&& f) {
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  try {
    f();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw: " << e.what();
  }
  Output o;
  o.out = ::testing::internal::GetCapturedStdout();
  o.err = ::testing::internal::GetCapturedStderr();
  return o;
}

// --skip-bad-lines: every kind of line prepare refuses (invalid JSON, invalid UTF-8, not
// an object, no field, a field that is not a string) is left out, counted per input and
// in index.json, and reported by kind with the first one named; without it the first
// stops the run, saying that the option exists.
TEST(Prepare, SkipBadLinesCountsAndReportsWhatItLeftOut) {
  const fs::path dir = temp_dir("prep_skip");
  write_file(dir / "a.jsonl",
             "{\"text\": \"ok\"}\n{\"text\": oops}\n[1]\n{\"txt\": \"x\"}\n{\"text\": 5}\n{\"text\": \"caf\xe9\"}\n"
             "{\"text\": \"yo\"}\n");
  write_file(dir / "b.jsonl", "{\"text\": \"b\"}\n{\"text\": \"b\"\n");
  PrepareOptions o = byte_options(dir / "out", {(dir / "a.jsonl").string(), (dir / "b.jsonl").string()});
  o.format = "jsonl";
  expect_error([&] { prepare_token_shards(o); }, {"a.jsonl:2", "invalid JSON", "--skip-bad-lines"});
  o.skip_bad_lines = true;
  TokenIndex x;
  const std::string err = output_of([&] { x = prepare_token_shards(o); }).err;
  EXPECT_EQ(x.documents, 3u);
  EXPECT_EQ(x.skipped_lines, 6u);
  const TokenDataset d = TokenDataset::open((dir / "out").string());
  EXPECT_EQ(stream_of(d), (std::vector<int32_t>{'o', 'k', 256, 'y', 'o', 256, 'b', 256}));
  EXPECT_EQ(d.index.skipped_lines, 6u);
  ASSERT_EQ(d.index.inputs.size(), 2u);
  EXPECT_EQ(d.index.inputs[0].skipped_lines, 5u);
  EXPECT_EQ(d.index.inputs[1].skipped_lines, 1u);
  EXPECT_EQ(d.index.inputs[0].documents, 2u);
  for (const std::string part : {"left out 6 lines", "2 invalid JSON", "1 invalid UTF-8", "1 not a JSON object",
                                 "1 no field \"text\"", "1 field \"text\" not a string", "a.jsonl:2"})
    EXPECT_NE(err.find(part), std::string::npos) << part << " in: " << err;
  // A clean run writes no count at all (the index of an unchanged input stays the same bytes).
  write_file(dir / "clean.jsonl", "{\"text\": \"ok\"}\n");
  o = byte_options(dir / "clean", {(dir / "clean.jsonl").string()});
  o.format = "jsonl";
  o.skip_bad_lines = true;
  prepare_token_shards(o);
  EXPECT_EQ(read_file(dir / "clean" / "index.json").find("skipped_lines"), std::string::npos);
}

// A .jsonl file read under the text format is one document of JSON syntax: a warning says
// so and suggests --format jsonl.
TEST(Prepare, AJsonlFileUnderTheTextFormatWarns) {
  const fs::path dir = temp_dir("prep_jsonl_as_text");
  write_file(dir / "in" / "a.jsonl", "{\"text\": \"hi\"}\n{\"text\": \"yo\"}\n");
  write_file(dir / "in" / "b.txt", "plain");
  PrepareOptions o = byte_options(dir / "out", {(dir / "in").string()});
  const std::string err = output_of([&] { prepare_token_shards(o); }).err;
  EXPECT_NE(err.find("a.jsonl"), std::string::npos) << err;
  EXPECT_NE(err.find("--format jsonl"), std::string::npos) << err;
  // Under the jsonl format, or with text files only, nothing is said.
  o = byte_options(dir / "out2", {(dir / "in" / "b.txt").string()});
  EXPECT_EQ(output_of([&] { prepare_token_shards(o); }).err, "");
}

// The stage directory a killed prepare (kill -9) left beside --out is named and removed by
// the next prepare to that --out; one whose process still runs is left alone.
TEST(Prepare, StaleStagesOfAKilledPrepareAreRemovedLiveOnesLeft) {
  const fs::path dir = temp_dir("prep_stale");
  write_file(dir / "in.txt", "text");
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);  // gone: its pid names no process now
  const fs::path dead = dir / ("out.tmp-" + std::to_string(child));
  const fs::path live = dir / ("out.tmp-" + std::to_string(::getppid()));
  const fs::path other = dir / "other.tmp-1";  // another output's: not ours to touch
  for (const fs::path& p : {dead, live, other}) write_file(p / "shard-00000.bin", "partial");
  PrepareOptions o = byte_options(dir / "out", {(dir / "in.txt").string()});
  const auto [out, err] = output_of([&] { prepare_token_shards(o); });
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_NE(out.find("removed '" + dead.string() + "'"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(live / "shard-00000.bin"));
  EXPECT_NE(err.find("leaving '" + live.string() + "'"), std::string::npos) << err;
  EXPECT_TRUE(fs::exists(other / "shard-00000.bin"));
  EXPECT_TRUE(fs::exists(dir / "out" / "index.json"));
}

TEST(Prepare, RefusesANonEmptyOutUnlessForcedThenReplacesItWhole) {
  const fs::path dir = temp_dir("prep_force");
  write_file(dir / "in.txt", "some text");
  write_file(dir / "out" / "old.txt", "old");
  PrepareOptions o = byte_options(dir / "out", {(dir / "in.txt").string()});
  expect_error([&] { prepare_token_shards(o); }, {"out", "not empty", "--force"});
  EXPECT_TRUE(fs::exists(dir / "out" / "old.txt"));
  o.force = true;
  prepare_token_shards(o);
  EXPECT_FALSE(fs::exists(dir / "out" / "old.txt"));
  EXPECT_TRUE(fs::exists(dir / "out" / "index.json"));
  // An input inside --out is refused even with --force (--out itself, a prepared
  // directory, is not text in the first place).
  o.inputs = {(dir / "out" / "index.json").string()};
  expect_error([&] { prepare_token_shards(o); }, {"inside --out"});
  o.inputs = {(dir / "out").string()};
  expect_error([&] { prepare_token_shards(o); }, {"is a directory of prepared tokens"});
  // An existing empty directory is fine.
  fs::create_directories(dir / "empty");
  o = byte_options(dir / "empty", {(dir / "in.txt").string()});
  EXPECT_NO_THROW(prepare_token_shards(o));
}

// A prepared directory inside an input directory (an earlier run's output) is skipped,
// not read back as text; one named as an input is refused; an --out inside an input
// directory is refused before anything is written.
TEST(Prepare, PreparedDirectoriesAmongTheInputsAreNotText) {
  const fs::path dir = temp_dir("prep_nested");
  write_file(dir / "in" / "a.txt", "alpha");
  write_file(dir / "in" / "b.txt", "bravo");
  // An earlier output beside the text files, put there by hand as a user might.
  prepare_token_shards(byte_options(dir / "in" / "tokens", {(dir / "in" / "a.txt").string()}));
  ASSERT_TRUE(fs::exists(dir / "in" / "tokens" / "shard-00000.bin"));
  const TokenIndex x = prepare_token_shards(byte_options(dir / "out", {(dir / "in").string()}));
  EXPECT_EQ(x.documents, 2u);
  ASSERT_EQ(x.inputs.size(), 2u);
  EXPECT_EQ(x.inputs[0].path, (dir / "in" / "a.txt").string());
  EXPECT_EQ(x.inputs[1].path, (dir / "in" / "b.txt").string());
  EXPECT_EQ(x.tokens, 6u + 6u);
  // Named as an input itself: refused, a usage error.
  const std::optional<Error> named =
      caught_error([&] { prepare_token_shards(byte_options(dir / "out2", {(dir / "in" / "tokens").string()})); });
  ASSERT_TRUE(named);
  EXPECT_NE(std::string(named->what()).find("is a directory of prepared tokens"), std::string::npos) << named->what();
  EXPECT_EQ(named->kind(), ErrorKind::Usage);
  EXPECT_FALSE(fs::exists(dir / "out2"));
  // --out inside an input directory: refused, nothing written there or beside it.
  const std::optional<Error> inner =
      caught_error([&] { prepare_token_shards(byte_options(dir / "in" / "o", {(dir / "in").string()})); });
  ASSERT_TRUE(inner);
  EXPECT_NE(std::string(inner->what()).find("lies inside --input"), std::string::npos) << inner->what();
  EXPECT_EQ(inner->kind(), ErrorKind::Usage);
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir / "in")) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"a.txt", "b.txt", "tokens"}));
}

TEST(Prepare, OutputIsTheSameBytesForAnyThreadCount) {
  const fs::path dir = temp_dir("prep_threads");
  std::string big;
  for (int f = 0; f < 40; ++f) {
    std::string s;
    for (int i = 0; i < 1000 + f * 97; ++i) s += static_cast<char>('a' + (i * f) % 26);
    write_file(dir / "in" / ("f" + std::to_string(100 + f) + ".txt"), s);
  }
  std::map<int, std::map<std::string, std::string>> files;
  for (int threads : {1, 4}) {
    PrepareOptions o = byte_options(dir / ("out" + std::to_string(threads)), {(dir / "in").string()});
    o.threads = threads;
    o.shard_tokens = 10000;
    prepare_token_shards(o);
    for (const auto& e : fs::directory_iterator(o.out)) files[threads][e.path().filename().string()] = read_file(e.path());
  }
  EXPECT_GT(files[1].size(), 3u);
  EXPECT_EQ(files[1], files[4]);
}

// ---- the CLI, with the real tokenizer ------------------------------------------------

testing::ShellResult sh(const std::string& args) {
  return testing::run_shell(std::string(SHARDTRAIN_BINARY) + " " + args);
}

void make_corpus(const fs::path& in) {
  write_file(in / "a.txt", "The quick brown fox jumps over the lazy dog.\nNaïve café — 日本語のテキスト.\n");
  write_file(in / "sub" / "b.txt", "Permission is hereby granted, free of charge, to any person obtaining a copy.\n");
  std::string long_text;
  for (int i = 0; i < 200; ++i) long_text += "Line " + std::to_string(i) + ": the licence grants rights.\n";
  write_file(in / "c.txt", long_text);
}

std::map<std::string, std::string> dir_bytes(const fs::path& d) {
  std::map<std::string, std::string> m;
  for (const auto& e : fs::directory_iterator(d)) m[e.path().filename().string()] = read_file(e.path());
  return m;
}

TEST(DataCli, PrepareTextAndInspect) {
  SKIP_WITHOUT_QWEN();
  const fs::path dir = temp_dir("cli_text");
  make_corpus(dir / "in");
  auto r = sh("data prepare --tokenizer " + kQwenDir.string() + " --input " + (dir / "in").string() + " --out " +
              (dir / "t1").string() + " --threads 1 --shard-tokens 1000");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("3 documents"), std::string::npos) << r.out;
  r = sh("data prepare --tokenizer " + kQwenDir.string() + " --input " + (dir / "in").string() + " --out " +
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
  r = sh("data prepare --tokenizer " + kQwenDir.string() + " --input " + (dir / "in").string() + " --out " +
         (dir / "t4").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--force"), std::string::npos) << r.out;
}

TEST(DataCli, PrepareJsonlNamesABadLineAndLeavesNothing) {
  SKIP_WITHOUT_QWEN();
  const fs::path dir = temp_dir("cli_jsonl");
  write_file(dir / "good.jsonl", "{\"text\": \"Hello world\"}\n{\"text\": \"Second doc\"}\n");
  auto r = sh("data prepare --tokenizer " + kQwenDir.string() + " --format jsonl --input " +
              (dir / "good.jsonl").string() + " --out " + (dir / "ok").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("2 documents"), std::string::npos) << r.out;
  write_file(dir / "bad.jsonl", "{\"text\": \"Hello\"}\n{\"text\": \"fine\"}\n{\"txt\": \"wrong field\"}\n");
  r = sh("data prepare --tokenizer " + kQwenDir.string() + " --format jsonl --input " + (dir / "good.jsonl").string() +
         " " + (dir / "bad.jsonl").string() + " --out " + (dir / "out").string());
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("bad.jsonl:3"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "out"));
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  // An unreadable input is named.
  write_file(dir / "locked.txt", "x");
  fs::permissions(dir / "locked.txt", fs::perms::none);
  if (::access((dir / "locked.txt").c_str(), R_OK) != 0) {  // root reads anyway
    r = sh("data prepare --tokenizer " + kQwenDir.string() + " --input " + (dir / "locked.txt").string() +
           " --out " + (dir / "out").string());
    EXPECT_EQ(r.code, 3) << r.out;
    EXPECT_NE(r.out.find("locked.txt"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(dir / "out"));
  }
}

}  // namespace
}  // namespace st

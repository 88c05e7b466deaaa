// The Qwen2 byte-level BPE tokenizer: the facts of shared/tokenizers/qwen2.5/README.md,
// parity with Hugging Face `tokenizers` (tests/data/tokenizer/qwen2.5_parity.jsonl, made by
// scripts/make_tokenizer_fixture.py), round trips, threads, refusals, and the CLI
// (UTF-8 and NFC on their own: test_unicode.cpp). Tests that need ../shared skip with a
// message where it is absent; the ones on small tokenizers written here run everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/utf8.h"
#include "data/tokenizer.h"
#include "support/data_files.h"
#include "support/qwen_tokenizer.h"
#include "support/shell.h"
#include "support/tiny_tokenizer.h"

namespace st {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;
using Ids = std::vector<int32_t>;

const fs::path kParity = fs::path(SHARDTRAIN_TEST_DATA) / "tokenizer" / "qwen2.5_parity.jsonl";

using namespace st::testing;  // the helpers of support/

// 256 byte symbols (byte b has id b), the given merges (their results get the
// next ids), <|endoftext|> after them; the Qwen2 pipeline.
json small_tokenizer_json(const std::vector<std::pair<std::string, std::string>>& merges) {
  return json::parse(st::testing::tokenizer_json(st::testing::byte_level_tokenizer(merges, {"<|endoftext|>"})));
}

Tokenizer load_small(const json& j, const std::string& name) {
  const fs::path d = temp_dir(name);
  write_file(d / "tokenizer.json", j.dump());
  return Tokenizer::load(d.string());
}

std::string load_error(const json& j, const std::string& name) {
  const fs::path d = temp_dir(name);
  write_file(d / "tokenizer.json", j.dump());
  return error_of([&] { Tokenizer::load(d.string()); });
}

// ---- small tokenizers (no ../shared needed) -------------------------------------------------

TEST(TokenizerSmall, MergesByRankLeftmostFirst) {
  const Tokenizer t = load_small(small_tokenizer_json({{"a", "a"}, {"b", "c"}, {"a", "bc"}, {"aa", "a"}}), "small");
  const int32_t aa = *t.token_id("aa"), bc = *t.token_id("bc"), abc = *t.token_id("abc"), aaa = *t.token_id("aaa");
  EXPECT_EQ(t.encode("aaaa"), (Ids{aa, aa}));       // "a a" (rank 0) left to right, before "aa a"
  EXPECT_EQ(t.encode("aaa"), (Ids{aaa}));           // a a -> aa, then aa a -> aaa
  EXPECT_EQ(t.encode("abc"), (Ids{abc}));           // b c (rank 1) then a bc
  EXPECT_EQ(t.encode("ab"), (Ids{'a', 'b'}));        // here byte b has id b
  EXPECT_EQ(t.encode("a b"), (Ids{'a', ' ', 'b'}));  // " b" is one piece, unmerged: Ġ b
  EXPECT_EQ(t.vocab_size(), 256 + 4 + 1);
  EXPECT_EQ(t.eos_id(), 260);
  EXPECT_EQ(t.encode("x<|endoftext|>aa"), (Ids{'x', 260, aa}));
  EXPECT_EQ(t.decode(t.encode("aaaa bc<|endoftext|>")), "aaaa bc<|endoftext|>");
  EXPECT_NE(t.describe().find("260 vocab (4 merges) + 1 added tokens"), std::string::npos) << t.describe();
}

TEST(TokenizerSmall, MergesAsPairsAndVocabMergesFiles) {
  json j = small_tokenizer_json({{"a", "a"}, {"Ġ", "aa"}});
  for (auto& m : j["model"]["merges"]) {  // the newer [left, right] form
    const std::string s = m.get<std::string>();
    m = json::array({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  const Tokenizer a = load_small(j, "pairs");
  // The same as vocab.json + merges.txt (with a #version header) + tokenizer_config.json.
  const fs::path d = temp_dir("files");
  write_file(d / "vocab.json", j["model"]["vocab"].dump());
  write_file(d / "merges.txt", "#version: 0.2\na a\nĠ aa\n");
  json cfg = {{"tokenizer_class", "Qwen2Tokenizer"},
              {"added_tokens_decoder",
               {{"258", {{"content", "<|endoftext|>"}, {"lstrip", false}, {"normalized", false}, {"rstrip", false},
                         {"single_word", false}, {"special", true}}}}}};
  write_file(d / "tokenizer_config.json", cfg.dump());
  const Tokenizer b = Tokenizer::load(d.string());
  for (const std::string s : {"aa aa", " aaaa", "a<|endoftext|> aa"}) EXPECT_EQ(a.encode(s), b.encode(s)) << s;
  EXPECT_EQ(a.encode(" aa"), (Ids{*a.token_id("Ġaa")}));
  EXPECT_EQ(b.eos_id(), 258);
  EXPECT_NE(b.describe().find("vocab.json + merges.txt"), std::string::npos);
  cfg["tokenizer_class"] = "LlamaTokenizer";
  write_file(d / "tokenizer_config.json", cfg.dump());
  const std::string e = error_of([&] { Tokenizer::load(d.string()); });
  EXPECT_NE(e.find("tokenizer_config.json"), std::string::npos) << e;
  EXPECT_NE(e.find("LlamaTokenizer"), std::string::npos) << e;
}

TEST(TokenizerSmall, RefusesWhatItDoesNotImplementByName) {
  const json base = small_tokenizer_json({{"a", "a"}});
  struct Case {
    std::string name, path, want;
    json value;
  };
  const std::vector<Case> cases = {
      {"nfkc", "/normalizer", "normalizer NFKC", {{"type", "NFKC"}}},
      {"lowercase", "/normalizer", "normalizer Lowercase", {{"type", "Lowercase"}}},
      {"wordpiece", "/model/type", "model type WordPiece", "WordPiece"},
      {"dropout", "/model/dropout", "dropout", 0.1},
      {"fallback", "/model/byte_fallback", "byte_fallback", true},
      {"suffix", "/model/end_of_word_suffix", "end_of_word_suffix", "</w>"},
      {"metaspace", "/pre_tokenizer", "pre_tokenizer Metaspace", {{"type", "Metaspace"}}},
      {"regex", "/pre_tokenizer/pretokenizers/0/pattern/Regex", "regex is not Qwen2's", R"(\p{N}{1,3}|\s+)"},
      {"behavior", "/pre_tokenizer/pretokenizers/0/behavior", "behavior Removed", "Removed"},
      {"prefix", "/pre_tokenizer/pretokenizers/1/add_prefix_space", "add_prefix_space", true},
      {"decoder", "/decoder", "decoder WordPiece", {{"type", "WordPiece"}}},
      {"post", "/post_processor", "post_processor TemplateProcessing", {{"type", "TemplateProcessing"}}},
      {"lstrip", "/added_tokens/0/lstrip", "lstrip=true", true},
      {"normalized", "/added_tokens/0/normalized", "normalized=true", true},
      {"single_word", "/added_tokens/0/single_word", "single_word=true", true},
      {"truncation", "/truncation", "truncation", {{"max_length", 8}}},
      {"merge_oov", "/model/merges/0", "not in the vocab", "a zz"},
  };
  for (const auto& c : cases) {
    json j = base;
    j[json::json_pointer(c.path)] = c.value;
    const std::string e = load_error(j, c.name);
    EXPECT_NE(e.find(c.want), std::string::npos) << c.name << ": " << e;
    EXPECT_NE(e.find("tokenizer.json"), std::string::npos) << c.name << ": " << e;
  }
  json j = base;
  j["added_tokens"] = json::array();
  EXPECT_NE(load_error(j, "noeos").find("<|endoftext|>"), std::string::npos);
}

TEST(TokenizerSmall, MissingAndCorruptFilesAreNamed) {
  std::string e = error_of([] { Tokenizer::load("/nonexistent/tokenizer/dir"); });
  EXPECT_NE(e.find("/nonexistent/tokenizer/dir"), std::string::npos) << e;
  fs::path d = temp_dir("empty");
  e = error_of([&] { Tokenizer::load(d.string()); });
  EXPECT_NE(e.find("no tokenizer.json"), std::string::npos) << e;
  write_file(d / "tokenizer.json", "{\"model\": [1, 2");
  e = error_of([&] { Tokenizer::load(d.string()); });
  EXPECT_NE(e.find((d / "tokenizer.json").string()), std::string::npos) << e;
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
  d = temp_dir("half");
  write_file(d / "vocab.json", "{}");
  e = error_of([&] { Tokenizer::load(d.string()); });
  EXPECT_NE(e.find("merges.txt"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
  write_file(d / "merges.txt", "a b\n");
  write_file(d / "tokenizer_config.json", R"({"tokenizer_class": "Qwen2Tokenizer"})");
  e = error_of([&] { Tokenizer::load(d.string()); });
  EXPECT_NE(e.find("vocab.json"), std::string::npos) << e;  // empty vocab
  write_file(d / "vocab.json", small_tokenizer_json({})["model"]["vocab"].dump());
  write_file(d / "merges.txt", "a b c\n");
  e = error_of([&] { Tokenizer::load(d.string()); });
  EXPECT_NE(e.find("merges.txt:1"), std::string::npos) << e;
}

TEST(TokenizerSmall, InvalidUtf8IsReplacedBeforeEncoding) {
  // The replacement itself (bytes.decode("utf-8", errors="replace")): test_unicode.cpp.
  const std::string R = "\xEF\xBF\xBD";
  const Tokenizer t = load_small(small_tokenizer_json({{"a", "a"}}), "invalid");
  EXPECT_EQ(t.encode("x\xffy"), t.encode("x" + R + "y"));
}

// ---- the Qwen2.5 files ------------------------------------------------------------------------

TEST(TokenizerQwen, ReadmeSanityValues) {
  SKIP_WITHOUT_QWEN();
  const Tokenizer& t = qwen();
  EXPECT_EQ(t.encode("Hello world"), (Ids{9707, 1879}));
  EXPECT_EQ(t.encode(" Hello world"), (Ids{21927, 1879}));
  EXPECT_EQ(t.encode("333"), (Ids{18, 18, 18}));  // digits are single
  EXPECT_EQ(t.encode("   "), (Ids{262}));
  EXPECT_EQ(t.encode("\n\n"), (Ids{271}));
  EXPECT_EQ(t.encode("<|im_start|>user\nHello!<|im_end|>"), (Ids{151644, 872, 198, 9707, 0, 151645}));
  EXPECT_EQ(t.encode(""), Ids{});
}

TEST(TokenizerQwen, VocabularyFacts) {
  SKIP_WITHOUT_QWEN();
  const Tokenizer& t = qwen();
  EXPECT_EQ(t.vocab_size(), 151665);
  EXPECT_EQ(t.eos_id(), 151643);
  EXPECT_EQ(t.num_added_tokens(), 22);
  EXPECT_EQ(t.token_id("<|endoftext|>"), 151643);
  EXPECT_EQ(t.token_id("<|im_end|>"), 151645);
  EXPECT_EQ(t.token_id("<|file_sep|>"), 151664);
  EXPECT_EQ(t.token_id("Ġ"), 220);
  EXPECT_EQ(t.token_id("Ċ"), 198);
  EXPECT_EQ(t.token_id("ĉ"), 197);
  EXPECT_EQ(t.token_id("č"), 201);
  EXPECT_EQ(t.token_id("!"), 0);
  EXPECT_EQ(t.token_id("no such token here"), std::nullopt);
  EXPECT_TRUE(t.is_special(151643));
  EXPECT_FALSE(t.is_special(151657));  // <tool_call>
  EXPECT_FALSE(t.is_special(9707));
  // Ids 0..255 are the single bytes, in byte-to-unicode table order.
  EXPECT_EQ(t.decode({0}), "!");
  EXPECT_EQ(t.decode({93}), "~");
  EXPECT_EQ(t.decode({94}), "\xA1");
  EXPECT_EQ(t.decode({188}), std::string(1, '\0'));
  EXPECT_EQ(t.decode({220}), " ");
  for (int b = 0; b < 256; ++b) ASSERT_EQ(t.encode(std::string(1, char(b))).size(), 1u) << b;  // >= 0x80: U+FFFD
  const std::string d = t.describe();
  EXPECT_NE(d.find("151643 vocab (151387 merges) + 22 added tokens"), std::string::npos) << d;
}

TEST(TokenizerQwen, AddedTokensInsideText) {
  SKIP_WITHOUT_QWEN();
  const Tokenizer& t = qwen();
  const int32_t eos = 151643;
  const Ids hello = t.encode("hello"), world = t.encode("world");
  Ids want = hello;
  want.push_back(eos);
  want.insert(want.end(), world.begin(), world.end());
  EXPECT_EQ(t.encode("hello<|endoftext|>world"), want);
  // No whitespace is absorbed around them (lstrip/rstrip false).
  EXPECT_EQ(t.encode(" <|endoftext|> "), (Ids{220, eos, 220}));
  EXPECT_EQ(t.encode("<|endoftext|><|endoftext|>"), (Ids{eos, eos}));
  // Not matched: partial, other case, split by a space.
  for (const std::string s : {"<|endoftext", "<|ENDOFTEXT|>", "<| endoftext|>"})
    for (int32_t id : t.encode(s)) EXPECT_LT(id, 151643) << s;
  // Non-special added tokens are matched too.
  EXPECT_EQ(t.encode("<tool_call></tool_call>"), (Ids{151657, 151658}));
  // The text after a token is normalized on its own: a combining mark stays a mark.
  const Ids mark = t.encode("\xCC\x81");
  Ids after = {151645};
  after.insert(after.end(), mark.begin(), mark.end());
  EXPECT_EQ(t.encode("<|im_end|>\xCC\x81"), after);
}

std::vector<std::string> varied_texts() {
  std::vector<std::string> v = {
      "The quick brown fox jumps over the lazy dog. It's 12:45, isn't it? I'LL see.",
      "def f(x):\n\treturn x ** 2  # comment\r\n\r\n\n   \n",
      "你好，世界！こんにちは 안녕하세요 مرحبا नमस्ते สวัสดี Привет Γειά",
      "👨‍👩‍👧‍👦 🇺🇸 👍🏽 1️⃣ ✨",
      "12345678901234567890 3.14159 1,000,000 ١٢٣",
      std::string("nul\0byte", 8),
      "\xC2\xA0\xE3\x80\x80\xE2\x80\xA8\xC2\x85\xE1\xA0\x8E",
      "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n<tool_call>x</tool_call><|im_end|>",
      std::string(5000, ' ') + "x" + std::string(3000, 'a') + std::string(2000, '\n'),
  };
  // Random strings of code points from a fixed seed: ASCII, Latin, marks, CJK, emoji,
  // anything up to U+10FFFF (no surrogates), already NFC (so they come back as they are).
  std::mt19937 rng(1234);
  const std::vector<std::pair<uint32_t, uint32_t>> ranges = {
      {0x00, 0x7F}, {0x20, 0x7E}, {0xA0, 0x2FF}, {0x370, 0x3FF}, {0x400, 0x4FF}, {0x600, 0x6FF},
      {0x900, 0x97F}, {0x3040, 0x30FF}, {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3}, {0x1F300, 0x1FAFF}, {0, 0x10FFFF}};
  for (int k = 0; k < 400; ++k) {
    std::string s;
    const int n = 1 + int(rng() % 60);
    for (int i = 0; i < n; ++i) {
      const auto [lo, hi] = ranges[rng() % ranges.size()];
      uint32_t cp = lo + rng() % (hi - lo + 1);
      if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
      s += st::testing::utf8(cp);
    }
    v.push_back(s);
  }
  return v;
}

TEST(TokenizerQwen, DecodeOfEncodeIsIdentityOnValidNfcUtf8) {
  SKIP_WITHOUT_QWEN();
  const Tokenizer& t = qwen();
  int checked = 0;
  for (const std::string& s : varied_texts()) {
    const Ids ids = t.encode(s);
    for (int32_t id : ids) ASSERT_LT(id, t.vocab_size());
    // NFC may change a random string; then decode gives the normalized one, whose
    // encoding is the same ids.
    const std::string back = t.decode(ids);
    EXPECT_EQ(t.encode(back), ids) << s;
    checked += back == s;
  }
  EXPECT_GT(checked, 300);  // most are NFC already and come back byte for byte
  for (const std::string s : {"hello world", "x\r\n\ty", "你好", "👨‍👩‍👧‍👦"})
    EXPECT_EQ(t.decode(t.encode(s)), s);
}

TEST(TokenizerQwen, ArbitraryBytesNeverCrash) {
  SKIP_WITHOUT_QWEN();
  const Tokenizer& t = qwen();
  std::mt19937 rng(99);
  for (int k = 0; k < 300; ++k) {
    std::string s(1 + rng() % 200, '\0');
    for (char& c : s) c = char(rng() % 4 ? rng() % 256 : "<|endoftext>\n 'a"[rng() % 16]);
    Ids ids;
    ASSERT_NO_THROW(ids = t.encode(s)) << k;
    EXPECT_EQ(t.decode(ids), t.decode(t.encode(utf8_replace_invalid(s))));
    EXPECT_EQ(ids, t.encode(utf8_replace_invalid(s)));
  }
  // Long runs of one class (regex backtracking, BPE on a huge piece).
  for (const std::string& s : {std::string(1 << 20, ' '), std::string(1 << 20, 'a'), std::string(1 << 19, '\n'),
                               std::string(200000, '\xff'), std::string(1 << 19, '7')}) {
    Ids ids;
    ASSERT_NO_THROW(ids = t.encode(s)) << s.size();
    EXPECT_EQ(t.decode(ids), utf8_replace_invalid(s));
  }
}

TEST(TokenizerQwen, SeveralThreadsGetTheSameIds) {
  SKIP_WITHOUT_QWEN();
  const Tokenizer& t = qwen();
  const auto texts = varied_texts();
  std::vector<Ids> want;
  for (const auto& s : texts) want.push_back(t.encode(s));
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w)
    threads.emplace_back([&, w] {
      for (int rep = 0; rep < 3; ++rep)
        for (size_t i = 0; i < texts.size(); ++i) {
          const size_t k = (i * 7 + w * 13 + rep) % texts.size();
          bad[w] += t.encode(texts[k]) != want[k];
        }
    });
  for (auto& th : threads) th.join();
  for (int w = 0; w < 4; ++w) EXPECT_EQ(bad[w], 0) << "thread " << w;
}

TEST(TokenizerQwen, DecodeRefusesIdsOutOfRange) {
  SKIP_WITHOUT_QWEN();
  const Tokenizer& t = qwen();
  std::string e = error_of([&] { t.decode({9707, 151665}); });
  EXPECT_NE(e.find("151665"), std::string::npos) << e;
  EXPECT_NE(e.find("position 1"), std::string::npos) << e;
  e = error_of([&] { t.decode({-1}); });
  EXPECT_NE(e.find("-1"), std::string::npos) << e;
  EXPECT_EQ(t.decode({151664}), "<|file_sep|>");
}

TEST(TokenizerQwen, VocabJsonAndMergesTxtGiveTheSameIds) {
  SKIP_WITHOUT_QWEN();
  const fs::path d = temp_dir("qwen_files");  // links, not copies
  for (const char* f : {"vocab.json", "merges.txt", "tokenizer_config.json"})
    fs::create_symlink(kQwenDir / f, d / f);
  const Tokenizer t = Tokenizer::load(d.string());
  EXPECT_EQ(t.vocab_size(), qwen().vocab_size());
  EXPECT_EQ(t.eos_id(), 151643);
  for (const auto& s : varied_texts()) ASSERT_EQ(t.encode(s), qwen().encode(s)) << s;
}

TEST(TokenizerQwen, RefusesAModifiedTokenizerJson) {
  SKIP_WITHOUT_QWEN();
  json j = json::parse(read_file(kQwenDir / "tokenizer.json"));
  j["normalizer"] = {{"type", "NFKC"}};
  const fs::path d = temp_dir("qwen_nfkc");
  write_file(d / "tokenizer.json", j.dump());
  const std::string e = error_of([&] { Tokenizer::load(d.string()); });
  EXPECT_NE(e.find((d / "tokenizer.json").string()), std::string::npos) << e;
  EXPECT_NE(e.find("normalizer NFKC is not supported"), std::string::npos) << e;
}

// Every case of the fixture made from Hugging Face tokenizers gives the same ids.
TEST(TokenizerQwen, ParityWithHuggingFaceTokenizers) {
  SKIP_WITHOUT_QWEN();
  if (!fs::exists(kParity))
    GTEST_SKIP() << kParity.string() << " does not exist yet: run scripts/make_tokenizer_fixture.py";
  std::ifstream in(kParity);
  std::string line;
  int cases = 0, mismatches = 0;
  while (std::getline(in, line)) {
    const json j = json::parse(line);
    if (j.contains("meta")) continue;
    std::string text;
    if (j.contains("text")) {
      text = j["text"].get<std::string>();
    } else {
      // base64 of bytes that are not valid UTF-8
      const std::string b64 = j["text_b64"].get<std::string>();
      const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
      uint32_t acc = 0;
      int bits = 0;
      for (char c : b64) {
        if (c == '=') break;
        acc = (acc << 6) | uint32_t(alphabet.find(c));
        bits += 6;
        if (bits >= 8) bits -= 8, text += char((acc >> bits) & 0xFF);
      }
    }
    const Ids want = j["ids"].get<Ids>();
    const Ids got = qwen().encode(text);
    ++cases;
    if (got != want && ++mismatches <= 20)
      ADD_FAILURE() << j.value("name", "?") << ": " << j.dump().substr(0, 300) << "\n  got " << json(got).dump();
  }
  EXPECT_GT(cases, 100);
  EXPECT_EQ(mismatches, 0) << "of " << cases << " cases";
}

// ---- the CLI ------------------------------------------------------------------------------------

st::testing::ShellResult cli(const std::string& args) {
  return st::testing::run_shell(std::string(SHARDTRAIN_BINARY) + " tokenize --tokenizer " + kQwenDir.string() + " " +
                                args);
}

TEST(TokenizeCli, EncodesDecodesAndFails) {
  SKIP_WITHOUT_QWEN();
  auto r = cli("--text 'Hello world' --json");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "[9707, 1879]\n");
  r = cli("--text 'Hello world'");
  EXPECT_EQ(r.out, "9707\n1879\n");
  const fs::path d = temp_dir("cli");
  write_file(d / "in.txt", "<|im_start|>user\nHello!<|im_end|>");
  r = cli("--file " + (d / "in.txt").string() + " --json");
  EXPECT_EQ(r.out, "[151644, 872, 198, 9707, 0, 151645]\n") << r.out;
  r = cli("--decode --text '151644, 872 198\n9707,0 151645'");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "<|im_start|>user\nHello!<|im_end|>");
  r = cli("--decode --text '[9707, 1879]' --json");
  EXPECT_EQ(r.out, "\"Hello world\"\n");
  r = cli("--decode --text '9707 151665'");  // input data: exit 3
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("151665"), std::string::npos) << r.out;
  r = cli("--decode --text '9707 x'");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("is not a token id"), std::string::npos) << r.out;
  r = st::testing::run_shell(std::string(SHARDTRAIN_BINARY) + " tokenize --tokenizer /nonexistent --text x");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("/nonexistent"), std::string::npos) << r.out;
  r = cli("");  // usage: exit 2
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("give --text STR or --file F"), std::string::npos) << r.out;
  r = cli("--bench --file " + (d / "in.txt").string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("MB/s"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace st

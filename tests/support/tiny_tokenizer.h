// Small synthetic Qwen2-style tokenizers (the real Qwen files are not needed): the 256
// byte-level symbols, merges, added tokens, the Qwen2 pipeline, written in the
// tokenizer.json and the vocab.json + merges.txt forms. Used by the tokenizer tests
// (tests/data/test_tokenizer.cpp), by fuzz_tokenizer_encode (its fixed tokenizer) and
// by fuzz/make_corpus (seeds for fuzz_tokenizer).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace st::testing {

inline std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// GPT-2's byte -> code point table: printable bytes stand for themselves.
inline std::string byte_symbol(int b) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t extra = 0;
    for (int i = 0; i < 256; ++i) {
      const bool p = (i >= 0x21 && i <= 0x7E) || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE && i <= 0xFF);
      t[i] = p ? uint32_t(i) : 0x100 + extra++;
    }
    return t;
  }();
  return utf8(table[b]);
}

inline constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct TinyTokenizer {
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<std::pair<std::string, int>> added;  // content, id
};

// Byte b has id b; each merge's result (when new) the next id; then the added tokens.
inline TinyTokenizer byte_level_tokenizer(std::vector<std::pair<std::string, std::string>> merges,
                                          const std::vector<std::string>& added) {
  TinyTokenizer t;
  int id = 0;
  for (int b = 0; b < 256; ++b) t.vocab[byte_symbol(b)] = id++;
  t.merges = std::move(merges);
  for (const auto& [a, b] : t.merges)
    if (!t.vocab.contains(a + b)) t.vocab[a + b] = id++;
  for (const std::string& s : added) t.added.emplace_back(s, id++);
  return t;
}

// "Ġ" is the byte-level spelling of a space. The merges make a few words, "é" (C3 A9)
// and "ä½ł" (E4 BD A0, a CJK character) whole tokens, so that BPE and NFC both have
// work to do.
inline TinyTokenizer tiny_tokenizer() {
  const std::string sp = byte_symbol(' '), nl = byte_symbol('\n');
  return byte_level_tokenizer({{"t", "h"}, {"th", "e"}, {sp, "the"}, {"i", "n"}, {sp, "in"}, {"e", "r"}, {sp, "t"},
                               {"a", "n"}, {"an", "d"}, {sp, "and"}, {"o", "n"}, {nl, nl}, {sp, sp},
                               {byte_symbol(0xC3), byte_symbol(0xA9)}, {byte_symbol(0xE4), byte_symbol(0xBD)},
                               {byte_symbol(0xE4) + byte_symbol(0xBD), byte_symbol(0xA0)}, {"1", "2"}, {"'", "s"}},
                              {"<|endoftext|>", "<|im_start|>", "<|im_end|>"});
}

inline nlohmann::ordered_json added_token_json(const std::string& content, int id) {
  return {{"id", id},           {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},    {"normalized", false}, {"special", true}};
}

// tokenizer.json as Hugging Face tokenizers writes it for Qwen2.5 (NFC normalizer, or
// none when nfc is false).
inline std::string tokenizer_json(const TinyTokenizer& t, bool nfc = true) {
  using oj = nlohmann::ordered_json;
  oj merges = oj::array(), added = oj::array();
  for (const auto& [a, b] : t.merges) merges.push_back(a + " " + b);
  for (const auto& [c, id] : t.added) added.push_back(added_token_json(c, id));
  const oj bl = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  oj j = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added}};
  j["normalizer"] = nfc ? oj{{"type", "NFC"}} : oj();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", kQwen2Regex}}}, {"behavior", "Isolated"},
                           {"invert", false}},
                          bl}}};
  j["post_processor"] = bl;
  j["decoder"] = bl;
  j["model"] = {{"type", "BPE"},         {"dropout", nullptr},        {"unk_token", nullptr},
                {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""}, {"fuse_unk", false},
                {"byte_fallback", false}, {"ignore_merges", false},   {"vocab", t.vocab},
                {"merges", merges}};
  return j.dump();
}

inline std::string vocab_json(const TinyTokenizer& t) { return t.vocab.dump(); }

inline std::string merges_txt(const TinyTokenizer& t) {
  std::string s = "#version: 0.2\n";
  for (const auto& [a, b] : t.merges) s += a + " " + b + "\n";
  return s;
}

inline std::string tokenizer_config_json(const TinyTokenizer& t) {
  nlohmann::ordered_json atd = nlohmann::ordered_json::object();
  for (const auto& [c, id] : t.added) {
    auto e = added_token_json(c, id);
    e.erase("id");
    atd[std::to_string(id)] = e;
  }
  return nlohmann::ordered_json{{"add_prefix_space", false},
                                {"added_tokens_decoder", atd},
                                {"eos_token", "<|endoftext|>"},
                                {"tokenizer_class", "Qwen2Tokenizer"}}
      .dump();
}

}  // namespace st::testing

// Inside the data room only: what a Hugging Face tokenizer directory says, read and
// checked by tokenizer_json.cpp (tokenizer.json, or vocab.json + merges.txt +
// tokenizer_config.json) and turned into the encoder's tables by tokenizer.cpp.
// read_tokenizer_files is where every file error of Tokenizer::load comes from: it
// names the file and what is wrong, and refuses by name a model, normalizer,
// pre-tokenizer, decoder or added-token flag other than Qwen2's (tokenizer.h).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace st {

// The pre-tokenizer regex of Qwen2 / Qwen2.5 / Qwen3 exactly as tokenizer.json spells it
// (and transformers' PRETOKENIZE_REGEX).
inline constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct AddedToken {
  int32_t id;
  std::string content;
  bool special;
};

struct TokenizerFiles {
  std::string source;  // "tokenizer.json" or "vocab.json + merges.txt"
  bool nfc = true;
  bool ignore_merges = false;
  int vocab_entries = 0, num_merges = 0;
  std::unordered_map<std::string, int32_t> vocab;  // byte-level spelling -> id
  std::vector<std::string> id_bytes;               // id -> bytes (added tokens: content)
  std::vector<uint8_t> assigned;                   // id -> 0 none, 1 vocab, 2 added, 3 added special
  std::array<int32_t, 256> byte_id{};
  std::vector<std::array<int32_t, 3>> merge_list;  // (left, right, merged); rank = index
  std::vector<AddedToken> added;
  std::unordered_map<std::string, int32_t> added_by_content;
  int32_t eos = -1;
};

// Reads the tokenizer directory `dir` into `out` (tokenizer_json.cpp); st::Error on
// anything missing, malformed or unsupported.
void read_tokenizer_files(const std::string& dir, TokenizerFiles& out);

// The GPT-2 byte -> unicode table of byte-level BPE: printable bytes stand for
// themselves, the others for U+0100 onwards (tokenizer.cpp).
std::array<uint32_t, 256> byte_to_unicode();

}  // namespace st

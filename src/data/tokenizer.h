// The Qwen2 / Qwen2.5 byte-level BPE tokenizer, compatible id for id with Hugging Face
// `tokenizers` (tokenizer.json) on the files Qwen ships (reference facts:
// shared/tokenizers/qwen2.5/README.md). encode(text) is what the Rust tokenizer's
// encode(text, add_special_tokens=False) returns:
//   1. added tokens (<|endoftext|>, <|im_start|>, ...) are matched in the raw text,
//      leftmost first and longest at one position; each becomes its id;
//   2. the text between them is NFC-normalized (libutf8proc), when the tokenizer says so;
//   3. split by the Qwen2 pre-tokenizer regex (PCRE2, UTF + UCP, JIT where available);
//   4. each piece's UTF-8 bytes go through byte-level BPE: adjacent symbols merged by
//      merge rank (lowest first, leftmost among equals), as the reference does.
//
// Unicode versions. The reference's regex (Oniguruma) has Unicode 16.0 tables and its NFC
// about Unicode 9.0, while PCRE2 10.42 has 14.0 and libutf8proc 2.8 15.0. tokenizer.cpp
// (the regex) and unicode.cpp (NFC) bridge the differences, found by running both over
// every code point: `\s` is spelled as Oniguruma's White_Space ([\t\n\v\f\r\x85\p{Z}];
// PCRE2's \s also takes U+180E), \p{L} / \p{N} get the letters and digits of Unicode
// 15.0-16.0, and the ~110 marks the reference's NFC does not know are left as it leaves
// them. Ids then agree on every code point (and on tests/data/tokenizer/qwen2.5_parity.jsonl)
// with tokenizers 0.23; other library versions may differ on characters assigned in recent
// Unicode versions.
//
// Invalid UTF-8. The reference cannot be given invalid UTF-8: its Python and Node
// bindings take str, and a str holding lone surrogates (Python's surrogateescape) is
// refused by the Rust side, while Node turns them into U+FFFD. Bytes reach it only after
// a decode such as Python's `bytes.decode("utf-8", errors="replace")`. encode() does that
// same decode (utf8_replace_invalid, core/utf8.h): each maximal ill-formed subsequence
// (Unicode 3.9, "substitution of maximal subparts", which is what Python's decoder does)
// becomes U+FFFD, before added-token matching. So encode(bytes) ==
// reference.encode(bytes.decode("utf-8", "replace")) for any bytes, and
// decode(encode(x)) == x when x is valid UTF-8 in NFC.
// Surrogate code points encoded in UTF-8 (ED A0..BF xx), overlong forms and code points
// above U+10FFFF are ill-formed too. encode never throws on any input bytes.
//
// decode() returns the raw bytes of the tokens (added tokens as their text); unlike the
// reference's decode it does not replace bytes that are not valid UTF-8 (a cut in the
// middle of a character stays as it is, so concatenating the decodes of consecutive
// slices gives back the whole).
//
// Thread safety: a loaded Tokenizer is immutable; encode/decode may be called
// concurrently from any number of threads on one const Tokenizer (each thread keeps its
// own small cache of piece -> ids).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace st {

struct TokenizerData;  // the loaded tables (tokenizer.cpp)

class Tokenizer {
 public:
  // Loads a Hugging Face tokenizer directory: tokenizer.json, or vocab.json + merges.txt
  // (+ tokenizer_config.json for the added tokens; its tokenizer_class must be
  // Qwen2Tokenizer[Fast], and then the Qwen2 normalizer and pre-tokenizer are assumed).
  // Errors (st::Error) name the file and what is wrong; a model, normalizer,
  // pre-tokenizer, decoder or added-token flag other than Qwen2's is refused by name.
  static Tokenizer load(const std::string& dir);

  // Token ids of `text` (any bytes; see "Invalid UTF-8" above). No BOS/EOS is added.
  std::vector<int32_t> encode(std::string_view text) const;
  // The bytes of the tokens, concatenated. An id outside [0, vocab_size()) or not
  // assigned to any token is an error naming it.
  std::string decode(const std::vector<int32_t>& ids) const;

  // Every id encode can return is below this (vocab + added tokens): 151665 for Qwen2.5.
  int vocab_size() const;
  // <|endoftext|> (151643 for Qwen2.5), the document separator.
  int32_t eos_id() const;
  // The id of an added token (by its text, e.g. "<|im_end|>") or of a vocabulary entry
  // (spelled as in vocab.json, byte-level: "Ġthe" for " the").
  std::optional<int32_t> token_id(std::string_view token) const;
  // The text of an id: an added token's content or a vocabulary entry's bytes.
  std::string token_bytes(int32_t id) const;
  // e.g. "Qwen2 byte-level BPE, 151643 vocab (151387 merges) + 22 added tokens (dir)"
  std::string describe() const;

  int num_added_tokens() const;
  // Added tokens marked special (the reference's skip_special_tokens drops those).
  bool is_special(int32_t id) const;

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

 private:
  Tokenizer();
  std::unique_ptr<TokenizerData> d_;
};

}  // namespace st

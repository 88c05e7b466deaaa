// NFC normalization as the reference tokenizer (Hugging Face tokenizers 0.23) does it,
// for the tokenizer's normalizer step (tokenizer.h, step 2). libutf8proc (Unicode 15)
// does the normalizing; the marks the reference's NFC (about Unicode 9.0) does not know
// are left as it leaves them (kNfcUnknown in unicode.cpp says how they were found), and
// tests/data/tokenizer/qwen2.5_parity.jsonl checks the result.
//
// Both functions take valid UTF-8 (core/utf8.h checks and repairs bytes) and are safe
// to call from any number of threads; the quick-check table is built once, on first use.
#pragma once
#include <string>
#include <string_view>

namespace st {

// True when `s` (valid UTF-8) is certainly in NFC already (UAX #15 quick check): then
// nfc_like_reference(s) == s, and the normalizer can be skipped.
bool nfc_quick_yes(std::string_view s);

// NFC of `s` (valid UTF-8) as the reference computes it: libutf8proc's NFC over the
// stretches between the code points the reference does not know, which stay as they are.
// A libutf8proc failure is an st::Error.
std::string nfc_like_reference(std::string_view s);

}  // namespace st

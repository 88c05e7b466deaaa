// UTF-8 as bytes: the well-formed sequences of Unicode Table 3-7, decoding and encoding
// one code point, and the replacement of ill-formed input as Python's
// bytes.decode("utf-8", errors="replace") does it. No Unicode data (categories,
// normalization) is needed here; that is data/unicode.h. Ill-formed means what the
// standard says: surrogate code points encoded in UTF-8 (ED A0..BF xx), overlong forms
// and code points above U+10FFFF are ill-formed too.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace st {

// Length of the well-formed UTF-8 sequence at s[i..n), or 0 when ill-formed; `sub` gets
// the length of the maximal subpart to replace (>= 1) when ill-formed (Unicode Table 3-7).
inline int utf8_seq(const unsigned char* s, size_t i, size_t n, int* sub) {
  const unsigned char c = s[i];
  if (c < 0x80) return 1;
  int len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) len = 2;
  else if (c == 0xE0) len = 3, lo = 0xA0;
  else if (c == 0xED) len = 3, hi = 0x9F;
  else if (c >= 0xE1 && c <= 0xEF) len = 3;
  else if (c == 0xF0) len = 4, lo = 0x90;
  else if (c >= 0xF1 && c <= 0xF3) len = 4;
  else if (c == 0xF4) len = 4, hi = 0x8F;
  else {
    *sub = 1;
    return 0;
  }
  for (int k = 1; k < len; ++k) {
    if (i + k >= n) {
      *sub = k;
      return 0;
    }
    const unsigned char b = s[i + k];
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) {
      *sub = k;
      return 0;
    }
  }
  return len;
}

// Decodes the well-formed sequence of `len` bytes at p.
inline uint32_t utf8_decode(const unsigned char* p, int len) {
  switch (len) {
    case 1: return p[0];
    case 2: return (uint32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    case 3: return (uint32_t(p[0] & 0x0F) << 12) | (uint32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    default:
      return (uint32_t(p[0] & 0x07) << 18) | (uint32_t(p[1] & 0x3F) << 12) | (uint32_t(p[2] & 0x3F) << 6) |
             (p[3] & 0x3F);
  }
}

// Appends the UTF-8 of code point `cp` (at most U+10FFFF) to `out`.
void utf8_append(std::string& out, uint32_t cp);

// Index of the first ill-formed byte, or n.
size_t utf8_first_invalid(std::string_view text);

// `bytes` with every maximal ill-formed UTF-8 subsequence replaced by U+FFFD, as
// Python's bytes.decode("utf-8", errors="replace") does; valid input comes back as is.
std::string utf8_replace_invalid(std::string_view bytes);

}  // namespace st

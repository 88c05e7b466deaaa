#include "core/utf8.h"

#include <cstddef>

namespace st {
namespace {

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

}  // namespace

std::string utf8_replace_invalid(std::string_view bytes) {
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  std::string out(bytes.substr(0, i));
  if (i == n) return out;
  out.reserve(n + 16);
  while (i < n) {
    if (s[i] < 0x80) {
      out += static_cast<char>(s[i++]);
      continue;
    }
    int sub = 0;
    const int len = utf8_seq(s, i, n, &sub);
    if (len > 0) {
      out.append(bytes.substr(i, len));
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      i += sub;
    }
  }
  return out;
}

}  // namespace st

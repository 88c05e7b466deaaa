// The NFC quick-check table and the reference-like NFC (unicode.h has the contract).
#include "data/unicode.h"

#include <utf8proc.h>

#include <cstdint>
#include <cstdlib>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/utf8.h"

namespace st {
namespace {

// Code points whose normalization data the reference's NFC (unicode-normalization-
// alignments, about Unicode 9.0) lacks while libutf8proc (Unicode 15) has it: combining
// marks it gives class 0, and the Dives Akuru pair 11935 + 11930 -> 11938 it does not
// compose. Found the same way (every code point, alone and next to marks, through both).
// The reference treats them as starters that compose with nothing, so NFC runs on the text
// between them. A newer libutf8proc would know more such marks (the parity test shows it).
constexpr std::pair<uint32_t, uint32_t> kNfcUnknown[] = {
    {0x7FD, 0x7FD},     {0x898, 0x89F},     {0x8CA, 0x8D3},     {0x9FE, 0x9FE},     {0xC3C, 0xC3C},
    {0xD3B, 0xD3C},     {0xEBA, 0xEBA},     {0x1715, 0x1715},   {0x1ABF, 0x1ACE},   {0x1DF6, 0x1DFA},
    {0xA82C, 0xA82C},   {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50},
    {0x10F82, 0x10F85}, {0x11070, 0x11070}, {0x1133B, 0x1133B}, {0x1145E, 0x1145E}, {0x11839, 0x1183A},
    {0x11930, 0x11930}, {0x11935, 0x11935}, {0x11938, 0x11938}, {0x1193D, 0x1193E}, {0x11943, 0x11943},
    {0x119E0, 0x119E0}, {0x11A34, 0x11A34}, {0x11A47, 0x11A47}, {0x11A99, 0x11A99}, {0x11D42, 0x11D42},
    {0x11D44, 0x11D45}, {0x11D97, 0x11D97}, {0x11F41, 0x11F42}, {0x16FF0, 0x16FF1}, {0x1E08F, 0x1E08F},
    {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF}};

// ---- NFC quick check ----------------------------------------------------------------

// Code points whose NFC quick-check property is not Yes: No (never in NFC: singletons,
// exclusions) or Maybe (may compose with what precedes: second elements of primary
// composites, computed here as every non-first element of a canonical decomposition, a
// superset). Built once from libutf8proc's own data, so it agrees with utf8proc_map.
class NfcTable {
 public:
  static const NfcTable& get() {
    static const NfcTable t;
    return t;
  }
  bool not_yes(uint32_t cp) const { return (bits_[cp >> 6] >> (cp & 63)) & 1; }
  // In kNfcUnknown: a boundary the reference's NFC leaves as it is.
  bool unknown(uint32_t cp) const { return (unknown_[cp >> 6] >> (cp & 63)) & 1; }

 private:
  NfcTable() : bits_(0x110000 / 64, 0), unknown_(0x110000 / 64, 0) {
    for (const auto& [lo, hi] : kNfcUnknown)
      for (uint32_t cp = lo; cp <= hi; ++cp) unknown_[cp >> 6] |= uint64_t(1) << (cp & 63);
    auto set = [&](uint32_t cp) { bits_[cp >> 6] |= uint64_t(1) << (cp & 63); };
    for (uint32_t cp = 0x1161; cp <= 0x1175; ++cp) set(cp);  // Hangul V jamo
    for (uint32_t cp = 0x11A8; cp <= 0x11C2; ++cp) set(cp);  // Hangul T jamo
    utf8proc_int32_t buf[32];
    for (uint32_t cp = 0xA0; cp < 0x110000; ++cp) {
      if ((cp >= 0xD800 && cp <= 0xDFFF) || (cp >= 0xAC00 && cp <= 0xD7A3)) continue;  // Hangul LV/LVT: Yes
      int boundclass = 0;
      const auto n =
          utf8proc_decompose_char(static_cast<utf8proc_int32_t>(cp), buf, 32, UTF8PROC_DECOMPOSE, &boundclass);
      if (n <= 0 || (n == 1 && uint32_t(buf[0]) == cp)) continue;  // no canonical decomposition
      for (int k = 1; k < n && k < 32; ++k) set(static_cast<uint32_t>(buf[k]));
      // Does it survive NFC as itself?
      std::string one;
      utf8_append(one, cp);
      utf8proc_uint8_t* out = nullptr;
      const auto m = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(one.data()),
                                  static_cast<utf8proc_ssize_t>(one.size()), &out,
                                  utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
      if (m < 0 || std::string_view(reinterpret_cast<char*>(out), size_t(m)) != one) set(cp);
      std::free(out);
    }
  }
  std::vector<uint64_t> bits_, unknown_;
};

}  // namespace

bool nfc_quick_yes(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  // Everything below U+0300 (lead byte < 0xCC) is NFC_QC=Yes with combining class 0.
  while (i < n && p[i] < 0xCC) ++i;
  if (i == n) return true;
  const NfcTable& table = NfcTable::get();
  int last_ccc = 0;
  i = 0;
  while (i < n) {
    if (p[i] < 0xCC) {
      last_ccc = 0;
      i += p[i] < 0x80 ? 1 : 2;  // bytes < 0xCC start sequences of at most 2 bytes
      continue;
    }
    const int len = p[i] < 0xE0 ? 2 : p[i] < 0xF0 ? 3 : 4;
    const uint32_t cp = utf8_decode(p + i, len);
    i += len;
    if (table.unknown(cp)) {
      last_ccc = 0;
      continue;
    }
    if (table.not_yes(cp)) return false;
    const int ccc = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp))->combining_class;
    if (ccc != 0 && last_ccc > ccc) return false;
    last_ccc = ccc;
  }
  return true;
}

std::string nfc_like_reference(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  auto nfc = [&](std::string_view part) {
    if (part.empty()) return;
    utf8proc_uint8_t* buf = nullptr;
    const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(part.data()),
                                static_cast<utf8proc_ssize_t>(part.size()), &buf,
                                utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    if (n < 0) {
      std::free(buf);
      fail("NFC normalization failed: ", utf8proc_errmsg(n));
    }
    out.append(reinterpret_cast<char*>(buf), size_t(n));
    std::free(buf);
  };
  const NfcTable& table = NfcTable::get();
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t start = 0, i = 0;
  while (i < s.size()) {
    const int len = p[i] < 0x80 ? 1 : p[i] < 0xE0 ? 2 : p[i] < 0xF0 ? 3 : 4;
    if (len >= 2 && table.unknown(utf8_decode(p + i, len))) {
      nfc(s.substr(start, i - start));
      out.append(s.substr(i, len));
      start = i + len;
    }
    i += len;
  }
  nfc(s.substr(start));
  return out;
}

}  // namespace st

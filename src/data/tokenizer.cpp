// The Qwen2 byte-level BPE tokenizer (tokenizer.h has the pipeline and the contract).
#include "data/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace st {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

// The pre-tokenizer regex of Qwen2 / Qwen2.5 / Qwen3 exactly as tokenizer.json spells it
// (and transformers' PRETOKENIZE_REGEX).
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// The same regex for PCRE2, made to classify code points as the reference does. The
// reference (tokenizers 0.23) runs it through Oniguruma with Unicode 16.0 tables, while
// PCRE2 10.42 (Debian 12) has Unicode 14.0. So:
//  - \s is spelled as Oniguruma's (Unicode White_Space: TAB..CR, NEL and the Z
//    categories); PCRE2's own \s also takes U+180E;
//  - \p{L} and \p{N} get the letters and digits that Unicode 15.0-16.0 assigned (found by
//    running the reference's pre-tokenizer over every code point and comparing with
//    PCRE2 10.42: only additions differ). With a newer PCRE2 they are already there.
// tests/data/tokenizer/qwen2.5_parity.jsonl checks the result against the reference.
constexpr const char* kWs = R"(\t\n\x0B\f\r\x{85}\p{Z})";
constexpr const char* kLetters =
    R"(\p{L}\x{1C89}-\x{1C8A}\x{A7CB}-\x{A7CD}\x{A7DA}-\x{A7DC}\x{105C0}-\x{105F3}\x{10D4A}-\x{10D65})"
    R"(\x{10D6F}-\x{10D85}\x{10EC2}-\x{10EC4}\x{1123F}-\x{11240}\x{11380}-\x{11389}\x{1138B}\x{1138E})"
    R"(\x{11390}-\x{113B5}\x{113B7}\x{113D1}\x{113D3}\x{11BC0}-\x{11BE0}\x{11F02}\x{11F04}-\x{11F10})"
    R"(\x{11F12}-\x{11F33}\x{1342F}\x{13441}-\x{13446}\x{13460}-\x{143FA}\x{16100}-\x{1611D})"
    R"(\x{16D40}-\x{16D6C}\x{18CFF}\x{1B132}\x{1B155}\x{1DF25}-\x{1DF2A}\x{1E030}-\x{1E06D})"
    R"(\x{1E4D0}-\x{1E4EB}\x{1E5D0}-\x{1E5ED}\x{1E5F0}\x{2B739}\x{2EBF0}-\x{2EE5D}\x{31350}-\x{323AF})";
constexpr const char* kNumbers =
    R"(\p{N}\x{10D40}-\x{10D49}\x{116D0}-\x{116E3}\x{11BF0}-\x{11BF9}\x{11F50}-\x{11F59}\x{16130}-\x{16139})"
    R"(\x{16D70}-\x{16D79}\x{1CCF0}-\x{1CCF9}\x{1D2C0}-\x{1D2D3}\x{1E4F0}-\x{1E4F9}\x{1E5F1}-\x{1E5FA})";

std::string qwen2_pcre2_pattern() {
  const std::string ws = kWs, l = kLetters, n = kNumbers;
  return "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n" + l + n + "]?[" + l + "]+|[" + n + "]| ?[^" + ws + l + n +
         "]+[\\r\\n]*|[" + ws + "]*[\\r\\n]+|[" + ws + "]+(?![^" + ws + "])|[" + ws + "]+";
}

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

// ---- UTF-8 ------------------------------------------------------------------------

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

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

// Index of the first ill-formed byte, or n.
size_t utf8_first_invalid(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    // ASCII eight at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    int sub = 0;
    const int len = utf8_seq(s, i, n, &sub);
    if (len == 0) return i;
    i += len;
  }
  return n;
}

// ---- the GPT-2 byte <-> unicode table -------------------------------------------------

std::array<uint32_t, 256> byte_to_unicode() {
  std::array<uint32_t, 256> t{};
  uint32_t extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    t[b] = printable ? uint32_t(b) : 0x100 + extra++;
  }
  return t;
}

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

// True when `s` (valid UTF-8) is certainly in NFC already (UAX #15 quick check).
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

// ---- merges: (left id, right id) -> (rank, merged id), open addressing ------------------

class MergeTable {
 public:
  struct Value {
    int32_t rank, id;
  };
  void build(const std::vector<std::array<int32_t, 3>>& merges) {  // (left, right, merged); rank = index
    size_t cap = 16;
    while (cap < merges.size() * 2 + 16) cap <<= 1;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, Value{-1, -1});
    mask_ = cap - 1;
    for (size_t r = 0; r < merges.size(); ++r) {
      const uint64_t key = pack(merges[r][0], merges[r][1]);
      size_t h = hash(key) & mask_;
      while (keys_[h] != kEmpty && keys_[h] != key) h = (h + 1) & mask_;
      if (keys_[h] == key) continue;  // a repeated pair keeps its first (lowest) rank
      keys_[h] = key;
      vals_[h] = Value{static_cast<int32_t>(r), merges[r][2]};
    }
  }
  const Value* find(int32_t a, int32_t b) const {
    const uint64_t key = pack(a, b);
    size_t h = hash(key) & mask_;
    while (true) {
      if (keys_[h] == key) return &vals_[h];
      if (keys_[h] == kEmpty) return nullptr;
      h = (h + 1) & mask_;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  static uint64_t pack(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  static uint64_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
  }
  std::vector<uint64_t> keys_;
  std::vector<Value> vals_;
  size_t mask_ = 0;
};

// ---- added tokens: a byte trie for leftmost-longest matching -----------------------------

class AddedTrie {
 public:
  void add(std::string_view s, int32_t id) {
    if (nodes_.empty()) nodes_.emplace_back();
    int cur = 0;
    for (unsigned char c : s) {
      auto it = nodes_[cur].next.find(c);
      if (it == nodes_[cur].next.end()) {
        nodes_.emplace_back();
        const int nn = static_cast<int>(nodes_.size()) - 1;
        nodes_[cur].next[c] = nn;
        cur = nn;
      } else {
        cur = it->second;
      }
    }
    nodes_[cur].id = id;
    first_[static_cast<unsigned char>(s[0])] = true;
  }
  bool empty() const { return nodes_.empty(); }
  // The longest token starting at text[i]: (id, length) or (-1, 0).
  std::pair<int32_t, size_t> longest_at(std::string_view text, size_t i) const {
    if (!first_[static_cast<unsigned char>(text[i])]) return {-1, 0};
    int cur = 0;
    std::pair<int32_t, size_t> best{-1, 0};
    for (size_t k = i; k < text.size(); ++k) {
      auto it = nodes_[cur].next.find(static_cast<unsigned char>(text[k]));
      if (it == nodes_[cur].next.end()) break;
      cur = it->second;
      if (nodes_[cur].id >= 0) best = {nodes_[cur].id, k + 1 - i};
    }
    return best;
  }
  bool can_start(unsigned char c) const { return first_[c]; }

 private:
  struct Node {
    std::unordered_map<unsigned char, int> next;
    int32_t id = -1;
  };
  std::vector<Node> nodes_;
  std::array<bool, 256> first_{};
};

std::atomic<uint64_t> g_next_uid{1};

}  // namespace

// ---- the loaded tables ------------------------------------------------------------------

struct AddedToken {
  int32_t id;
  std::string content;
  bool special;
};

struct TokenizerData {
  std::string dir, source;  // source: "tokenizer.json" or "vocab.json + merges.txt"
  uint64_t uid = 0;
  bool nfc = true;
  bool ignore_merges = false;
  int vocab_entries = 0, num_merges = 0;
  std::unordered_map<std::string, int32_t> vocab;  // byte-level spelling -> id
  std::vector<std::string> id_bytes;               // id -> bytes (added tokens: content)
  std::vector<uint8_t> assigned;                   // id -> 0 none, 1 vocab, 2 added, 3 added special
  std::array<int32_t, 256> byte_id{};
  MergeTable merges;
  std::vector<AddedToken> added;
  std::unordered_map<std::string, int32_t> added_by_content;
  AddedTrie trie;
  int32_t eos = -1;
  pcre2_code* re = nullptr;
  bool jit = false;

  ~TokenizerData() {
    if (re) pcre2_code_free(re);
  }
};

namespace {

// ---- loading ------------------------------------------------------------------------------

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  ST_CHECK(in, p.string(), ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  ST_CHECK(!in.bad(), p.string(), ": read error");
  return ss.str();
}

json parse_json(const fs::path& p) {
  const std::string text = read_file(p);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail(p.string(), ": not valid JSON: ", e.what());
  }
}

std::string jtype(const json& j) {
  if (j.is_object() && j.contains("type") && j["type"].is_string()) return j["type"].get<std::string>();
  return j.is_null() ? "null" : j.dump().substr(0, 80);
}

bool jbool(const json& obj, const char* key, bool dflt) {
  if (!obj.contains(key) || obj[key].is_null()) return dflt;
  return obj[key].is_boolean() ? obj[key].get<bool>() : dflt;
}

// obj[key] when it is a string, its JSON text when it is something else (which then
// matches no name), `dflt` when absent. (json::value() throws a json::type_error.)
std::string jstring(const json& obj, const char* key, const std::string& dflt) {
  if (!obj.contains(key)) return dflt;
  return obj[key].is_string() ? obj[key].get<std::string>() : obj[key].dump();
}

// Decodes a byte-level token spelling to bytes; false when a character is outside the
// table (such a token then decodes to its own UTF-8, as the reference's ByteLevel does).
bool bytelevel_to_bytes(const std::string& tok, const std::unordered_map<uint32_t, uint8_t>& inv, std::string& out) {
  out.clear();
  const auto* p = reinterpret_cast<const unsigned char*>(tok.data());
  size_t i = 0;
  while (i < tok.size()) {
    int sub = 0;
    const int len = utf8_seq(p, i, tok.size(), &sub);
    if (len == 0) return false;
    const uint32_t cp = utf8_decode(p + i, len);
    auto it = inv.find(cp);
    if (it == inv.end()) return false;
    out += static_cast<char>(it->second);
    i += len;
  }
  return true;
}

// Ids index dense tables of max id + 1 entries (bytes, flags), so one stray huge id
// would cost gigabytes: ids stay below 2^24, 100 times Qwen2.5's 151665.
constexpr int64_t kTokenIdLimit = int64_t(1) << 24;

void add_added_token(TokenizerData& d, const json& t, const std::string& where) {
  ST_CHECK(t.is_object() && t.contains("content") && t["content"].is_string(), where,
           ": an added token without a \"content\" string");
  const std::string content = t["content"].get<std::string>();
  ST_CHECK(t.contains("id") && t["id"].is_number_integer(), where, ": added token \"", content, "\" has no integer id");
  const int64_t id = t["id"].get<int64_t>();
  ST_CHECK(id >= 0 && id < kTokenIdLimit, where, ": added token \"", content, "\" has id ", id, " out of range");
  ST_CHECK(!content.empty(), where, ": an added token (id ", id, ") has empty content");
  ST_CHECK(utf8_first_invalid(content) == content.size(), where, ": added token ", id, " is not valid UTF-8");
  for (const char* flag : {"lstrip", "rstrip", "single_word", "normalized"})
    ST_CHECK(!jbool(t, flag, false), where, ": added token \"", content, "\" (id ", id, ") has ", flag,
             "=true, which this tokenizer does not implement (Qwen2's added tokens have it false)");
  ST_CHECK(!d.added_by_content.count(content), where, ": added token \"", content, "\" appears twice");
  d.added.push_back({static_cast<int32_t>(id), content, jbool(t, "special", false)});
  d.added_by_content[content] = static_cast<int32_t>(id);
}

void check_tokenizer_json_pipeline(TokenizerData& d, const json& j, const std::string& f) {
  const json null_json;
  auto field = [&](const char* k) -> const json& { return j.contains(k) ? j[k] : null_json; };
  ST_CHECK(field("truncation").is_null(), f, ": truncation is set; refusing (Qwen2's is null)");
  ST_CHECK(field("padding").is_null(), f, ": padding is set; refusing (Qwen2's is null)");

  // normalizer: NFC, or none, or a Sequence of just NFC.
  const json& norm = field("normalizer");
  if (norm.is_null()) {
    d.nfc = false;
  } else {
    const std::string t = jtype(norm);
    if (t == "NFC") {
      d.nfc = true;
    } else if (t == "Sequence" && norm.contains("normalizers") && norm["normalizers"].is_array() &&
               norm["normalizers"].size() == 1 && jtype(norm["normalizers"][0]) == "NFC") {
      d.nfc = true;
    } else {
      fail(f, ": normalizer ", t, " is not supported (only NFC, Qwen2's)");
    }
  }

  // pre_tokenizer: Sequence [Split(Qwen2 regex, Isolated, invert false), ByteLevel(no prefix space, no regex)].
  const json& pre = field("pre_tokenizer");
  ST_CHECK(jtype(pre) == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].is_array(), f,
           ": pre_tokenizer ", jtype(pre), " is not supported (only Qwen2's Sequence of Split + ByteLevel)");
  const json& seq = pre["pretokenizers"];
  ST_CHECK(seq.size() == 2, f, ": pre_tokenizer Sequence has ", seq.size(),
           " parts; only Qwen2's Split + ByteLevel is supported");
  const json& split = seq[0];
  ST_CHECK(jtype(split) == "Split", f, ": pre_tokenizer ", jtype(split),
           " is not supported (Qwen2's first pre-tokenizer is Split)");
  ST_CHECK(split.contains("pattern") && split["pattern"].is_object() && split["pattern"].contains("Regex") &&
               split["pattern"]["Regex"].is_string(),
           f, ": pre_tokenizer Split has no Regex pattern");
  const std::string regex = split["pattern"]["Regex"].get<std::string>();
  ST_CHECK(regex == kQwen2Regex, f, ": pre_tokenizer Split regex is not Qwen2's, refusing: ", regex);
  ST_CHECK(jstring(split, "behavior", "") == "Isolated", f, ": pre_tokenizer Split behavior ",
           jstring(split, "behavior", "(none)"), " is not supported (only Isolated)");
  ST_CHECK(!jbool(split, "invert", false), f, ": pre_tokenizer Split invert=true is not supported");
  const json& bl = seq[1];
  ST_CHECK(jtype(bl) == "ByteLevel", f, ": pre_tokenizer ", jtype(bl),
           " is not supported (Qwen2's second pre-tokenizer is ByteLevel)");
  ST_CHECK(!jbool(bl, "add_prefix_space", false), f,
           ": pre_tokenizer ByteLevel add_prefix_space=true is not supported");
  ST_CHECK(!jbool(bl, "use_regex", true), f, ": pre_tokenizer ByteLevel use_regex=true is not supported");

  const json& dec = field("decoder");
  ST_CHECK(dec.is_null() || jtype(dec) == "ByteLevel", f, ": decoder ", jtype(dec),
           " is not supported (only ByteLevel)");
  const json& post = field("post_processor");
  ST_CHECK(post.is_null() || jtype(post) == "ByteLevel", f, ": post_processor ", jtype(post),
           " is not supported (only ByteLevel)");

  const json& m = field("model");
  ST_CHECK(m.is_object(), f, ": no model");
  const std::string mt = m.contains("type") ? jtype(m) : std::string("BPE");
  ST_CHECK(mt == "BPE", f, ": model type ", mt, " is not supported (only BPE)");
  ST_CHECK(!m.contains("dropout") || m["dropout"].is_null() ||
               (m["dropout"].is_number() && m["dropout"].get<double>() == 0.0),
           f, ": model dropout ", m.value("dropout", json()).dump(), " is not supported");
  ST_CHECK(!jbool(m, "byte_fallback", false), f, ": model byte_fallback=true is not supported");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    ST_CHECK(!m.contains(k) || m[k].is_null() || (m[k].is_string() && m[k].get<std::string>().empty()), f,
             ": model ", k, " ", m[k].dump(), " is not supported (only empty)");
  d.ignore_merges = jbool(m, "ignore_merges", false);
}

void build_vocab(TokenizerData& d, const json& vocab, const std::string& f) {
  ST_CHECK(vocab.is_object(), f, ": vocab is not a JSON object");
  d.vocab.reserve(vocab.size() * 2);
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    ST_CHECK(it.value().is_number_integer(), f, ": vocab entry \"", it.key(), "\" has no integer id");
    const int64_t id = it.value().get<int64_t>();
    ST_CHECK(id >= 0 && id < kTokenIdLimit, f, ": vocab entry \"", it.key(), "\" has id ", id, " out of range");
    d.vocab.emplace(it.key(), static_cast<int32_t>(id));
    max_id = std::max<int32_t>(max_id, static_cast<int32_t>(id));
  }
  d.vocab_entries = static_cast<int>(d.vocab.size());
  ST_CHECK(!d.vocab.empty(), f, ": empty vocab");
  d.id_bytes.assign(size_t(max_id) + 1, std::string());
  d.assigned.assign(size_t(max_id) + 1, 0);
  const auto b2u = byte_to_unicode();
  std::unordered_map<uint32_t, uint8_t> inv;
  for (int b = 0; b < 256; ++b) inv[b2u[b]] = static_cast<uint8_t>(b);
  std::string bytes;
  for (const auto& [tok, id] : d.vocab) {
    ST_CHECK(!d.assigned[id], f, ": id ", id, " is given to two vocab entries");
    d.assigned[id] = 1;
    d.id_bytes[id] = bytelevel_to_bytes(tok, inv, bytes) ? bytes : tok;
  }
  for (int b = 0; b < 256; ++b) {
    std::string s;
    utf8_append(s, b2u[b]);
    auto it = d.vocab.find(s);
    ST_CHECK(it != d.vocab.end(), f, ": vocab lacks the byte-level symbol \"", s, "\" of byte 0x", std::hex, b,
             "; not a byte-level BPE vocabulary");
    d.byte_id[b] = it->second;
  }
}

void build_merges(TokenizerData& d, const std::vector<std::pair<std::string, std::string>>& pairs,
                  const std::string& f) {
  std::vector<std::array<int32_t, 3>> m;
  m.reserve(pairs.size());
  for (size_t r = 0; r < pairs.size(); ++r) {
    const auto& [a, b] = pairs[r];
    auto ia = d.vocab.find(a), ib = d.vocab.find(b), iab = d.vocab.find(a + b);
    ST_CHECK(ia != d.vocab.end() && ib != d.vocab.end(), f, ": merge ", r, " \"", a, " ", b,
             "\" names a token that is not in the vocab");
    ST_CHECK(iab != d.vocab.end(), f, ": merge ", r, " \"", a, " ", b, "\": the merged token \"", a + b,
             "\" is not in the vocab");
    m.push_back({ia->second, ib->second, iab->second});
  }
  d.num_merges = static_cast<int>(m.size());
  d.merges.build(m);
}

void finish(TokenizerData& d, const std::string& f) {
  // Added tokens: ids, bytes, the trie.
  int32_t max_id = static_cast<int32_t>(d.id_bytes.size()) - 1;
  for (const auto& t : d.added) max_id = std::max(max_id, t.id);
  d.id_bytes.resize(size_t(max_id) + 1);
  d.assigned.resize(size_t(max_id) + 1, 0);
  for (const auto& t : d.added) {
    d.id_bytes[t.id] = t.content;
    d.assigned[t.id] = t.special ? 3 : 2;
    d.trie.add(t.content, t.id);
  }
  auto eos = d.added_by_content.find("<|endoftext|>");
  ST_CHECK(eos != d.added_by_content.end(), f, ": no added token <|endoftext|> (the document separator)");
  d.eos = eos->second;

  // The pre-tokenizer regex.
  int err = 0;
  PCRE2_SIZE off = 0;
  const std::string pattern = qwen2_pcre2_pattern();
  d.re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                       &err, &off, nullptr);
  if (!d.re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("PCRE2 cannot compile the Qwen2 pre-tokenizer regex at offset ", off, ": ", reinterpret_cast<char*>(msg));
  }
  uint32_t have_jit = 0;
  pcre2_config(PCRE2_CONFIG_JIT, &have_jit);
  d.jit = have_jit && pcre2_jit_compile(d.re, PCRE2_JIT_COMPLETE) == 0;
  d.uid = g_next_uid.fetch_add(1);
}

std::vector<std::pair<std::string, std::string>> merges_from_json(const json& merges, const std::string& f) {
  ST_CHECK(merges.is_array(), f, ": model.merges is not a list");
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& m = merges[r];
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      ST_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos && sp > 0 && sp + 1 < s.size(), f,
               ": merge ", r, " \"", s, "\" is not \"left right\"");
      out.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      out.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      fail(f, ": merge ", r, " is neither \"left right\" nor [left, right]");
    }
  }
  return out;
}

void load_tokenizer_json(TokenizerData& d, const fs::path& p) {
  const std::string f = p.string();
  const json j = parse_json(p);
  ST_CHECK(j.is_object(), f, ": not a JSON object");
  check_tokenizer_json_pipeline(d, j, f);
  const json& m = j["model"];
  ST_CHECK(m.contains("vocab"), f, ": model has no vocab");
  ST_CHECK(m.contains("merges"), f, ": model has no merges");
  build_vocab(d, m["vocab"], f);
  build_merges(d, merges_from_json(m["merges"], f), f);
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    ST_CHECK(j["added_tokens"].is_array(), f, ": added_tokens is not a list");
    for (const auto& t : j["added_tokens"]) add_added_token(d, t, f);
  }
  d.source = "tokenizer.json";
  finish(d, f);
}

void load_vocab_merges(TokenizerData& d, const fs::path& dir) {
  const fs::path cfg = dir / "tokenizer_config.json";
  ST_CHECK(fs::exists(cfg), cfg.string(),
           ": missing (needed beside vocab.json + merges.txt for the added tokens; or give tokenizer.json)");
  const json c = parse_json(cfg);
  const std::string fc = cfg.string();
  ST_CHECK(c.is_object(), fc, ": not a JSON object");
  const std::string cls = jstring(c, "tokenizer_class", "(none)");
  ST_CHECK(cls == "Qwen2Tokenizer" || cls == "Qwen2TokenizerFast", fc, ": tokenizer_class ", cls,
           " is not supported from vocab.json + merges.txt (only Qwen2Tokenizer)");
  d.nfc = true;  // Qwen2Tokenizer applies NFC

  const fs::path vf = dir / "vocab.json";
  build_vocab(d, parse_json(vf), vf.string());

  const fs::path mf = dir / "merges.txt";
  const std::string text = read_file(mf);
  std::vector<std::pair<std::string, std::string>> pairs;
  size_t pos = 0, line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    ST_CHECK(sp != std::string::npos && line.find(' ', sp + 1) == std::string::npos && sp > 0 && sp + 1 < line.size(),
             mf.string(), ":", line_no, ": not \"left right\": ", line.substr(0, 80));
    pairs.emplace_back(line.substr(0, sp), line.substr(sp + 1));
  }
  build_merges(d, pairs, mf.string());

  if (c.contains("added_tokens_decoder") && !c["added_tokens_decoder"].is_null()) {
    const json& atd = c["added_tokens_decoder"];
    ST_CHECK(atd.is_object(), fc, ": added_tokens_decoder is not an object");
    for (auto it = atd.begin(); it != atd.end(); ++it) {
      json t = it.value();
      ST_CHECK(t.is_object(), fc, ": added_tokens_decoder[", it.key(), "] is not an object");
      char* endp = nullptr;
      const long long id = std::strtoll(it.key().c_str(), &endp, 10);
      ST_CHECK(endp && *endp == 0 && !it.key().empty(), fc, ": added_tokens_decoder key \"", it.key(),
               "\" is not an id");
      t["id"] = id;
      add_added_token(d, t, fc);
    }
  }
  d.source = "vocab.json + merges.txt";
  finish(d, fc);
}

// ---- encoding -----------------------------------------------------------------------------

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct PieceCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
};
constexpr size_t kCacheMaxEntries = 1 << 16;
constexpr size_t kCacheMaxPiece = 64;

struct Scratch {
  struct Sym {
    int32_t id, prev, next;
    bool gone;
  };
  struct Merge {
    int32_t rank, pos, id;
  };
  std::vector<Sym> syms;
  std::vector<Merge> heap;
};

// Byte-level BPE of one piece, appended to `out`: the reference's merge loop (a min-heap
// on (rank, position); stale entries skipped), so ties and odd merge lists agree.
void bpe(const TokenizerData& d, std::string_view piece, std::vector<int32_t>& out, Scratch& s) {
  const size_t n = piece.size();
  if (n == 1) {
    out.push_back(d.byte_id[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (d.ignore_merges) {
    // The reference looks the whole piece up in the vocab first (byte-level spelling).
    static const auto b2u = byte_to_unicode();
    std::string spelled;
    for (unsigned char c : piece) utf8_append(spelled, b2u[c]);
    auto it = d.vocab.find(spelled);
    if (it != d.vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  auto& syms = s.syms;
  auto& heap = s.heap;
  syms.resize(n);
  heap.clear();
  for (size_t i = 0; i < n; ++i)
    syms[i] = {d.byte_id[static_cast<unsigned char>(piece[i])], static_cast<int32_t>(i) - 1,
               i + 1 < n ? static_cast<int32_t>(i + 1) : -1, false};
  auto later = [](const Scratch::Merge& a, const Scratch::Merge& b) {  // min-heap on (rank, pos)
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  for (size_t i = 0; i + 1 < n; ++i)
    if (const auto* m = d.merges.find(syms[i].id, syms[i + 1].id))
      heap.push_back({m->rank, static_cast<int32_t>(i), m->id});
  std::make_heap(heap.begin(), heap.end(), later);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Scratch::Merge top = heap.back();
    heap.pop_back();
    auto& cur = syms[top.pos];
    if (cur.gone || cur.next < 0) continue;
    const int32_t nx = cur.next;
    const auto* m = d.merges.find(cur.id, syms[nx].id);
    if (!m || m->id != top.id) continue;  // stale entry
    cur.id = top.id;
    syms[nx].gone = true;
    cur.next = syms[nx].next;
    if (cur.next >= 0) syms[cur.next].prev = top.pos;
    if (cur.prev >= 0)
      if (const auto* pm = d.merges.find(syms[cur.prev].id, cur.id)) {
        heap.push_back({pm->rank, cur.prev, pm->id});
        std::push_heap(heap.begin(), heap.end(), later);
      }
    if (cur.next >= 0)
      if (const auto* nm = d.merges.find(cur.id, syms[cur.next].id)) {
        heap.push_back({nm->rank, top.pos, nm->id});
        std::push_heap(heap.begin(), heap.end(), later);
      }
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

void encode_piece(const TokenizerData& d, std::string_view piece, std::vector<int32_t>& out, PieceCache& cache,
                  Scratch& s) {
  if (piece.size() == 1) {
    out.push_back(d.byte_id[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (piece.size() <= kCacheMaxPiece) {
    auto it = cache.map.find(piece);
    if (it != cache.map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
    const size_t at = out.size();
    bpe(d, piece, out, s);
    if (cache.map.size() >= kCacheMaxEntries) cache.map.clear();
    cache.map.emplace(std::string(piece), std::vector<int32_t>(out.begin() + at, out.end()));
    return;
  }
  bpe(d, piece, out, s);
}

// NFC of `s` (valid UTF-8) as the reference computes it: libutf8proc's NFC over the
// stretches between the code points of kNfcUnknown, which stay as they are.
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

// One segment between added tokens: normalize, split, BPE.
void encode_segment(const TokenizerData& d, std::string_view seg, std::vector<int32_t>& out, PieceCache& cache,
                    Scratch& s, pcre2_match_data* md) {
  std::string normalized;
  if (d.nfc && !nfc_quick_yes(seg)) {
    normalized = nfc_like_reference(seg);
    seg = normalized;
  }
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(seg.data());
  const size_t len = seg.size();
  size_t off = 0;
  while (off < len) {
    const int rc = d.jit ? pcre2_jit_match(d.re, subject, len, off, PCRE2_NO_UTF_CHECK, md, nullptr)
                         : pcre2_match(d.re, subject, len, off, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) {
      encode_piece(d, seg.substr(off), out, cache, s);  // the gap after the last match is a piece
      return;
    }
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail("pre-tokenizer regex failed at byte ", off, ": ", reinterpret_cast<char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t a = ov[0], b = ov[1];
    if (b <= a) {  // an empty match (the Qwen2 regex has none): step one character as a gap
      b = a + 1;
      while (b < len && (static_cast<unsigned char>(seg[b]) & 0xC0) == 0x80) ++b;
      a = b;  // nothing matched; the character joins the gap below
    }
    if (a > off) encode_piece(d, seg.substr(off, a - off), out, cache, s);
    if (b > a) encode_piece(d, seg.substr(a, b - a), out, cache, s);
    off = b;
  }
}

}  // namespace

// ---- Tokenizer ------------------------------------------------------------------------------

Tokenizer::Tokenizer() : d_(std::make_unique<TokenizerData>()) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::string& dir) {
  // A tokenizer directory that is missing or malformed is a data error (exit 3).
  return classify_errors(ErrorKind::Data, [&] {
    const fs::path p(dir);
    ST_CHECK(fs::is_directory(p), dir, ": not a tokenizer directory (it does not exist or is not a directory)");
    Tokenizer t;
    t.d_->dir = dir;
    if (fs::exists(p / "tokenizer.json")) {
      load_tokenizer_json(*t.d_, p / "tokenizer.json");
    } else if (fs::exists(p / "vocab.json") || fs::exists(p / "merges.txt")) {
      ST_CHECK(fs::exists(p / "vocab.json"), (p / "vocab.json").string(), ": missing (merges.txt is there)");
      ST_CHECK(fs::exists(p / "merges.txt"), (p / "merges.txt").string(), ": missing (vocab.json is there)");
      load_vocab_merges(*t.d_, p);
    } else {
      fail(dir, ": no tokenizer.json, nor vocab.json + merges.txt");
    }
    return t;
  });
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  const TokenizerData& d = *d_;
  std::string fixed;
  if (utf8_first_invalid(text) != text.size()) {
    fixed = utf8_replace_invalid(text);
    text = fixed;
  }
  thread_local PieceCache cache;
  thread_local Scratch scratch;
  if (cache.owner != d.uid) {
    cache.map.clear();
    cache.owner = d.uid;
  }
  struct MatchData {
    pcre2_match_data* md = nullptr;
    ~MatchData() {
      if (md) pcre2_match_data_free(md);
    }
  };
  thread_local MatchData mdata;
  if (!mdata.md) mdata.md = pcre2_match_data_create(4, nullptr);
  ST_CHECK(mdata.md, "out of memory for the regex match data");

  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  size_t seg_start = 0;
  if (!d.trie.empty()) {
    for (size_t i = 0; i < text.size(); ++i) {
      if (!d.trie.can_start(static_cast<unsigned char>(text[i]))) continue;
      const auto [id, len] = d.trie.longest_at(text, i);
      if (id < 0) continue;
      if (i > seg_start) encode_segment(d, text.substr(seg_start, i - seg_start), out, cache, scratch, mdata.md);
      out.push_back(id);
      i += len - 1;
      seg_start = i + 1;
    }
  }
  if (seg_start < text.size()) encode_segment(d, text.substr(seg_start), out, cache, scratch, mdata.md);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (size_t k = 0; k < ids.size(); ++k) {
    const int32_t id = ids[k];
    ST_CHECK_DATA(id >= 0 && id < vocab_size(), "token id ", id, " (position ", k, ") is out of range [0, ", vocab_size(),
             ")");
    ST_CHECK_DATA(d_->assigned[id], "token id ", id, " (position ", k, ") is not assigned to any token");
    out += d_->id_bytes[id];
  }
  return out;
}

int Tokenizer::vocab_size() const { return static_cast<int>(d_->id_bytes.size()); }
int32_t Tokenizer::eos_id() const { return d_->eos; }
int Tokenizer::num_added_tokens() const { return static_cast<int>(d_->added.size()); }
bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && d_->assigned[id] == 3;
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  auto a = d_->added_by_content.find(std::string(token));
  if (a != d_->added_by_content.end()) return a->second;
  auto v = d_->vocab.find(std::string(token));
  if (v != d_->vocab.end()) return v->second;
  return std::nullopt;
}

std::string Tokenizer::token_bytes(int32_t id) const { return decode({id}); }

std::string Tokenizer::describe() const {
  std::ostringstream os;
  os << "Qwen2 byte-level BPE, " << d_->vocab_entries << " vocab (" << d_->num_merges << " merges) + "
     << d_->added.size() << " added tokens, " << (d_->nfc ? "NFC" : "no normalizer") << ", from " << d_->source
     << " (" << d_->dir << ")";
  return os.str();
}

std::string utf8_replace_invalid(std::string_view bytes) {
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = utf8_first_invalid(bytes);
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

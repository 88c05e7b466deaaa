// The Qwen2 byte-level BPE tokenizer (tokenizer.h has the pipeline and the contract): the
// merge table, byte-level BPE, encode and decode. Reading the files is tokenizer_json.cpp,
// NFC is unicode.cpp.
#include "data/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "core/utf8.h"
#include "data/tokenizer_files.h"
#include "data/unicode.h"

namespace st {

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

namespace {

// kQwen2Regex (tokenizer_files.h) for PCRE2, made to classify code points as the reference does. The
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

// What the files say (tokenizer_files.h), and what encode builds from it.
struct TokenizerData : TokenizerFiles {
  std::string dir;
  uint64_t uid = 0;
  MergeTable merges;
  AddedTrie trie;
  pcre2_code* re = nullptr;
  bool jit = false;

  ~TokenizerData() {
    if (re) pcre2_code_free(re);
  }
};

namespace {

// The merge ranks, the added-token trie and the pre-tokenizer regex, once the files are read.
void build_tables(TokenizerData& d) {
  d.merges.build(d.merge_list);
  std::vector<std::array<int32_t, 3>>().swap(d.merge_list);  // the table holds them now
  for (const auto& t : d.added) d.trie.add(t.content, t.id);
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
    Tokenizer t;
    t.d_->dir = dir;
    read_tokenizer_files(dir, *t.d_);
    build_tables(*t.d_);
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

}  // namespace st

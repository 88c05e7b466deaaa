// Reading a Hugging Face tokenizer directory (tokenizer_files.h): tokenizer.json, or
// vocab.json + merges.txt + tokenizer_config.json, each checked against the Qwen2
// pipeline, into the vocabulary, merges and added tokens that tokenizer.cpp encodes with.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/utf8.h"
#include "data/tokenizer_files.h"

namespace st {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

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

void add_added_token(TokenizerFiles& d, const json& t, const std::string& where) {
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

void check_tokenizer_json_pipeline(TokenizerFiles& d, const json& j, const std::string& f) {
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

void build_vocab(TokenizerFiles& d, const json& vocab, const std::string& f) {
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

void build_merges(TokenizerFiles& d, const std::vector<std::pair<std::string, std::string>>& pairs,
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
  d.merge_list = std::move(m);
}

void finish(TokenizerFiles& d, const std::string& f) {
  // Added tokens: ids, bytes (tokenizer.cpp builds their trie).
  int32_t max_id = static_cast<int32_t>(d.id_bytes.size()) - 1;
  for (const auto& t : d.added) max_id = std::max(max_id, t.id);
  d.id_bytes.resize(size_t(max_id) + 1);
  d.assigned.resize(size_t(max_id) + 1, 0);
  for (const auto& t : d.added) {
    d.id_bytes[t.id] = t.content;
    d.assigned[t.id] = t.special ? 3 : 2;
  }
  auto eos = d.added_by_content.find("<|endoftext|>");
  ST_CHECK(eos != d.added_by_content.end(), f, ": no added token <|endoftext|> (the document separator)");
  d.eos = eos->second;
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

void load_tokenizer_json(TokenizerFiles& d, const fs::path& p) {
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

void load_vocab_merges(TokenizerFiles& d, const fs::path& dir) {
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

}  // namespace

void read_tokenizer_files(const std::string& dir, TokenizerFiles& out) {
  const fs::path p(dir);
  ST_CHECK(fs::is_directory(p), dir, ": not a tokenizer directory (it does not exist or is not a directory)");
  if (fs::exists(p / "tokenizer.json")) {
    load_tokenizer_json(out, p / "tokenizer.json");
  } else if (fs::exists(p / "vocab.json") || fs::exists(p / "merges.txt")) {
    ST_CHECK(fs::exists(p / "vocab.json"), (p / "vocab.json").string(), ": missing (merges.txt is there)");
    ST_CHECK(fs::exists(p / "merges.txt"), (p / "merges.txt").string(), ": missing (vocab.json is there)");
    load_vocab_merges(out, p);
  } else {
    fail(dir, ": no tokenizer.json, nor vocab.json + merges.txt");
  }
}

}  // namespace st

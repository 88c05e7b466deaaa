#include "config/schema.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "config/toml_text.h"
#include "core/utf8.h"

namespace st {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Levenshtein distance: single-character insertions, deletions and substitutions.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// Integer range checks that belong to the type (32-bit fields; a seed TOML can hold).
bool fits_field(const FieldPtr& f, long long v) {
  if (std::holds_alternative<int*>(f)) return v >= INT_MIN && v <= INT_MAX;
  if (std::holds_alternative<uint64_t*>(f)) return v >= 0;
  return true;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// A TOML scalar as the text a command line would give for it ([train.set] values).
std::string scalar_text(const toml::node& v) {
  if (v.is_string()) return v.as_string()->get();
  if (v.is_integer()) return std::to_string(v.as_integer()->get());
  if (v.is_floating_point()) {
    std::ostringstream os;
    os.precision(17);
    os << v.as_floating_point()->get();
    return os.str();
  }
  return v.as_boolean()->get() ? "true" : "false";
}

std::string first_part(const std::string& name) { return name.substr(0, name.find('.')); }

const Origin kDefault{};

}  // namespace

Range at_least(double lo) { return {lo, kInf, false, false}; }
Range below(double hi) { return {-kInf, hi, false, true}; }
Range closed(double lo, double hi) { return {lo, hi, false, false}; }
Range left_open(double lo, double hi) { return {lo, hi, true, false}; }
Range half_open(double lo, double hi) { return {lo, hi, false, true}; }

std::string Range::describe() const {
  const bool has_lo = std::isfinite(lo), has_hi = std::isfinite(hi);
  if (has_lo && has_hi)
    return std::string("in ") + (lo_open ? "(" : "[") + format_double(lo) + ", " + format_double(hi) +
           (hi_open ? ")" : "]");
  if (has_lo) return (lo_open ? "> " : ">= ") + format_double(lo);
  return (hi_open ? "< " : "<= ") + format_double(hi);
}

std::string format_double(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest text that reads back exactly
  return std::string(buf, r.ptr);
}

std::string nearest(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates)
    if (const size_t d = edit_distance(name, c); d < best_d) best = c, best_d = d;
  return best_d <= std::max<size_t>(2, name.size() / 4) ? best : std::string();
}

Schema::Schema(std::vector<Key> keys, ErrorKind kind) : keys_(std::move(keys)), kind_(kind) {}

const Key* Schema::find(const std::string& name) const {
  for (const Key& k : keys_)
    if (k.name == name) return &k;
  return nullptr;
}

const Origin& Schema::origin(const std::string& name) const {
  auto it = origins_.find(name);
  return it == origins_.end() ? kDefault : it->second;
}

bool Schema::is_table(const std::string& prefix) const {
  for (const Key& k : keys_)
    if (k.name.size() > prefix.size() && k.name.compare(0, prefix.size(), prefix) == 0 && k.name[prefix.size()] == '.')
      return true;
  return false;
}

std::vector<std::string> Schema::tables_at_top() const {
  std::vector<std::string> out;
  for (const Key& k : keys_)
    if (std::find(out.begin(), out.end(), first_part(k.name)) == out.end()) out.push_back(first_part(k.name));
  return out;
}

std::string Schema::known_under(const std::string& prefix) const {
  std::vector<std::string> parts;
  for (const Key& k : keys_) {
    if (k.name.compare(0, prefix.size() + 1, prefix + ".") != 0) continue;
    const std::string next = first_part(k.name.substr(prefix.size() + 1));
    if (std::find(parts.begin(), parts.end(), next) == parts.end()) parts.push_back(next);
  }
  return join(parts, ", ");
}

std::string Schema::expected(const Key& k) {
  if (!k.choices.empty()) {
    std::vector<std::string> shown;
    for (const std::string& c : k.choices) shown.push_back(c.empty() ? "\"\"" : c);
    if (std::holds_alternative<std::vector<std::string>*>(k.field)) return "a list of " + join(shown, ", ");
    return "one of " + join(shown, ", ");
  }
  static const char* const names[] = {"an integer",  "a non-negative integer", "a number",          "a string",
                                      "an array of strings", "true or false", "a table of strings",
                                      "a table of keys and values"};
  return names[k.field.index()];
}

std::string Schema::type_label(const Key& k) {
  if (!k.choices.empty())
    return std::holds_alternative<std::vector<std::string>*>(k.field) ? "LIST of " + join(k.choices, "|")
                                                                      : join(k.choices, "|");
  static const char* const names[] = {"INT", "UINT", "FLOAT", "TEXT", "LIST", "true|false", "TABLE", "TABLE"};
  return names[k.field.index()];
}

// The error for a name the schema does not know: the nearest known key when there is
// one ("did you mean"), and what the enclosing table does know. From the command line
// the key is spelled as the option (--train.steps).
void Schema::fail_unknown(const std::string& where, const std::string& name, const std::string& at) const {
  std::vector<std::string> names;
  for (const Key& k : keys_) names.push_back(k.name);
  const bool cli = where == kCommandLine;
  const std::string near = nearest(name, names);
  const std::string hint = near.empty() ? "" : cli ? "did you mean --" + near + "? " : "did you mean '" + near + "'? ";
  std::string sections;
  for (const std::string& t : tables_at_top()) sections += (sections.empty() ? "[" : ", [") + t + "]";
  // The innermost table around the name that the schema knows.
  std::string table = name;
  while (table.find('.') != std::string::npos && !is_table(table = table.substr(0, table.rfind('.')))) {
  }
  if (name.find('.') == std::string::npos)
    fail_as(kind_, where, ": unknown key '", name, "'", at, " (", hint, "keys belong in a section: ", sections, ")");
  if (!is_table(table))
    fail_as(kind_, where, ": unknown key '", name, "'", at, " (", hint, "known sections: ", sections, ")");
  fail_as(kind_, where, ": unknown key '", name, "'", at, " (", hint, "known keys in [", table, "]: ",
          known_under(table), ")");
}

void Schema::read_toml(const toml::table& root, const std::string& file, bool skip_unknown) {
  walk(root, "", file, skip_unknown);
}

void Schema::walk(const toml::table& t, const std::string& prefix, const std::string& file, bool skip_unknown) {
  for (const auto& [key, node] : t) {
    const std::string name = prefix.empty() ? std::string(key.str()) : prefix + "." + std::string(key.str());
    if (const Key* k = find(name)) {
      set_from_toml(*k, node, file);
      origins_[name] = {file, static_cast<long>(node.source().begin.line)};
      continue;
    }
    if (is_table(name)) {
      if (!node.is_table())
        fail_as(kind_, file, ": '", name, "' must be the section [", name, "], got ", toml_type_name(node),
                toml_line_text(node));
      walk(*node.as_table(), name, file, skip_unknown);
      continue;
    }
    if (skip_unknown) continue;
    if (prefix.empty() && node.is_table()) {
      const std::string near = nearest(name, tables_at_top());
      std::string sections;
      for (const std::string& s : tables_at_top()) sections += (sections.empty() ? "[" : ", [") + s + "]";
      fail_as(kind_, file, ": unknown section [", name, "]", toml_at_line(node), " (",
              near.empty() ? "" : "did you mean [" + near + "]? ", "known sections: ", sections, ")");
    }
    fail_unknown(file, name, toml_at_line(node));
  }
}

void Schema::set_from_toml(const Key& k, const toml::node& v, const std::string& file) {
  auto wrong_type = [&](const std::string& got) {
    fail_as(kind_, file, ": key '", k.name, "' must be ", expected(k), ", got ", got, toml_line_text(v));
  };
  std::visit(
      [&](auto* field) {
        using T = std::remove_pointer_t<decltype(field)>;
        if constexpr (std::is_same_v<T, int> || std::is_same_v<T, uint64_t>) {
          if (!v.is_integer()) wrong_type(toml_type_name(v));
          const long long x = v.as_integer()->get();
          if (!fits_field(k.field, x))
            wrong_type(std::to_string(x) + (x < 0 ? "" : ", which does not fit in 32 bits"));
          *field = static_cast<T>(x);
        } else if constexpr (std::is_same_v<T, double>) {
          // An integer is a fine number: `weight_decay = 0` should not need a ".0".
          if (!v.is_floating_point() && !v.is_integer()) wrong_type(toml_type_name(v));
          *field = v.is_integer() ? static_cast<double>(v.as_integer()->get()) : v.as_floating_point()->get();
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (!v.is_string()) wrong_type(toml_type_name(v));
          *field = v.as_string()->get();
        } else if constexpr (std::is_same_v<T, bool>) {
          if (!v.is_boolean()) wrong_type(toml_type_name(v));
          *field = v.as_boolean()->get();
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          if (!v.is_array()) wrong_type(toml_type_name(v));
          T items;
          for (const toml::node& e : *v.as_array()) {
            if (!e.is_string()) wrong_type("an array holding " + toml_type_name(e));
            items.push_back(e.as_string()->get());
          }
          *field = std::move(items);
        } else if constexpr (std::is_same_v<T, StringMap>) {
          if (!v.is_table()) wrong_type(toml_type_name(v));
          for (const auto& [key, e] : *v.as_table()) {
            if (!e.is_string())
              fail_as(kind_, file, ": key '", k.name, ".", key.str(), "' must be a string, got ", toml_type_name(e),
                      toml_line_text(e));
            (*field)[std::string(key.str())] = e.as_string()->get();
          }
        } else {
          // Keys and values for another schema: scalars become command-line text, an
          // array of strings a comma-separated list.
          if (!v.is_table()) wrong_type(toml_type_name(v));
          for (const auto& [key, e] : *v.as_table()) {
            const std::string name = k.name + ".\"" + std::string(key.str()) + "\"";
            std::string text;
            if (e.is_array()) {
              std::vector<std::string> items;
              for (const toml::node& x : *e.as_array()) {
                if (!x.is_string())
                  fail_as(kind_, file, ": key '", name, "' must hold strings only, got ", toml_type_name(x),
                          toml_line_text(x));
                items.push_back(x.as_string()->get());
              }
              text = join(items, ",");
            } else if (e.is_table() || !e.is_value() || e.is_date() || e.is_time() || e.is_date_time()) {
              fail_as(kind_, file, ": key '", name, "' must be a value, got ", toml_type_name(e),
                      " (write run-config keys quoted: \"train.steps\" = 100)", toml_line_text(e));
            } else {
              text = scalar_text(e);
            }
            field->emplace_back(std::string(key.str()), text);
          }
        }
      },
      k.field);
}

void Schema::set_from_text(const std::string& raw_name, const std::string& text) {
  // Accept "--train.steps" as well as "train.steps".
  const std::string name = raw_name.rfind("--", 0) == 0 ? raw_name.substr(2) : raw_name;
  const Key* found = find(name);
  if (!found) fail_unknown(kCommandLine, name, "");
  const Key& k = *found;
  auto bad = [&]() { fail_as(kind_, kCommandLine, ": --", k.name, " expects ", expected(k), ", got '", text, "'"); };
  // A configuration is saved as TOML, whose strings are UTF-8.
  if (utf8_replace_invalid(text) != text)
    fail_as(kind_, kCommandLine, ": --", k.name, " is not valid UTF-8 text: '", utf8_replace_invalid(text), "'");
  const char* b = text.data();
  const char* e = b + text.size();
  std::visit(
      [&](auto* field) {
        using T = std::remove_pointer_t<decltype(field)>;
        if constexpr (std::is_same_v<T, int> || std::is_same_v<T, uint64_t>) {
          long long x = 0;  // TOML integers are signed 64-bit; so are ours, to round-trip
          auto r = std::from_chars(b, e, x);
          if (text.empty() || r.ec != std::errc() || r.ptr != e || !fits_field(k.field, x)) bad();
          *field = static_cast<T>(x);
        } else if constexpr (std::is_same_v<T, double>) {
          double x = 0;
          auto r = std::from_chars(b, e, x);
          if (text.empty() || r.ec != std::errc() || r.ptr != e) bad();
          *field = x;
        } else if constexpr (std::is_same_v<T, std::string>) {
          *field = text;
        } else if constexpr (std::is_same_v<T, bool>) {
          if (text != "true" && text != "false") bad();  // as TOML spells them
          *field = text == "true";
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          T items;  // "a,b,c"; empty pieces are dropped, so "" is the empty list
          std::stringstream ss(text);
          for (std::string item; std::getline(ss, item, ',');)
            if (!item.empty()) items.push_back(item);
          *field = std::move(items);
        } else {
          bad();  // tables are written in files only
        }
      },
      k.field);
  origins_[name] = {kCommandLine, 0};
}

void Schema::check() const {
  for (const Key& k : keys_) {
    if (!was_set(k.name)) continue;  // defaults are in range by construction
    // inf and nan read as numbers (TOML and from_chars spell them) but are no setting.
    if (const auto* x = std::get_if<double*>(&k.field); x && !std::isfinite(**x))
      fail_key(k.name, " must be a finite number, got ", value_text(k, false));
    if (k.range) {
      double v = 0;
      std::visit(
          [&](auto* field) {
            if constexpr (std::is_arithmetic_v<std::remove_pointer_t<decltype(field)>>) v = static_cast<double>(*field);
          },
          k.field);
      if (!k.range->contains(v)) fail_key(k.name, " must be ", k.range->describe(), ", got ", value_text(k, false));
    }
    if (!k.choices.empty()) {
      // A list's choices are its elements' (each at most once).
      if (const auto* list = std::get_if<std::vector<std::string>*>(&k.field)) {
        for (size_t i = 0; i < (*list)->size(); ++i) {
          const std::string& v = (**list)[i];
          if (std::find(k.choices.begin(), k.choices.end(), v) == k.choices.end())
            fail_key(k.name, " must be ", expected(k), ", got '", v, "'");
          if (std::find((*list)->begin(), (*list)->begin() + i, v) != (*list)->begin() + i)
            fail_key(k.name, " names '", v, "' twice");
        }
        continue;
      }
      const std::string v = value_text(k, false);
      if (std::find(k.choices.begin(), k.choices.end(), v) == k.choices.end())
        fail_key(k.name, " must be ", expected(k), ", got '", v, "'");
    }
  }
}

std::string Schema::value_text(const Key& k, bool as_toml) const {
  return std::visit(
      [&](auto* field) -> std::string {
        const auto& v = *field;
        using T = std::remove_cvref_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int> || std::is_same_v<T, uint64_t>) {
          return std::to_string(v);
        } else if constexpr (std::is_same_v<T, double>) {
          std::string s = format_double(v);
          // TOML reads "1" as an integer; keep floats floats ("inf"/"nan" are TOML too).
          if (as_toml && s.find_first_of(".eEn") == std::string::npos) s += ".0";
          return s;
        } else if constexpr (std::is_same_v<T, std::string>) {
          return as_toml ? quote(v) : v;
        } else if constexpr (std::is_same_v<T, bool>) {
          return v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          if (!as_toml) return join(v, ",");
          std::vector<std::string> q;
          for (const std::string& s : v) q.push_back(quote(s));
          return "[" + join(q, ", ") + "]";
        } else {
          std::vector<std::string> items;
          for (const auto& [key, value] : v) items.push_back(quote(key) + " = " + quote(value));
          return "{ " + join(items, ", ") + " }";
        }
      },
      k.field);
}

}  // namespace st

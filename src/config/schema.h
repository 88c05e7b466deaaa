// A TOML schema: one row per key (its dotted name, the field it fills, its help, a
// numeric range, the choices of a string), and the one reader that walks it. The run
// configuration (config/run_config.cpp) and the deploy cluster file
// (deploy/cluster_file.cpp) are two tables over this machinery, so both refuse
// unknown keys, wrong types, values out of range and bad choices with the same
// messages, naming the file, the key and its line, and suggesting the nearest key.
//
// A key's field is a pointer into one object: a table is built for the object it
// fills (`Schema s(run_config_keys(cfg))`), read, then checked.
//
//   Schema s({{"train.steps", &cfg.train.steps, "optimizer steps", at_least(1)}});
//   s.read_toml(parse_toml_file(path, "run config"), path);   // type errors here
//   s.set_from_text("train.steps", "20");                      // a command-line value
//   s.check();                                                 // ranges and choices
#pragma once
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <toml++/toml.h>

#include "core/error.h"
#include "core/strings.h"

namespace st {

// A table whose keys are the user's (node labels, extra environment variables).
using StringMap = std::map<std::string, std::string>;
// "section.key" = value pairs kept as text, in order, for another schema to read
// (the cluster file's [train.set], the command line's --section.key=value).
using KeyValues = std::vector<std::pair<std::string, std::string>>;

// The field a key fills; the variant's index is its type (see Schema::expected).
using FieldPtr = std::variant<int*, uint64_t*, double*, std::string*, std::vector<std::string>*, bool*, StringMap*,
                              KeyValues*>;

// A numeric interval; contains() is written so that NaN is never inside.
struct Range {
  double lo = -std::numeric_limits<double>::infinity(), hi = std::numeric_limits<double>::infinity();
  bool lo_open = false, hi_open = false;
  bool contains(double v) const { return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi); }
  std::string describe() const;  // "in [0, 1)", ">= 1", "< 0"
};
Range at_least(double lo);
Range below(double hi);
Range closed(double lo, double hi);
Range left_open(double lo, double hi);
Range half_open(double lo, double hi);

struct Key {
  std::string name;  // dotted: "train.steps", "nodes.gpu.count"
  FieldPtr field;
  std::string help;
  std::optional<Range> range = {};
  std::vector<std::string> choices = {};  // non-empty: a string that must be one of these
};

// Where a key got its value: "default", a file, or "command line"; errors start with it.
struct Origin {
  std::string where = "default";
  long line = 0;  // TOML line, 0 where there is none
};

inline constexpr const char* kCommandLine = "command line";

// The shortest text that reads back as exactly `v` ("0.1", "3e-08").
std::string format_double(double v);
// The candidate nearest to `name` when it is near enough to be a typo of it (at most
// two edits, or a quarter of the name); empty otherwise.
std::string nearest(const std::string& name, const std::vector<std::string>& candidates);

class Schema {
 public:
  // `kind`: what errors are (a configuration error, exit 2, for what a user writes;
  // a data error, exit 3, for a file a run wrote).
  explicit Schema(std::vector<Key> keys, ErrorKind kind = ErrorKind::Usage);

  const std::vector<Key>& keys() const { return keys_; }
  const Key* find(const std::string& name) const;

  // Fills the fields from a parsed TOML file: tables nest as the dotted names do.
  // An unknown key or table is an error naming the nearest known one, unless
  // `skip_unknown` (a file written by another version), when it is passed over.
  void read_toml(const toml::table& root, const std::string& file, bool skip_unknown = false);
  // A command-line value ("--train.steps=20"), with the same type rules as TOML; a
  // list is comma-separated. The name may start with "--".
  void set_from_text(const std::string& name, const std::string& text);
  // Range, finiteness and choice checks of every key that was set.
  void check() const;

  // The value as TOML (as_toml) or as plain text (for --help and messages).
  std::string value_text(const Key& k, bool as_toml) const;
  // The placeholder --help shows: INT, FLOAT, cpu|cuda, ...
  static std::string type_label(const Key& k);
  // "an integer", "one of cpu, cuda", ...
  static std::string expected(const Key& k);

  // Where the key was set; "default" when it was not.
  const Origin& origin(const std::string& name) const;
  bool was_set(const std::string& name) const { return origins_.count(name) > 0; }
  const std::map<std::string, Origin>& origins() const { return origins_; }

  // "configs/x.toml: train.steps<parts> (line 4)" or "command line: --train.steps<parts>":
  // an error of this schema's kind, or of `kind`.
  template <class... Parts>
  [[noreturn]] void fail_key(const std::string& name, Parts&&... parts) const {
    fail_key_as(kind_, name, std::forward<Parts>(parts)...);
  }
  template <class... Parts>
  [[noreturn]] void fail_key_as(ErrorKind kind, const std::string& name, Parts&&... parts) const {
    const Origin& o = origin(name);
    const std::string shown = o.where == kCommandLine ? "--" + name : name;
    fail_as(kind, o.where, ": ", shown, concat(std::forward<Parts>(parts)...),
            o.line ? " (line " + std::to_string(o.line) + ")" : "");
  }

 private:
  void walk(const toml::table& t, const std::string& prefix, const std::string& file, bool skip_unknown);
  void set_from_toml(const Key& k, const toml::node& v, const std::string& file);
  [[noreturn]] void fail_unknown(const std::string& where, const std::string& name, const std::string& at) const;
  bool is_table(const std::string& prefix) const;         // some key lies below "prefix."
  std::vector<std::string> tables_at_top() const;          // "model", "train", ...
  std::string known_under(const std::string& prefix) const;  // the next name parts below it

  std::vector<Key> keys_;
  ErrorKind kind_;
  std::map<std::string, Origin> origins_;
};

}  // namespace st

// How TOML values are named in error messages, shared by every file reader that
// speaks TOML (the run config, the deploy cluster file).
#pragma once
#include <fstream>
#include <sstream>
#include <string>
#include <toml++/toml.h>

#include "core/error.h"

namespace st {

// "a string", "an integer", ... as in "must be X, got <this>".
inline std::string toml_type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a floating-point number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    default: return "nothing";
  }
}

// " (line 4)" after a message, or " at line 4" inside one; empty when unknown.
inline std::string toml_line_text(const toml::node& n) {
  return n.source().begin.line ? " (line " + std::to_string(n.source().begin.line) + ")" : "";
}
inline std::string toml_at_line(const toml::node& n) {
  return n.source().begin.line ? " at line " + std::to_string(n.source().begin.line) : "";
}

// The TOML file at path, parsed; errors (configuration errors, exit 2) name the file ("<path>: cannot open <what>",
// "<path>:L:C: TOML syntax error: ...").
inline toml::table parse_toml_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_config(path, ": cannot open ", what);
  std::stringstream text;
  text << in.rdbuf();
  try {
    return toml::parse(text.str(), path);
  } catch (const toml::parse_error& e) {
    fail_config(path, ":", e.source().begin.line, ":", e.source().begin.column, ": TOML syntax error: ", e.description());
  }
}

}  // namespace st

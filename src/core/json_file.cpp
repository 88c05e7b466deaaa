#include "core/json_file.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace st {
namespace {
using nlohmann::json;

// Where a JSON parse error is, as a line number of `text`.
int line_of_byte(const std::string& text, size_t byte) {
  byte = std::min(byte, text.size());
  return 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(byte), '\n'));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_data(path, ": cannot read");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

std::string json_message(const std::exception& e) {
  std::string m = e.what();
  if (m.rfind("[json.exception.", 0) == 0) {
    const size_t close = m.find("] ");
    if (close != std::string::npos) m = m.substr(close + 2);
  }
  return m;
}

json read_json_object(const std::string& path, std::string& text) {
  text = read_file(path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    fail_data(path, ":", line_of_byte(text, e.byte ? e.byte - 1 : 0), ": not valid JSON: ", json_message(e));
  }
  if (!j.is_object()) fail_data(path, ":1: expected a JSON object, got ", j.type_name());
  return j;
}

int line_of_key(const std::string& text, const std::string& key) {
  const size_t at = text.find("\"" + key + "\"");
  return at == std::string::npos ? 0 : line_of_byte(text, at);
}

std::string where_key(const std::string& path, const std::string& text, const std::string& key) {
  const int line = line_of_key(text, key);
  return line ? concat(path, ":", line) : path;
}

void require_number(const json& obj, const std::string& key, const std::string& path, const std::string& text) {
  if (!obj.contains(key)) return;
  const json& v = obj.at(key);
  if (v.is_number()) return;
  fail_data(where_key(path, text, key), ": \"", key, "\" must be a number, got ", v.type_name());
}

}  // namespace st

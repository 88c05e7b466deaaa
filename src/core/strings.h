// Small string helpers that several rooms need, each written once.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace st {

// `parts` joined by `sep`: join({"a", "b"}, ", ") == "a, b".
inline std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) s += sep;
    s += parts[i];
  }
  return s;
}

inline bool ends_with(std::string_view s, std::string_view suffix) { return s.ends_with(suffix); }

}  // namespace st

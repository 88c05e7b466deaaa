// Text for the HTML page and its SVG plots: escaping and number formats.
#pragma once
#include <cstdio>
#include <string>

namespace st::report_text {

inline std::string esc(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

inline std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

inline std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  std::string s = buf;
  if (s == "-0" || s.rfind("-0.", 0) == 0) {  // "-0.0" -> "0.0"
    bool all_zero = s.find_first_not_of("-0.") == std::string::npos;
    if (all_zero) s.erase(0, 1);
  }
  return s;
}

// 1234567 -> "1,234,567".
inline std::string grouped(long long v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

inline std::string sig3(double v) { return fmt("%.3g", v); }

}  // namespace st::report_text

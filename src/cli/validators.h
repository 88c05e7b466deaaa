// Option checks CLI11 does not make itself: a floating-point option must be a finite
// number within bounds (CLI11's PositiveNumber and Range let "nan" through, and "inf"
// or 1e30 would be cast to an integer later).
#pragma once
#include <charconv>
#include <cmath>
#include <string>

#include <CLI/CLI.hpp>

namespace st {

// A number in [lo, hi] ((lo, hi] when lo_open); the message names the bounds.
inline CLI::Validator finite_in(double lo, double hi, bool lo_open = false) {
  auto text = [](double v) {
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
  };
  const std::string range = (lo_open ? "(" : "[") + text(lo) + ", " + text(hi) + "]";
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        double v = 0;
        const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size()) return "'" + s + "' is not a number";
        if (!std::isfinite(v)) return "must be a finite number in " + range + ", got " + s;
        if ((lo_open ? v <= lo : v < lo) || v > hi) return "must be in " + range + ", got " + s;
        return std::string();
      },
      "in " + range);
}

}  // namespace st

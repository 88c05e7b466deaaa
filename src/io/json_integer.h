// Integers read from JSON a user can hand us (manifests, indexes): nlohmann's get<T>()
// converts a float (undefined behaviour when out of T's range) and wraps a large
// integer, so these check the type and the range first.
#pragma once
#include <cstdint>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace st {

// j[key] as a T, when it is an integer T holds; otherwise an error naming `where` and
// the key, with T's range and the value found.
template <class T>
T integer_at(const nlohmann::json& j, const char* key, const std::string& where) {
  const nlohmann::json& v = j.at(key);
  const bool negative = v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0;
  bool fits = v.is_number_integer();
  if (fits && negative)
    fits = std::numeric_limits<T>::is_signed && v.get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min());
  else if (fits)
    fits = v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
  if (!fits)
    fail(where, ": '", key, "' must be an integer in [", +std::numeric_limits<T>::min(), ", ",
         +std::numeric_limits<T>::max(), "], got ", v.dump());
  return negative ? static_cast<T>(v.get<int64_t>()) : static_cast<T>(v.get<uint64_t>());
}

}  // namespace st

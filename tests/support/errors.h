// The st::Error that code under test throws, for tests of what it says: its message
// (the wording a user reads) and its kind (the exit code). Exceptions of other types
// pass through and fail the test as they would without these helpers.
#pragma once
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "core/error.h"

namespace st::testing {

// The st::Error f() throws; nothing when it returns.
template <class F>
std::optional<Error> caught_error(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

// The message of the st::Error f() throws; "" when it returns.
template <class F>
std::string error_of(F&& f) {
  const std::optional<Error> e = caught_error(f);
  return e ? e->what() : "";
}

// Expects f() to throw an st::Error whose message holds every one of `parts`.
template <class F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  const std::optional<Error> e = caught_error(f);
  if (!e) {
    ADD_FAILURE() << "no error thrown; expected one mentioning '" << parts.front() << "'";
    return;
  }
  const std::string msg = e->what();
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

}  // namespace st::testing

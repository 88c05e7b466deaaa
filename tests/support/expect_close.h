// Comparing a computed vector with a reference: ||got - want|| / ||want|| <= tol,
// every value finite, the error printed for the log. A reference of all zeros means
// a weak test, unless `zero_ok` says it is exactly zero by construction: then
// max |got| <= tol instead. Shared by the GPU op tests.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace st::testing {

inline void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                         double tol, bool zero_ok = false) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double d2 = 0, w2 = 0, max_abs = 0;
  size_t bad = 0, first_bad = 0;
  for (size_t i = 0; i < got.size(); i++) {
    if (!std::isfinite(got[i])) {
      if (bad++ == 0) first_bad = i;
      continue;
    }
    const double d = double(got[i]) - want[i];
    d2 += d * d, w2 += double(want[i]) * want[i];
    max_abs = std::max(max_abs, std::abs(d));
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " non-finite values, first at " << first_bad;
  if (w2 == 0 && zero_ok) {
    std::printf("[ error    ] %-52s zero reference, max abs %.3g  (tol %.0e)\n", what.c_str(), max_abs, tol);
    EXPECT_LE(max_abs, tol) << what;
    return;
  }
  const double rel = w2 > 0 ? std::sqrt(d2 / w2) : std::sqrt(d2);
  std::printf("[ error    ] %-52s rel %.3g  max abs %.3g  (tol %.0e)\n", what.c_str(), rel, max_abs, tol);
  EXPECT_LE(rel, tol) << what << ": max abs error " << max_abs;
  EXPECT_GT(w2, 0) << what << ": the reference is all zeros, the test is too weak";
}

}  // namespace st::testing

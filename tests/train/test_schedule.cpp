#include <gtest/gtest.h>

#include <cmath>

#include "train/schedule.h"

namespace st {
namespace {

TEST(LrSchedule, WarmupThenCosineToFloor) {
  LrSchedule s{1.0, 0.1, 4, 14};  // warmup steps 0..3, cosine over steps 4..13
  EXPECT_DOUBLE_EQ(s.at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.at(1), 0.5);
  EXPECT_DOUBLE_EQ(s.at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.at(4), 1.0);  // cosine starts at the peak
  // Halfway through the 9 decay intervals: 0.1 + 0.45 * (1 + cos(pi/2)) = 0.55.
  LrSchedule half{1.0, 0.1, 4, 13};  // decay over steps 4..12: 8 intervals, step 8 is halfway
  EXPECT_NEAR(half.at(8), 0.55, 1e-15);
  // Step 6 of s: progress 2/9 -> 0.1 + 0.45 * (1 + cos(2pi/9)).
  EXPECT_NEAR(s.at(6), 0.1 + 0.45 * (1 + std::cos(2 * M_PI / 9)), 1e-15);
  EXPECT_NEAR(s.at(13), 0.1, 1e-15);  // last step at the floor
  EXPECT_NEAR(s.at(100), 0.1, 1e-15);  // and it stays there
}

TEST(LrSchedule, NoWarmupAndSingleStep) {
  LrSchedule s{2e-3, 0.0, 0, 3};
  EXPECT_DOUBLE_EQ(s.at(0), 2e-3);
  EXPECT_NEAR(s.at(1), 1e-3, 1e-18);
  EXPECT_NEAR(s.at(2), 0.0, 1e-18);
  LrSchedule one{1e-3, 0.5, 0, 1};
  EXPECT_DOUBLE_EQ(one.at(0), 1e-3);
}

TEST(LrSchedule, MonotoneAfterWarmup) {
  LrSchedule s{3e-3, 0.1, 20, 300};
  for (int i = 1; i < 20; ++i) EXPECT_GT(s.at(i), s.at(i - 1));
  for (int i = 21; i < 300; ++i) EXPECT_LE(s.at(i), s.at(i - 1));
}

}  // namespace
}  // namespace st

// What a run reports about itself: the time left (ETA) from the recent step times,
// in the step line and the progress bar, and the keys of metrics.jsonl's step record.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "support/temp_dir.h"
#include "metrics/metrics.h"

namespace st {
namespace {

namespace fs = std::filesystem;

TEST(Metrics, HumanDurations) {
  EXPECT_EQ(human_duration(0), "0s");
  EXPECT_EQ(human_duration(44.6), "45s");
  EXPECT_EQ(human_duration(59.4), "59s");
  EXPECT_EQ(human_duration(200), "3m20s");
  EXPECT_EQ(human_duration(3599), "59m59s");
  EXPECT_EQ(human_duration(3720), "1h02m");
  EXPECT_EQ(human_duration(100 * 3600 + 5 * 60), "100h05m");
  EXPECT_EQ(human_duration(-1), "?");
  EXPECT_EQ(human_duration(std::nan("")), "?");
}

TEST(Metrics, EtaIsTheRemainingStepsTimesTheRecentMeanStepTime) {
  EtaEstimator eta(/*window=*/3);
  // The first step (warm-up included) is all there is to go by at first...
  EXPECT_DOUBLE_EQ(eta.update(1, 101, 10.0), 100 * 10.0);
  // ...and is dropped once a real step time is known.
  EXPECT_DOUBLE_EQ(eta.update(2, 101, 2.0), 99 * 2.0);
  EXPECT_DOUBLE_EQ(eta.update(3, 101, 4.0), 98 * 3.0);
  EXPECT_DOUBLE_EQ(eta.update(4, 101, 3.0), 97 * 3.0);
  // Only the last 3 steps count: a slower phase shows at once.
  EXPECT_DOUBLE_EQ(eta.update(5, 101, 9.0), 96 * (4.0 + 3.0 + 9.0) / 3);
  EXPECT_DOUBLE_EQ(eta.update(6, 101, 9.0), 95 * (3.0 + 9.0 + 9.0) / 3);
  EXPECT_DOUBLE_EQ(eta.update(101, 101, 9.0), 0.0);
}

TEST(Metrics, StepLineShowsTheEtaWhenKnown) {
  StepMetrics m;
  m.step = 12;
  m.total_steps = 300;
  m.loss = 2.5;
  m.tokens_per_s = 1000;
  m.elapsed_s = 62;
  EXPECT_EQ(format_step_line(m).find("eta"), std::string::npos) << format_step_line(m);
  m.eta_s = 280;
  const std::string line = format_step_line(m);
  EXPECT_NE(line.find("step  12/300 | loss 2.5000"), std::string::npos) << line;
  EXPECT_NE(line.find(" | elapsed 1m02s | eta 4m40s"), std::string::npos) << line;
}

TEST(Metrics, ProgressBarShowsStepsTokensPerSecondAndEta) {
  StepMetrics m;
  m.step = 30;
  m.total_steps = 120;
  m.loss = 1.25;
  m.tokens_per_s = 12300;
  m.eta_s = 3720;
  ProgressBar bar("on");
  ASSERT_TRUE(bar.enabled());
  ::testing::internal::CaptureStdout();
  bar.update(m);
  bar.clear();
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("30/120  25%"), std::string::npos) << out;
  EXPECT_NE(out.find("12.3K tok/s"), std::string::npos) << out;
  EXPECT_NE(out.find("eta 1h02m"), std::string::npos) << out;
  EXPECT_NE(out.find("[" + std::string(7, '#') + std::string(23, '.') + "] "), std::string::npos) << out;
  EXPECT_FALSE(ProgressBar("off").enabled());
}

TEST(Metrics, StepRecordHoldsEveryDocumentedKey) {
  const fs::path p = testing::fresh_path("metrics.jsonl");
  StepMetrics m;
  m.step = 3;
  m.loss = 2.0;
  m.step_s = 0.25;
  m.peak_memory_bytes = 123456789;
  {
    MetricsLog log(p.string());
    log.write_step(m);
  }
  std::ifstream in(p);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const nlohmann::json j = nlohmann::json::parse(line);
  for (const char* key : {"step", "loss", "lr", "grad_norm", "tokens_per_s", "step_s", "elapsed_s", "tokens",
                          "tflops_per_rank", "mfu", "peak_memory_bytes", "comm_all_gather_bytes",
                          "comm_reduce_scatter_bytes", "comm_all_reduce_bytes", "comm_broadcast_bytes",
                          "comm_intra_node_bytes", "comm_inter_node_bytes", "comm_blocked_s"})
    EXPECT_TRUE(j.contains(key)) << key << " in " << line;
  EXPECT_EQ(j.size(), 18u) << line;
  EXPECT_EQ(j["step"], 3);
  EXPECT_EQ(j["step_s"], 0.25);
  EXPECT_EQ(j["peak_memory_bytes"], 123456789);
  fs::remove(p);
}

}  // namespace
}  // namespace st

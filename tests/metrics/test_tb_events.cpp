// TensorBoard events: the files are read back here by a reader of their own (the
// TFRecord framing, both masked CRC32Cs recomputed, each record parsed as an Event),
// for the writer alone and for real training runs: every scalar at every step,
// run.tensorboard=false writing nothing, and a resumed run's steps superseding those
// after its checkpoint the way TensorBoard merges the files of a directory.
#include <gtest/gtest.h>
#include <isa-l/crc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "config/model_config.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/metrics_jsonl.h"
#include "support/temp_dir.h"
#include "support/tiny_run.h"
#include "metrics/metrics.h"
#include "metrics/tb_event.pb.h"
#include "metrics/tb_events.h"
#include "train/trainer.h"

namespace st {
namespace {

namespace fs = std::filesystem;

using testing::error_of;
using testing::temp_dir;
using testing::train_on_cpu;

// ---- an independent reader ----------------------------------------------------------

uint32_t crc32c(const std::string& bytes) {
  return ~crc32_iscsi(reinterpret_cast<unsigned char*>(const_cast<char*>(bytes.data())), static_cast<int>(bytes.size()),
                      0xFFFFFFFFu);
}
uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint64_t le(const std::string& b, size_t at, int n) {
  uint64_t x = 0;
  for (int i = n - 1; i >= 0; --i) x = x << 8 | static_cast<unsigned char>(b[at + i]);
  return x;
}

// Every record of `path`, parsed; a framing or CRC error fails the test.
std::vector<tb::Event> read_events(const fs::path& path) {
  const std::string b = testing::read_file(path);
  std::vector<tb::Event> out;
  size_t at = 0;
  while (at < b.size()) {
    EXPECT_LE(at + 12, b.size()) << path << ": a truncated header at byte " << at;
    if (at + 12 > b.size()) break;
    const uint64_t len = le(b, at, 8);
    EXPECT_EQ(le(b, at + 8, 4), masked(crc32c(b.substr(at, 8)))) << path << ": length CRC at byte " << at;
    EXPECT_LE(at + 12 + len + 4, b.size()) << path << ": a truncated record at byte " << at;
    if (at + 12 + len + 4 > b.size()) break;
    const std::string data = b.substr(at + 12, len);
    EXPECT_EQ(le(b, at + 12 + len, 4), masked(crc32c(data))) << path << ": data CRC at byte " << at;
    tb::Event e;
    EXPECT_TRUE(e.ParseFromString(data)) << path << ": record at byte " << at << " is not an Event";
    out.push_back(e);
    at += 12 + len + 4;
  }
  return out;
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> files;
  if (!fs::is_directory(dir)) return files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find("tfevents") != std::string::npos) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

using Scalars = std::map<int64_t, std::map<std::string, float>>;  // step -> tag -> value

// What TensorBoard shows for a directory: the files in name order, each checked to
// begin with the file_version record; a SessionLog START at step S drops what was
// read before at steps >= S (EventAccumulator's purge for file version 2). A step
// seen twice without a START in between fails the test.
Scalars merged_scalars(const fs::path& dir) {
  Scalars out;
  for (const fs::path& f : event_files(dir)) {
    const std::vector<tb::Event> events = read_events(f);
    EXPECT_FALSE(events.empty()) << f;
    if (events.empty()) continue;
    EXPECT_EQ(events[0].file_version(), "brain.Event:2") << f;
    for (size_t i = 1; i < events.size(); ++i) {
      const tb::Event& e = events[i];
      if (e.has_session_log()) {
        EXPECT_EQ(e.session_log().status(), tb::SessionLog::START) << f;
        out.erase(out.lower_bound(e.step()), out.end());
        continue;
      }
      EXPECT_TRUE(e.has_summary()) << f << ": record " << i;
      EXPECT_FALSE(out.count(e.step())) << f << ": step " << e.step() << " written twice";
      for (const auto& v : e.summary().value()) out[e.step()][v.tag()] = v.simple_value();
    }
  }
  return out;
}

// ---- the writer ---------------------------------------------------------------------

TEST(TbEvents, TheReadersCrc32cIsTheStandardOne) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);  // the CRC-32C check value
  const std::string s = "some record bytes";
  EXPECT_EQ(tfrecord_masked_crc(s.data(), s.size()), masked(crc32c(s)));
}

TEST(TbEvents, RecordsAreFramedAndEveryValueReadsBack) {
  const fs::path dir = temp_dir("writer") / "tb";  // created by the writer
  const double t0 = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string path;
  {
    TbEventWriter w(dir.string());
    path = w.path();
    w.write_start(1);
    w.write_scalars(1, {{"train/loss", 5.5}, {"perf/mfu", 0.0}, {"memory/x", 1e10}});
    w.write_scalars(2, {{"train/loss", 4.25}, {"perf/mfu", 0.375}, {"memory/x", 3.0}});
    // Written and flushed as it goes: the file is whole before the writer closes.
    const std::vector<tb::Event> now = read_events(path);
    ASSERT_EQ(now.size(), 4u);
  }
  const std::string name = fs::path(path).filename().string();
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  EXPECT_TRUE(std::regex_match(name, std::regex("events\\.out\\.tfevents\\.[0-9]{10}\\." + std::string(host))))
      << name;
  EXPECT_EQ(fs::path(path).parent_path(), dir);

  const std::vector<tb::Event> ev = read_events(path);
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0].file_version(), "brain.Event:2");
  EXPECT_TRUE(ev[1].has_session_log());
  EXPECT_EQ(ev[1].session_log().status(), tb::SessionLog::START);
  EXPECT_EQ(ev[1].step(), 1);
  for (const tb::Event& e : ev) {
    EXPECT_GE(e.wall_time(), t0 - 1);
    EXPECT_LE(e.wall_time(), t0 + 60);
  }
  const struct {
    int64_t step;
    float loss, mfu, mem;
  } want[] = {{1, 5.5f, 0.0f, 1e10f}, {2, 4.25f, 0.375f, 3.0f}};
  for (int i = 0; i < 2; ++i) {
    const tb::Event& e = ev[2 + i];
    EXPECT_EQ(e.step(), want[i].step);
    ASSERT_TRUE(e.has_summary());
    ASSERT_EQ(e.summary().value_size(), 3);
    EXPECT_EQ(e.summary().value(0).tag(), "train/loss");
    EXPECT_EQ(e.summary().value(0).simple_value(), want[i].loss);
    EXPECT_EQ(e.summary().value(1).tag(), "perf/mfu");
    EXPECT_TRUE(e.summary().value(1).has_simple_value());  // 0 is written too
    EXPECT_EQ(e.summary().value(1).simple_value(), want[i].mfu);
    EXPECT_EQ(e.summary().value(2).tag(), "memory/x");
    EXPECT_EQ(e.summary().value(2).simple_value(), want[i].mem);
  }
}

// Two runs within one second: distinct files, whose names sort in the order the
// runs started (the order TensorBoard reads them in).
TEST(TbEvents, FilesStartedInOneSecondGetNamesInOrder) {
  const fs::path dir = temp_dir("names");
  std::vector<std::string> names;
  for (int i = 0; i < 3; ++i) {
    TbEventWriter w(dir.string());
    w.write_scalars(i + 1, {{"a", static_cast<double>(i)}});
    names.push_back(w.path());
  }
  ASSERT_EQ(event_files(dir).size(), 3u);
  // Same second (almost always): base, base.1, base.2. Across a second boundary the
  // timestamps order them. Either way the sorted names are the creation order.
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, names);
  const Scalars s = merged_scalars(dir);
  ASSERT_EQ(s.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(s.at(i + 1).at("a"), static_cast<float>(i));
}

TEST(TbEvents, ErrorsNameTheDirectory) {
  const fs::path dir = temp_dir("errors");
  std::ofstream(dir / "plain") << "a file, not a directory";
  const std::string e = error_of([&] { TbEventWriter w((dir / "plain" / "tb").string()); });
  EXPECT_NE(e.find((dir / "plain" / "tb").string()), std::string::npos) << "a writer under a regular file: " << e;
}

TEST(TbEvents, StepScalarsCarryEveryMetric) {
  StepMetrics m;
  m.loss = 2.5;
  m.lr = 3e-4;
  m.grad_norm = 0.75;
  m.tokens_per_s = 12345;
  m.step_s = 0.5;
  m.tflops = 123.5;
  m.mfu = 0.25;
  m.peak_memory_bytes = 3ull << 30;
  const std::vector<TbScalar> s = step_scalars(m);
  std::map<std::string, double> got;
  for (const TbScalar& x : s) got[x.tag] = x.value;
  ASSERT_EQ(s.size(), step_scalar_tags().size());
  EXPECT_EQ(got.at("train/loss"), 2.5);
  EXPECT_EQ(got.at("train/lr"), 3e-4);
  EXPECT_EQ(got.at("train/grad_norm"), 0.75);
  EXPECT_EQ(got.at("perf/tokens_per_s"), 12345);
  EXPECT_EQ(got.at("perf/step_s"), 0.5);
  EXPECT_EQ(got.at("perf/tflops_per_rank"), 123.5);
  EXPECT_EQ(got.at("perf/mfu"), 0.25);
  EXPECT_EQ(got.at("memory/peak_allocated_gib"), 3.0);
}

// ---- training runs ------------------------------------------------------------------

RunConfig small_run(int steps, const fs::path& out) {
  RunConfig cfg = testing::tiny_run(
      steps, {.layers = 1, .hidden = 32, .intermediate = 64, .seq_len = 16, .micro_batch = 2, .warmup_steps = 2});
  cfg.run.out_dir = out.string();
  return cfg;
}

// Every tag at every step, each equal (as a float) to the step's metrics.jsonl value.
void expect_scalars_match_jsonl(const Scalars& tb, const fs::path& jsonl, int steps) {
  const auto js = testing::step_records(jsonl);
  ASSERT_EQ(tb.size(), static_cast<size_t>(steps));
  for (int step = 1; step <= steps; ++step) {
    ASSERT_TRUE(tb.count(step)) << "step " << step;
    const auto& v = tb.at(step);
    for (const std::string& tag : step_scalar_tags()) EXPECT_TRUE(v.count(tag)) << "step " << step << ": " << tag;
    ASSERT_TRUE(js.count(step)) << "step " << step;
    const nlohmann::json& j = js.at(step);
    EXPECT_EQ(v.at("train/loss"), static_cast<float>(j["loss"].get<double>())) << "step " << step;
    EXPECT_EQ(v.at("train/lr"), static_cast<float>(j["lr"].get<double>())) << "step " << step;
    EXPECT_EQ(v.at("train/grad_norm"), static_cast<float>(j["grad_norm"].get<double>())) << "step " << step;
    EXPECT_EQ(v.at("perf/tokens_per_s"), static_cast<float>(j["tokens_per_s"].get<double>())) << "step " << step;
    EXPECT_EQ(v.at("perf/step_s"), static_cast<float>(j["step_s"].get<double>())) << "step " << step;
    EXPECT_EQ(v.at("perf/tflops_per_rank"), static_cast<float>(j["tflops_per_rank"].get<double>())) << "step " << step;
    EXPECT_EQ(v.at("perf/mfu"), static_cast<float>(j["mfu"].get<double>())) << "step " << step;
    const double gib = static_cast<double>(j["peak_memory_bytes"].get<uint64_t>()) / (1ull << 30);
    EXPECT_EQ(v.at("memory/peak_allocated_gib"), static_cast<float>(gib)) << "step " << step;
    EXPECT_GT(v.at("memory/peak_allocated_gib"), 0.0f) << "the CPU backend counts its allocations";
    EXPECT_GT(v.at("perf/tokens_per_s"), 0.0f);
  }
}

TEST(TbEvents, ATrainingRunWritesEveryScalarAtEveryStep) {
  const fs::path out = temp_dir("train");
  const RunConfig cfg = small_run(5, out);
  const TrainResult r = train_on_cpu(cfg);
  ASSERT_EQ(r.losses.size(), 5u);
  ASSERT_EQ(event_files(out / "tb").size(), 1u);
  const Scalars tb = merged_scalars(out / "tb");
  expect_scalars_match_jsonl(tb, out / "metrics.jsonl", 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(tb.at(i + 1).at("train/loss"), static_cast<float>(r.losses[i]));
  // A fresh start over the finished run replaces its events, as it replaces metrics.jsonl.
  RunConfig again = cfg;
  again.run.resume = "none";
  again.train.steps = 3;
  train_on_cpu(again);
  ASSERT_EQ(event_files(out / "tb").size(), 1u);
  expect_scalars_match_jsonl(merged_scalars(out / "tb"), out / "metrics.jsonl", 3);
}

TEST(TbEvents, TensorboardFalseWritesNoTbDirectory) {
  const fs::path out = temp_dir("off");
  RunConfig cfg = small_run(2, out);
  cfg.run.tensorboard = false;
  EXPECT_EQ(train_on_cpu(cfg).losses.size(), 2u);
  EXPECT_TRUE(fs::exists(out / "metrics.jsonl"));
  EXPECT_FALSE(fs::exists(out / "tb"));
}

// A run that got to step 6 resumed from its step-3 checkpoint (as after a crash after
// step 6) continues at step 4: its new file starts with a START at step 4, so the
// merged view holds each step once, steps 4-6 from the resumed run, then 7 and 8.
TEST(TbEvents, AResumedRunAppendsAndSupersedesTheStepsAfterItsCheckpoint) {
  const fs::path out = temp_dir("resume");
  RunConfig cfg = small_run(6, out);
  cfg.run.checkpoint_every = 3;
  cfg.run.keep_last = 0;
  const TrainResult first = train_on_cpu(cfg);
  ASSERT_TRUE(fs::exists(out / "checkpoints/step-3/manifest.json"));
  // The first run's values at steps 4-6, marked so that the resumed run's must replace them.
  const Scalars before = merged_scalars(out / "tb");
  ASSERT_EQ(before.size(), 6u);

  RunConfig resumed = cfg;
  resumed.train.steps = 8;
  resumed.optim.lr = cfg.optim.lr * 2;  // other values from step 4 on: which file won is visible
  resumed.run.resume_config = "override";  // the other lr on purpose
  resumed.run.resume = (out / "checkpoints/step-3").string();
  const TrainResult second = train_on_cpu(resumed);
  ASSERT_EQ(second.losses.size(), 5u);  // steps 4..8

  const std::vector<fs::path> files = event_files(out / "tb");
  ASSERT_EQ(files.size(), 2u);
  const std::vector<tb::Event> later = read_events(files[1]);
  ASSERT_GE(later.size(), 2u);
  EXPECT_TRUE(later[1].has_session_log());
  EXPECT_EQ(later[1].step(), 4);
  const Scalars merged = merged_scalars(out / "tb");
  ASSERT_EQ(merged.size(), 8u);
  for (int step = 1; step <= 3; ++step)
    EXPECT_EQ(merged.at(step).at("train/loss"), static_cast<float>(first.losses[step - 1])) << step;
  for (int step = 4; step <= 8; ++step) {
    EXPECT_EQ(merged.at(step).at("train/loss"), static_cast<float>(second.losses[step - 4])) << step;
    for (const std::string& tag : step_scalar_tags()) EXPECT_TRUE(merged.at(step).count(tag)) << step << " " << tag;
  }
  EXPECT_NE(merged.at(5).at("train/lr"), before.at(5).at("train/lr"));
  // From step-3 once more: a third file, and still every step once.
  train_on_cpu(resumed);
  EXPECT_EQ(event_files(out / "tb").size(), 3u);
  EXPECT_EQ(merged_scalars(out / "tb").size(), 8u);
  // Nothing left to do (the newest checkpoint is step 8's): no file.
  RunConfig done = resumed;
  done.run.resume = "auto";
  EXPECT_TRUE(train_on_cpu(done).losses.empty());
  EXPECT_EQ(event_files(out / "tb").size(), 3u);
}

}  // namespace
}  // namespace st

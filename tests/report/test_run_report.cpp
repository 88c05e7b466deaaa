// shardtrain report: run directories of real (tiny, CPU) training runs read and
// rendered as one HTML page, bad input named by file and line, and a failed write
// leaving nothing behind.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "report/report.h"
#include "report/svg_plot.h"
#include "support/files.h"
#include "support/shell.h"

namespace st {
namespace {
namespace fs = std::filesystem;

using testing::read_file;
using testing::write_file;

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + needle.size())) ++n;
  return n;
}

// The <svg ...>...</svg> of one metric ("" when the page has none).
std::string plot_of(const std::string& html, const std::string& metric) {
  const size_t at = html.find("<svg class=\"chart\" data-metric=\"" + metric + "\"");
  if (at == std::string::npos) return "";
  const size_t end = html.find("</svg>", at);
  return html.substr(at, end - at);
}

testing::ShellResult sh(const std::string& args) {
  return testing::run_shell(std::string(SHARDTRAIN_BINARY) + " " + args);
}

// Two real runs of the tiny model on the CPU (a few steps, small dimensions): "big"
// at micro_batch 4 with the op profiler on, "small" at micro_batch 2.
class Report : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::path(::testing::TempDir()) / ("st_report_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    const std::string common =
        " --train.steps=4 --train.seq_len=32 --model.layers=2 --model.hidden_size=64 --model.intermediate_size=128"
        " --train.log_every=1 --run.progress=off";
    auto r = sh("train" + common + " --train.micro_batch=4 --run.profile=true --run.profile_warmup=1"
                " --run.profile_steps=2 --run.out_dir=" + (root_ / "big").string());
    ASSERT_EQ(r.code, 0) << r.out;
    r = sh("train" + common + " --train.micro_batch=2 --run.out_dir=" + (root_ / "small").string());
    ASSERT_EQ(r.code, 0) << r.out;
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // A copy of a run directory to change.
  static fs::path copy_of(const std::string& run, const std::string& as) {
    const fs::path to = root_ / as;
    fs::remove_all(to);
    fs::create_directories(to);
    for (const char* f : {"config.toml", "metrics.jsonl", "summary.json", "profile.json"})
      if (fs::exists(root_ / run / f)) fs::copy_file(root_ / run / f, to / f);
    return to;
  }

  static std::vector<RunData> both() {
    std::vector<RunData> runs = {read_run((root_ / "big").string()), read_run((root_ / "small").string())};
    label_runs(runs);
    return runs;
  }

  static fs::path root_;
};
fs::path Report::root_;

TEST_F(Report, ReadsWhatTrainWrote) {
  const RunData big = read_run((root_ / "big").string());
  EXPECT_EQ(big.name, "big");
  ASSERT_EQ(big.steps.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(big.steps[i].step, i + 1);
  EXPECT_TRUE(big.steps[0].values.contains("loss"));
  EXPECT_TRUE(big.steps[0].values.contains("tokens_per_s"));
  EXPECT_EQ(big.config.train.micro_batch, 4);
  EXPECT_EQ(big.config.train.seq_len, 32);
  EXPECT_EQ(big.config.model.num_layers, 2);  // resolved from config.toml
  EXPECT_TRUE(big.finished());
  EXPECT_FALSE(big.interrupted());
  EXPECT_EQ(big.world, 1);
  EXPECT_EQ(big.world_from, "summary.json");
  EXPECT_TRUE(big.profile.has_value());
  EXPECT_FALSE(big.transport.has_value());  // the CPU backend has no NCCL communicator
  const RunData small = read_run((root_ / "small").string() + "/");  // a trailing slash is the same directory
  EXPECT_EQ(small.name, "small");
  EXPECT_FALSE(small.profile.has_value());
}

TEST_F(Report, OnePlotPerMetricWithEveryRunAndItsLegend) {
  const std::vector<RunData> runs = both();
  EXPECT_EQ(runs[0].label, "big (mb4)");  // the runs differ in micro_batch: the labels say so
  EXPECT_EQ(runs[1].label, "small (mb2)");
  const std::string html = render_report(runs);
  const std::vector<std::string> absent = unrecorded_metrics(runs);
  // A CPU has no known peak TFLOP/s: no MFU.
  EXPECT_NE(std::find(absent.begin(), absent.end(), "mfu"), absent.end());
  size_t plotted = 0;
  for (const MetricInfo& m : report_metrics()) {
    const bool missing = std::find(absent.begin(), absent.end(), m.id) != absent.end();
    const std::string svg = plot_of(html, m.id);
    if (missing) {
      EXPECT_EQ(svg, "") << m.id;
      EXPECT_NE(html.find("<p class=\"note\" data-metric=\"" + m.id + "\"><strong>" + m.title + "</strong>: not recorded"),
                std::string::npos)
          << m.id;
      continue;
    }
    ++plotted;
    ASSERT_NE(svg, "") << m.id;
    EXPECT_EQ(count(svg, "<path class=\"series\""), 2u) << m.id;  // one line per run
    EXPECT_NE(svg.find("data-run=\"0\""), std::string::npos) << m.id;
    EXPECT_NE(svg.find("data-run=\"1\""), std::string::npos) << m.id;
    EXPECT_NE(svg.find(">big (mb4)"), std::string::npos) << m.id;  // the legend
    EXPECT_NE(svg.find(">small (mb2)"), std::string::npos) << m.id;
    EXPECT_NE(svg.find(">step</text>"), std::string::npos) << m.id;  // the x axis label
    EXPECT_GE(count(svg, "text-anchor=\"end\">"), 2u) << m.id;      // y tick labels
  }
  for (const char* id : {"loss", "lr", "grad_norm", "tokens_per_s"})
    EXPECT_NE(plot_of(html, id), "") << id << " must be plotted for real runs";
  EXPECT_EQ(count(html, "<svg"), plotted);
  // Self-contained: no script, nothing fetched.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg"));
  EXPECT_EQ(html.find("https://"), std::string::npos);
}

TEST_F(Report, HeadersHoldModelBatchArithmeticAndSummary) {
  const std::string html = render_report(both());
  EXPECT_NE(html.find("4 × 32 × 1 × 1 = 128 tokens/step"), std::string::npos);
  EXPECT_NE(html.find("2 × 32 × 1 × 1 = 64 tokens/step"), std::string::npos);
  EXPECT_NE(html.find("micro_batch × seq_len × grad_accum × world"), std::string::npos);
  EXPECT_NE(html.find("tiny with layers 2, hidden 64, intermediate 128"), std::string::npos);
  EXPECT_EQ(count(html, "finished: 4 steps"), 2u);
  EXPECT_EQ(count(html, "<dt>backend</dt><dd>cpu"), 2u);
  EXPECT_EQ(count(html, "<dt>world size</dt><dd>1 rank"), 2u);
  EXPECT_EQ(count(html, "<dt>tokens/s</dt>"), 2u);
  EXPECT_EQ(count(html, "<dt>peak memory</dt>"), 2u);
  EXPECT_EQ(count(html, "<dt>first step</dt>"), 2u);
  EXPECT_EQ(count(html, "no transport report"), 2u);
}

TEST_F(Report, ProfileTableOnlyForTheRunThatHasOne) {
  const std::string html = render_report(both());
  EXPECT_EQ(count(html, "<table class=\"profile\""), 1u);
  EXPECT_NE(html.find("id=\"profile-0\""), std::string::npos);
  EXPECT_EQ(html.find("id=\"profile-1\""), std::string::npos);
  const std::string table = html.substr(html.find("<table class=\"profile\""));
  EXPECT_NE(table.find("<td>matmul_forward"), std::string::npos);
  EXPECT_NE(table.find("<td>other (communication, host, gaps)</td>"), std::string::npos);
  EXPECT_NE(html.find("on cpu: 2 steps in the window"), std::string::npos);
}

TEST_F(Report, UnfinishedRunStillPlotsAndSaysSo) {
  const fs::path dir = copy_of("big", "stopped");
  fs::remove(dir / "summary.json");
  std::vector<RunData> runs = {read_run(dir.string()), read_run((root_ / "small").string())};
  EXPECT_FALSE(runs[0].finished());
  EXPECT_EQ(runs[0].world, 1);  // from the tokens one step added
  EXPECT_EQ(runs[0].world_from, "tokens per step");
  label_runs(runs);
  const std::string html = render_report(runs);
  EXPECT_NE(html.find("unfinished: no summary.json (4 steps logged, the last step 4 of 4)"), std::string::npos);
  EXPECT_EQ(count(plot_of(html, "loss"), "<path class=\"series\""), 2u);
}

TEST_F(Report, InterruptedRunSaysBySignalAfterWhichStep) {
  const fs::path dir = copy_of("small", "interrupted");
  write_file(dir / "summary.json",
             R"({"interrupted": true, "signal": 15, "steps_done": 3, "steps": 4, "checkpoint": ""})");
  const std::string html = render_report({read_run(dir.string())});
  EXPECT_NE(html.find("interrupted by signal 15 after step 3 of 4"), std::string::npos);
}

// A fake run: the real config.toml, metrics.jsonl written here.
fs::path fake_run(const fs::path& root, const std::string& name, const std::string& metrics) {
  const fs::path dir = root / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(root / "small" / "config.toml", dir / "config.toml");
  write_file(dir / "metrics.jsonl", metrics);
  return dir;
}

TEST_F(Report, MetricsPresentOnlyInSomeRunsAndDuplicateSteps) {
  // MFU known (a GPU run), memory not written (an older run), step 2 logged twice (a
  // resumed run): the later record counts.
  const fs::path gpu = fake_run(root_, "gpu",
                                R"({"step":1,"loss":5.0,"lr":1e-4,"grad_norm":2,"tokens_per_s":1000,"mfu":0.40,"tokens":64}
{"step":2,"loss":9.0,"lr":2e-4,"grad_norm":2,"tokens_per_s":1100,"mfu":0.41,"tokens":128}
{"future_record":{"x":1}}

{"step":2,"loss":4.0,"lr":2e-4,"grad_norm":1,"tokens_per_s":1200,"mfu":0.42,"tokens":128}
{"step":3,"loss":3.5,"lr":3e-4,"grad_norm":null,"tokens_per_s":1300,"mfu":0.43,"tokens":192}
)");
  const RunData g = read_run(gpu.string());
  ASSERT_EQ(g.steps.size(), 3u);
  EXPECT_EQ(g.steps[1].values.at("loss").get<double>(), 4.0);
  EXPECT_FALSE(g.steps[2].values.contains("grad_norm"));  // null: a gap, not a zero
  EXPECT_EQ(g.world, 1);
  std::vector<RunData> runs = {g};
  label_runs(runs);
  std::string html = render_report(runs);
  EXPECT_NE(plot_of(html, "mfu"), "");
  EXPECT_EQ(plot_of(html, "memory"), "");
  EXPECT_NE(html.find("<p class=\"note\" data-metric=\"memory\"><strong>Memory</strong>: not recorded"),
            std::string::npos);
  EXPECT_NE(html.find("MFU (%)"), std::string::npos);
  // MFU from this run only, and the CPU run is in its legend as not recorded.
  runs = {g, read_run((root_ / "small").string())};
  label_runs(runs);
  html = render_report(runs);
  const std::string mfu = plot_of(html, "mfu");
  EXPECT_EQ(count(mfu, "<path class=\"series\""), 1u);
  EXPECT_NE(mfu.find(">small (not recorded)</text>"), std::string::npos) << mfu;
}

// The (x, y) points of the first series path of an SVG.
std::vector<std::pair<double, double>> path_points(const std::string& svg) {
  std::vector<std::pair<double, double>> out;
  const size_t at = svg.find(" d=\"", svg.find("<path class=\"series\""));
  const std::string d = svg.substr(at + 4, svg.find('"', at + 4) - at - 4);
  std::istringstream in(d);
  char op, comma;
  double x, y;
  while (in >> op >> x >> comma >> y) out.push_back({x, y});
  return out;
}

TEST_F(Report, LongRunsAreThinnedButKeepTheirSpikes) {
  std::string metrics;
  for (int s = 1; s <= 20000; ++s)
    metrics += "{\"step\":" + std::to_string(s) + ",\"loss\":" + (s == 12345 ? "50" : "1.5") + "}\n";
  const fs::path dir = fake_run(root_, "long", metrics);
  const RunData r = read_run(dir.string());
  ASSERT_EQ(r.steps.size(), 20000u);
  const std::string svg = plot_of(render_report({r}), "loss");
  const auto points = path_points(svg);
  EXPECT_GT(points.size(), 500u);
  EXPECT_LT(points.size(), 4100u);
  // The spike is the highest point: at the top gridline (the y axis ends at 50).
  double top_grid = 1e9, highest = 1e9;
  for (size_t at = svg.find("<line x1="); at < svg.find("</g>"); at = svg.find("<line x1=", at + 1)) {
    const size_t y1 = svg.find("y1=\"", at);
    top_grid = std::min(top_grid, std::stod(svg.substr(y1 + 4)));
  }
  for (const auto& [x, y] : points) highest = std::min(highest, y);
  EXPECT_DOUBLE_EQ(highest, top_grid);
}

TEST(ReportTicks, OneTwoFiveSteps) {
  Ticks t = nice_ticks(1, 57, 6, true);
  EXPECT_EQ(t.step, 10);
  EXPECT_EQ(t.lo, 0);
  EXPECT_EQ(t.hi, 60);
  EXPECT_EQ(t.values.size(), 7u);
  t = nice_ticks(1.38, 5.61, 5, false);
  EXPECT_EQ(t.step, 1);
  EXPECT_EQ(t.lo, 1);
  EXPECT_EQ(t.hi, 6);
  t = nice_ticks(0, 3e-3, 5, true);
  EXPECT_DOUBLE_EQ(t.step, 1e-3);
  t = nice_ticks(0, 2300, 5, true);
  EXPECT_EQ(t.step, 500);
  EXPECT_EQ(t.hi, 2500);
  t = nice_ticks(0.2, 0.9, 5, false);
  EXPECT_DOUBLE_EQ(t.step, 0.2);
  EXPECT_DOUBLE_EQ(t.lo, 0.2);
  EXPECT_NEAR(t.hi, 1.0, 1e-12);
  // One value: a range around it.
  t = nice_ticks(54, 54, 5, false);
  EXPECT_LT(t.lo, 54);
  EXPECT_GT(t.hi, 54);
  for (double step : {nice_ticks(0, 7, 5).step, nice_ticks(0, 130, 5).step, nice_ticks(0, 0.07, 5).step}) {
    const double m = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
    EXPECT_TRUE(std::abs(m - 1) < 1e-9 || std::abs(m - 2) < 1e-9 || std::abs(m - 5) < 1e-9) << step;
  }
}

TEST_F(Report, LabelsTellSameNamesApartAndCanBeGiven) {
  const fs::path a = root_ / "x" / "run", b = root_ / "y" / "run";
  for (const fs::path& p : {a, b}) {
    fs::create_directories(p);
    for (const char* f : {"config.toml", "metrics.jsonl", "summary.json"})
      fs::copy_file(root_ / "small" / f, p / f, fs::copy_options::overwrite_existing);
  }
  std::vector<RunData> runs = {read_run(a.string()), read_run(b.string())};
  label_runs(runs);
  EXPECT_EQ(runs[0].label, "x/run");
  EXPECT_EQ(runs[1].label, "y/run");
  label_runs(runs, {"baseline", "efa"});
  EXPECT_EQ(runs[0].label, "baseline");
  EXPECT_THROW(label_runs(runs, {"only one"}), Error);
}

// ---- bad input ----------------------------------------------------------------------

std::string error_of(const std::string& dir) {
  try {
    read_run(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST_F(Report, MalformedMetricsLinesAreNamedByFileAndLine) {
  const std::string good = read_file(root_ / "small" / "metrics.jsonl");
  const std::string first = good.substr(0, good.find('\n') + 1);
  fs::path d = fake_run(root_, "bad1", first + first + "{\"step\": 3, \"loss\": \n");
  EXPECT_NE(error_of(d.string()).find((d / "metrics.jsonl").string() + ":3: not a JSON record"), std::string::npos)
      << error_of(d.string());
  d = fake_run(root_, "bad2", first + "[1, 2]\n");
  EXPECT_NE(error_of(d.string()).find("metrics.jsonl:2: expected a JSON object"), std::string::npos)
      << error_of(d.string());
  d = fake_run(root_, "bad3", first + "{\"step\": 2, \"loss\": \"low\"}\n");
  EXPECT_NE(error_of(d.string()).find("metrics.jsonl:2: \"loss\" must be a number"), std::string::npos)
      << error_of(d.string());
  d = fake_run(root_, "bad4", first + "{\"step\": -1, \"loss\": 1}\n");
  EXPECT_NE(error_of(d.string()).find("metrics.jsonl:2: \"step\" must be a positive integer"), std::string::npos)
      << error_of(d.string());
}

TEST_F(Report, BadRunDirectoriesAndFilesAreNamed) {
  EXPECT_NE(error_of((root_ / "nowhere").string()).find((root_ / "nowhere").string() + ": no such run directory"),
            std::string::npos);
  fs::path d = copy_of("small", "nometrics");
  fs::remove(d / "metrics.jsonl");
  EXPECT_NE(error_of(d.string()).find((d / "metrics.jsonl").string() + ": not found"), std::string::npos)
      << error_of(d.string());
  d = copy_of("small", "badsummary");
  write_file(d / "summary.json", "{\n \"steps\": 4,\n \"world\": ,\n}\n");
  EXPECT_NE(error_of(d.string()).find((d / "summary.json").string() + ":3: not valid JSON"), std::string::npos)
      << error_of(d.string());
  write_file(d / "summary.json", "{\n \"steps\": 4,\n \"world\": \"one\"\n}\n");
  EXPECT_NE(error_of(d.string()).find("summary.json:3: \"world\" must be a number"), std::string::npos)
      << error_of(d.string());
  d = copy_of("big", "badprofile");
  write_file(d / "profile.json", "{\"steps\": 2,\n\"rows\": 7}\n");
  EXPECT_NE(error_of(d.string()).find((d / "profile.json").string() + ":2: \"rows\" must be an array"),
            std::string::npos)
      << error_of(d.string());
  d = copy_of("small", "badconfig");
  write_file(d / "config.toml", "[train]\nmicro_batch = \"four\"\n");
  EXPECT_NE(error_of(d.string()).find("config.toml: key 'train.micro_batch' must be an integer, got a string (line 2)"),
            std::string::npos)
      << error_of(d.string());
}

// ---- the command ----------------------------------------------------------------------

TEST_F(Report, CommandWritesThePageAndRefusesBadOutputs) {
  const fs::path out = root_ / "out";
  fs::remove_all(out);
  fs::create_directories(out);
  const std::string runs = (root_ / "big").string() + " " + (root_ / "small").string();
  auto r = sh("report " + runs + " --out " + (out / "report.html").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("report: 2 runs -> " + (out / "report.html").string()), std::string::npos) << r.out;
  const std::string html = read_file(out / "report.html");
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("</html>"), std::string::npos);
  EXPECT_FALSE(fs::exists(out / "report.html.tmp"));

  // The default is report.html in the working directory.
  r = testing::run_shell("cd " + out.string() + " && mkdir -p cwd && cd cwd && " + SHARDTRAIN_BINARY + " report " +
                         runs);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(out / "cwd" / "report.html"));

  // A directory as --out, a missing parent directory, labels that do not match.
  r = sh("report " + runs + " --out " + out.string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find(out.string() + ": is a directory"), std::string::npos) << r.out;
  r = sh("report " + runs + " --out " + (out / "no" / "such" / "r.html").string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("does not exist"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out / "no"));
  r = sh("report " + runs + " --label one --out " + (out / "labels.html").string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--label given 1 time for 2 runs"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out / "labels.html"));
  r = sh("report " + runs + " --label one --label two --out " + (out / "labels.html").string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(read_file(out / "labels.html").find(">two</text>"), std::string::npos);

  // Bad input: the error names file:line, and nothing is written.
  const std::string good = read_file(root_ / "small" / "metrics.jsonl");
  const fs::path bad = fake_run(root_, "badcli", good.substr(0, good.find('\n') + 1) + "{oops\n");
  r = sh("report " + (root_ / "big").string() + " " + bad.string() + " --out " + (out / "bad.html").string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("shardtrain: error: " + (bad / "metrics.jsonl").string() + ":2:"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out / "bad.html"));
}

TEST_F(Report, FailedWriteLeavesNoFileAndKeepsTheOldOne) {
  // A file size limit (SIGXFSZ ignored, so the write fails with EFBIG) stops the
  // write half way.
  const fs::path out = root_ / "full";
  fs::remove_all(out);
  fs::create_directories(out);
  const std::string cmd = "trap '' XFSZ; ulimit -f 4; " + std::string(SHARDTRAIN_BINARY) + " report " +
                          (root_ / "big").string() + " " + (root_ / "small").string() + " --out ";
  auto r = testing::run_shell(cmd + (out / "new.html").string());
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find((out / "new.html.tmp").string()), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out / "new.html"));
  EXPECT_FALSE(fs::exists(out / "new.html.tmp"));

  write_file(out / "old.html", "the old report");
  r = testing::run_shell(cmd + (out / "old.html").string());
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_EQ(read_file(out / "old.html"), "the old report");
  EXPECT_FALSE(fs::exists(out / "old.html.tmp"));
  EXPECT_EQ(std::distance(fs::directory_iterator(out), fs::directory_iterator()), 1);
}

}  // namespace
}  // namespace st

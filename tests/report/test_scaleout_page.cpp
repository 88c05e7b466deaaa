// shardtrain report --scaleout: bench/scaleout.sh's scaleout.json read and drawn as a
// page (steps/s against link rate, measured and predicted, the runs' and faults'
// tables) and as a standalone SVG; bad input named by file and record, nothing
// written on a refusal.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "report/scaleout_page.h"
#include "support/files.h"
#include "support/shell.h"

namespace st {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using testing::read_file;
using testing::write_file;

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + needle.size())) ++n;
  return n;
}

json run(const char* strategy, json link, double step, json predicted, const char* name) {
  return {{"nodes", 2},          {"ranks_per_node", 1},
          {"strategy", strategy}, {"link_mbit", link},
          {"delay_ms", 0},        {"ok", true},
          {"step_s", step},       {"tokens_per_s", 128 / step},
          {"predicted_step_s", predicted}, {"tcp_one_flow_mbit", link.is_null() ? json(20000.0) : link},
          {"tx_bytes_per_step", {123.8e6, 123.9e6}}, {"comm_inter_tx_bytes_per_step", 123.5e6},
          {"overlap", true},      {"exposed_comm_s", 0.05},
          {"name", name}};
}

// The fields bench/scaleout.py assemble writes (docs/scaleout_bench.md), two
// strategies over three link settings, one fault that met its goal and one that did not.
json sweep() {
  json d = {{"date", "2026-12-04T17:59:25Z"},
            {"commit", "278d40e"},
            {"params", "20.66M"},
            {"machine", {{"nproc", 2}, {"kernel", "6.18"}, {"loadavg_start", {"1.57", "1.13", "0.49"}},
                         {"loadavg_end", {"0.23", "0.59", "0.46"}}, {"netem_available", false}}},
            {"runs", json::array()},
            {"faults", json::array()}};
  d["runs"].push_back(run("fsdp", nullptr, 0.471, nullptr, "01_fsdp_nolimit"));
  d["runs"].push_back(run("fsdp", 1000, 1.423, 1.459, "02_fsdp_1000"));
  d["runs"].push_back(run("fsdp", 200, 5.697, 5.412, "03_fsdp_200"));
  d["runs"].push_back(run("hsdp", nullptr, 0.644, nullptr, "04_hsdp_nolimit"));
  d["runs"].push_back(run("hsdp", 200, 4.028, 3.949, "05_hsdp_200"));
  d["runs"].push_back(run("hsdp", 1000, 1.353, 1.305, "06_hsdp_1000"));
  d["faults"].push_back({{"kind", "nodekill"},
                         {"outcome", "node 0 exited 4, its error 0.22 s after the loss"},
                         {"meets_goal", true},
                         {"node_exit_codes", {4, 137}},
                         {"messages", {{"node0", {"[rank 0] shardtrain: error: all_gather: the connection to rank 1 "
                                                  "(node 1) failed", "launch: rank 0: failed with exit code 4"}}}}});
  d["faults"].push_back({{"kind", "nodelost"}, {"outcome", "node 0 exited 4, 30.2 s after"}, {"meets_goal", false},
                         {"node_exit_codes", {4, 137}}});
  return d;
}

class ScaleoutPage : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) / ("st_scaleout_page_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "out");
    write_file(root_ / "out" / "scaleout.json", sweep().dump(1));
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string error_of(const json& d) {
    write_file(root_ / "bad.json", d.dump(1));
    try {
      read_scaleout((root_ / "bad.json").string());
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Data);
      return e.what();
    }
    return "(no error)";
  }
  fs::path root_;
};

TEST_F(ScaleoutPage, ReadsTheFolderOrTheFile) {
  const ScaleoutData d = read_scaleout((root_ / "out").string());
  EXPECT_EQ(d.path, (root_ / "out" / "scaleout.json").string());
  ASSERT_EQ(d.runs.size(), 6u);
  EXPECT_FALSE(d.runs[0].link_mbit.has_value());
  EXPECT_DOUBLE_EQ(*d.runs[2].link_mbit, 200);
  EXPECT_DOUBLE_EQ(*d.runs[2].predicted_step_s, 5.412);
  EXPECT_EQ(d.runs[4].series(), "2x1 hsdp");
  EXPECT_TRUE(d.runs[4].overlap);
  EXPECT_DOUBLE_EQ(*d.runs[4].exposed_comm_s, 0.05);
  // A run without the comm thread (dist.overlap = false, or a sweep from before it) is
  // a line of its own.
  json older = sweep();
  older["runs"][4].erase("overlap");
  older["runs"][4].erase("exposed_comm_s");
  write_file(root_ / "older.json", older.dump(1));
  const ScaleoutData o = read_scaleout((root_ / "older.json").string());
  EXPECT_EQ(o.runs[4].series(), "2x1 hsdp, no overlap");
  EXPECT_FALSE(o.runs[4].exposed_comm_s.has_value());
  ASSERT_EQ(d.faults.size(), 2u);
  EXPECT_EQ(d.faults[0].node0_error.find("[rank 0] shardtrain: error: all_gather"), 0u);
  EXPECT_EQ(d.faults[1].node0_error, "");
  EXPECT_EQ(d.nproc, 2);
  EXPECT_EQ(d.params, "20.66M");
  EXPECT_EQ(read_scaleout((root_ / "out" / "scaleout.json").string()).runs.size(), 6u);
}

TEST_F(ScaleoutPage, PlotsMeasuredAndPredictedStepsPerSecondPerStrategy) {
  const std::string svg = render_scaleout_svg(read_scaleout((root_ / "out").string()));
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_NE(svg.find("<style>"), std::string::npos);  // standalone: carries its own CSS
  // Two strategies x (measured, predicted); the unlimited runs have no x to sit at.
  EXPECT_EQ(count(svg, "<path class=\"series\""), 4u);
  EXPECT_EQ(count(svg, "stroke-dasharray=\"7 5\""), 2u * 2u);  // the predicted lines and their legend keys
  for (const char* label : {"2x1 fsdp measured", "2x1 fsdp predicted", "2x1 hsdp measured", "2x1 hsdp predicted"})
    EXPECT_NE(svg.find(std::string(">") + label + "</text>"), std::string::npos) << label;
  // One dot per run with a limit and a value: fsdp 2 + 2, hsdp 2 + 2.
  EXPECT_EQ(count(svg, "<circle class=\"dot\""), 8u);
  // Each line goes in order of link rate: hsdp's 200 (given after) comes before its 1000.
  const size_t hsdp = svg.find("<title>2x1 hsdp measured</title>");
  ASSERT_NE(hsdp, std::string::npos);
  const size_t path = svg.rfind(" d=\"M", hsdp);
  const std::string d = svg.substr(path + 5, hsdp - path - 5);  // "x0,y0Lx1,y1"...
  ASSERT_EQ(count(d, "L"), 1u) << d;
  EXPECT_LT(std::stod(d), std::stod(d.substr(d.find('L') + 1))) << d;
  EXPECT_NE(svg.find("link rate per node (Mbit/s)"), std::string::npos);
}

TEST_F(ScaleoutPage, PageHoldsTheHeaderThePlotAndBothTables) {
  const std::string html = render_scaleout_page(read_scaleout((root_ / "out").string()));
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("278d40e"), std::string::npos);
  EXPECT_NE(html.find("2 cores, kernel 6.18, no netem"), std::string::npos);
  EXPECT_NE(html.find("data-metric=\"scaleout-steps\""), std::string::npos);
  EXPECT_NE(html.find("2 runs with no link limit: in the table only"), std::string::npos);
  // A row per run with its ratio; a fault that missed its goal says so.
  EXPECT_EQ(count(html, "<tr><td>0"), 6u);
  EXPECT_NE(html.find("<td>5.697</td><td>0.176</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>5.412</td><td>0.950</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>123.8 / 123.9</td><td>123.5</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>nodelost</td><td>4, 137</td><td>node 0 exited 4, 30.2 s after</td><td><strong>no</strong>"),
            std::string::npos);
  EXPECT_NE(html.find("the connection to rank 1 (node 1) failed"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
}

TEST_F(ScaleoutPage, BadFilesAreNamedByRecordAndField) {
  json d = sweep();
  d["runs"][3]["step_s"] = "fast";
  EXPECT_NE(error_of(d).find("bad.json: runs[3]: \"step_s\" must be a number or null, got string"), std::string::npos)
      << error_of(d);
  d = sweep();
  d["runs"][1].erase("link_mbit");
  EXPECT_NE(error_of(d).find("runs[1]: \"link_mbit\" is missing"), std::string::npos) << error_of(d);
  d = sweep();
  d["runs"][2]["nodes"] = 0;
  EXPECT_NE(error_of(d).find("runs[2]: \"nodes\" must be a positive integer, got 0"), std::string::npos);
  d = sweep();
  d["runs"][2]["link_mbit"] = -5;
  EXPECT_NE(error_of(d).find("runs[2]: \"link_mbit\" must be positive or null"), std::string::npos);
  d = sweep();
  d.erase("runs");
  EXPECT_NE(error_of(d).find("bad.json: \"runs\" is missing"), std::string::npos);
  d = sweep();
  d["faults"][0] = 7;
  EXPECT_NE(error_of(d).find("faults[0]: must be an object, got number"), std::string::npos);
  write_file(root_ / "bad.json", "{\"runs\": [\n");
  EXPECT_THROW(read_scaleout((root_ / "bad.json").string()), Error);
  try {
    read_scaleout((root_ / "nothing").string());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nothing: not found (bench/scaleout.sh OUT writes OUT/scaleout.json)"),
              std::string::npos);
  }
}

TEST_F(ScaleoutPage, CommandWritesPageAndSvgAndRefusesBeforeWriting) {
  const std::string bin = SHARDTRAIN_BINARY;
  const fs::path out = root_ / "out";
  auto r = testing::run_shell(bin + " report --scaleout " + out.string() + " --out " + (out / "p.html").string() +
                              " --svg " + (out / "p.svg").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("(6 runs, 2 faults) -> " + (out / "p.html").string()), std::string::npos) << r.out;
  EXPECT_NE(read_file(out / "p.html").find("<table class=\"profile\" id=\"runs\">"), std::string::npos);
  EXPECT_EQ(read_file(out / "p.svg").rfind("<?xml", 0), 0u);

  // Mixed with run directories, --svg alone, nothing given: usage errors (exit 2).
  r = testing::run_shell(bin + " report " + out.string() + " --scaleout " + out.string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("give no RUN_DIR with it"), std::string::npos) << r.out;
  r = testing::run_shell(bin + " report --svg " + (out / "x.svg").string() + " " + out.string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--svg goes with --scaleout"), std::string::npos) << r.out;
  r = testing::run_shell(bin + " report");
  EXPECT_EQ(r.code, 2) << r.out;

  // A sweep with no limited link has no plot: --svg is refused and neither file is written.
  json d = sweep();
  json kept = json::array();
  for (const json& run : d["runs"])
    if (run["link_mbit"].is_null()) kept.push_back(run);
  d["runs"] = kept;
  fs::create_directories(root_ / "flat");
  write_file(root_ / "flat" / "scaleout.json", d.dump());
  r = testing::run_shell(bin + " report --scaleout " + (root_ / "flat").string() + " --out " +
                         (root_ / "flat" / "p.html").string() + " --svg " + (root_ / "flat" / "p.svg").string());
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("no run with a link limit, so there is nothing to plot"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(root_ / "flat" / "p.html"));
  EXPECT_FALSE(fs::exists(root_ / "flat" / "p.svg"));
  // Without --svg the page says so instead.
  r = testing::run_shell(bin + " report --scaleout " + (root_ / "flat").string() + " --out " +
                         (root_ / "flat" / "p.html").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(read_file(root_ / "flat" / "p.html").find("No run had a link limit"), std::string::npos);

  // A corrupt file: exit 3, the old page kept.
  write_file(root_ / "flat" / "scaleout.json", "{\"runs\": 5}");
  r = testing::run_shell(bin + " report --scaleout " + (root_ / "flat").string() + " --out " +
                         (root_ / "flat" / "p.html").string());
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("\"runs\" must be an array, got number"), std::string::npos) << r.out;
  EXPECT_NE(read_file(root_ / "flat" / "p.html").find("No run had a link limit"), std::string::npos);
}

}  // namespace
}  // namespace st

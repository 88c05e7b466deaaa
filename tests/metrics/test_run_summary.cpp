// summary.json: the bytes each kind of run writes (finished, interrupted by a signal,
// interrupted with run.term_grace_s passed) are those the trainer wrote by hand
// before RunSummary, they read back to the same summary, and every refusal of the
// reader names the file, the line where it can, and the key.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "metrics/run_summary.h"
#include "support/temp_dir.h"

namespace st {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

RunSummary finished_run() {
  return RunSummary{.steps = 300,
                    .world = 8,
                    .backend = "cuda (NVIDIA H200)",
                    .model = "qwen2-0.5b",
                    .seq_len = 2048,
                    .micro_batch = 4,
                    .grad_accum = 2,
                    .first_loss = 11.931,
                    .final_loss = 3.25,
                    .tokens_per_s = 812345.5,
                    .tokens_per_s_per_rank = 812345.5 / 8,
                    .flops_per_token = 3.1e9,
                    .tflops_per_rank = 314.75,
                    .mfu = 0.3182,
                    .peak_tflops = 989,
                    .peak_memory_bytes = size_t{41} << 30,
                    .first_step_after_start_s = 12.5};
}

// As the trainer built it before: the same keys, with the same C++ types.
std::string finished_run_as_before() {
  const double tokens_per_s = 812345.5;
  const int world = 8;
  return json{{"steps", 300},
              {"world", world},
              {"backend", std::string("cuda (NVIDIA H200)")},
              {"model", std::string("qwen2-0.5b")},
              {"seq_len", 2048},
              {"micro_batch", 4},
              {"grad_accum", 2},
              {"first_loss", 11.931},
              {"final_loss", 3.25},
              {"tokens_per_s", tokens_per_s},
              {"tokens_per_s_per_rank", tokens_per_s / world},
              {"flops_per_token", 3.1e9},
              {"tflops_per_rank", 314.75},
              {"mfu", 0.3182},
              {"peak_tflops", 989.0},
              {"peak_memory_bytes", size_t{41} << 30},
              {"first_step_after_start_s", 12.5}}
             .dump(1) +
         "\n";
}

RunSummary interrupted_run(bool grace_passed) {
  RunSummary s{.steps = 300, .interrupted = true, .signal = 15, .steps_done = 120};
  if (grace_passed) {
    s.checkpoint = "";
    s.checkpoint_incomplete = "term_grace_s passed";
  } else {
    s.checkpoint = "/runs/a/checkpoints";
    s.last_loss = 4.125;
  }
  return s;
}

// `text` in <temp>/st_<pid>_run_summary_<name>, removed when the test passes.
fs::path temp_file(const std::string& name, const std::string& text) {
  const fs::path p = st::testing::fresh_path("run_summary_" + name);
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
  return p;
}

// The message of read_run_summary's refusal ("" when it reads the file).
std::string refusal(const fs::path& p) {
  try {
    read_run_summary(p.string());
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Data) << e.what();
    return e.what();
  }
  return "";
}

TEST(RunSummary, AFinishedRunWritesTheBytesItAlwaysDid) {
  EXPECT_EQ(run_summary_text(finished_run()), finished_run_as_before());
  // One key a line, sorted.
  const std::string text = run_summary_text(finished_run());
  EXPECT_EQ(text.rfind("{\n \"backend\": \"cuda (NVIDIA H200)\",\n \"final_loss\": 3.25,\n", 0), 0u) << text;
  EXPECT_NE(text.find("\n \"peak_memory_bytes\": 44023414784,\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\n \"world\": 8\n}\n"), std::string::npos) << text;
  EXPECT_TRUE(finished_run().finished());
}

TEST(RunSummary, AnInterruptedRunWritesTheBytesItAlwaysDid) {
  EXPECT_EQ(run_summary_text(interrupted_run(false)),
            "{\n \"checkpoint\": \"/runs/a/checkpoints\",\n \"interrupted\": true,\n \"last_loss\": 4.125,\n"
            " \"signal\": 15,\n \"steps\": 300,\n \"steps_done\": 120\n}\n");
  const json by_signal = {{"interrupted", true}, {"signal", 15},    {"steps_done", 120},
                          {"steps", 300},        {"checkpoint", "/runs/a/checkpoints"}, {"last_loss", 4.125}};
  EXPECT_EQ(run_summary_text(interrupted_run(false)), by_signal.dump(1) + "\n");
  // The grace-period watchdog's: no loss, and why the checkpoint is missing.
  const json grace_passed = {{"interrupted", true}, {"signal", 15},     {"steps_done", 120},
                             {"steps", 300},        {"checkpoint", ""}, {"checkpoint_incomplete", "term_grace_s passed"}};
  EXPECT_EQ(run_summary_text(interrupted_run(true)), grace_passed.dump(1) + "\n");
  EXPECT_FALSE(interrupted_run(false).finished());
  EXPECT_EQ(run_summary_text(RunSummary{}), "{}\n");
}

TEST(RunSummary, WhatIsWrittenReadsBackTheSame) {
  for (const RunSummary& s : {finished_run(), interrupted_run(false), interrupted_run(true), RunSummary{}}) {
    const std::string text = run_summary_text(s);
    const fs::path p = temp_file("round_trip.json", text);
    const RunSummary back = read_run_summary(p.string());
    EXPECT_EQ(run_summary_text(back), text);
    EXPECT_EQ(back.finished(), s.finished());
    EXPECT_EQ(json::parse(text).get<RunSummary>().steps, s.steps);  // from_json, through nlohmann
  }
  const RunSummary f = read_run_summary(temp_file("f.json", run_summary_text(finished_run())).string());
  EXPECT_EQ(f.world, 8);
  EXPECT_EQ(f.backend, "cuda (NVIDIA H200)");
  EXPECT_EQ(f.peak_memory_bytes, uint64_t{41} << 30);
  EXPECT_EQ(f.first_step_after_start_s, 12.5);
  EXPECT_FALSE(f.interrupted.has_value());
  const RunSummary i = read_run_summary(temp_file("i.json", run_summary_text(interrupted_run(true))).string());
  EXPECT_EQ(i.signal, 15);
  EXPECT_EQ(i.steps_done, 120);
  EXPECT_EQ(i.checkpoint, "");
  EXPECT_EQ(i.checkpoint_incomplete, "term_grace_s passed");
  EXPECT_FALSE(i.last_loss.has_value());
}

// A summary of another version, or written by hand: the keys it has, the others
// unset; keys it does not know are ignored.
TEST(RunSummary, AReaderTakesWhatIsThere) {
  const RunSummary s = read_run_summary(
      temp_file("partial.json", R"({"interrupted": true, "signal": 2, "steps": 4, "note": [1, 2]})").string());
  EXPECT_FALSE(s.finished());
  EXPECT_EQ(s.signal, 2);
  EXPECT_FALSE(s.steps_done.has_value());
  EXPECT_FALSE(s.checkpoint.has_value());
  EXPECT_TRUE(read_run_summary(temp_file("false.json", R"({"interrupted": false})").string()).finished());
  // Ranks only as a whole number; a byte count below 0 as 0; integers from whole floats.
  const RunSummary odd =
      read_run_summary(temp_file("odd.json", R"({"world": 2.5, "peak_memory_bytes": -3, "steps": 4.0})").string());
  EXPECT_FALSE(odd.world.has_value());
  EXPECT_EQ(odd.peak_memory_bytes, 0u);
  EXPECT_EQ(odd.steps, 4);
}

TEST(RunSummary, EveryRefusalNamesTheFileTheLineAndTheKey) {
  fs::path p = temp_file("missing.json", "");
  fs::remove(p);
  EXPECT_EQ(refusal(p), p.string() + ": cannot read");
  p = temp_file("syntax.json", "{\n \"steps\": 4,\n \"world\": ,\n}\n");
  EXPECT_EQ(refusal(p).rfind(p.string() + ":3: not valid JSON: ", 0), 0u) << refusal(p);
  p = temp_file("array.json", "[1, 2]\n");
  EXPECT_EQ(refusal(p), p.string() + ":1: expected a JSON object, got array");
  p = temp_file("number.json", "{\n \"steps\": 4,\n \"world\": \"one\"\n}\n");
  EXPECT_EQ(refusal(p), p.string() + ":3: \"world\" must be a number, got string");
  for (const char* key : {"steps", "seq_len", "micro_batch", "grad_accum", "first_loss", "final_loss", "tokens_per_s",
                          "tokens_per_s_per_rank", "flops_per_token", "tflops_per_rank", "mfu", "peak_tflops",
                          "peak_memory_bytes", "first_step_after_start_s", "signal", "steps_done", "last_loss"}) {
    p = temp_file("number.json", std::string("{\n \"") + key + "\": null\n}\n");
    EXPECT_EQ(refusal(p), p.string() + ":2: \"" + key + "\" must be a number, got null");
  }
  for (const char* key : {"backend", "model", "checkpoint", "checkpoint_incomplete"}) {
    p = temp_file("string.json", std::string("{\"steps\": 4,\n \"") + key + "\": 7\n}\n");
    EXPECT_EQ(refusal(p), p.string() + ":2: \"" + key + "\" must be a string, got number");
  }
  p = temp_file("bool.json", "{\n \"interrupted\": \"yes\"\n}\n");
  EXPECT_EQ(refusal(p), p.string() + ": \"interrupted\" must be true or false, got string");
  // The numbers are checked first, then the strings, then "interrupted".
  p = temp_file("order.json", "{\"interrupted\": 1,\n \"backend\": 2,\n \"mfu\": \"x\"}\n");
  EXPECT_EQ(refusal(p), p.string() + ":3: \"mfu\" must be a number, got string");
  // Without the file's text there is no line; nlohmann's from_json names summary.json.
  try {
    json{{"steps", "four"}}.get<RunSummary>();
    ADD_FAILURE() << "a string step count was read";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "summary.json: \"steps\" must be a number, got string");
  }
}

}  // namespace
}  // namespace st

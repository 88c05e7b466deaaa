// The binary as a user runs it: exit codes, messages, files written.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "backend/factory.h"
#include "support/files.h"
#include "support/fork_ranks.h"
#include "support/shell.h"
#include "support/temp_dir.h"

namespace {
namespace fs = std::filesystem;

using Result = st::testing::ShellResult;
Result sh(const std::string& args) { return st::testing::run_shell(std::string(SHARDTRAIN_BINARY) + " " + args); }

using st::testing::fresh_path;
using st::testing::read_file;

TEST(Cli, HelpListsCommandsAndConfigKeys) {
  Result r = sh("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("train"), std::string::npos) << r.out;
  r = sh("train --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--train.steps"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--optim.lr"), std::string::npos) << r.out;
}

TEST(Cli, NoCommandIsAnError) { EXPECT_NE(sh("").code, 0); }

TEST(Cli, ShortRunWritesMetricsAndConfig) {
  const fs::path out = fresh_path("run");
  Result r = sh("train --train.steps=3 --train.seq_len=32 --train.micro_batch=2 --train.log_every=1 --run.out_dir=" +
                out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step 3/3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("memory per rank"), std::string::npos) << r.out;
  std::ifstream in(out / "metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    ++lines;
    EXPECT_NE(line.find("\"loss\""), std::string::npos);
    EXPECT_NE(line.find("\"tokens_per_s\""), std::string::npos);
  }
  EXPECT_EQ(lines, 3);
  EXPECT_TRUE(fs::exists(out / "config.toml"));
  // The written config runs again as is.
  r = sh("train --config " + (out / "config.toml").string() + " --train.steps=1 --run.out_dir=" + out.string());
  EXPECT_EQ(r.code, 0) << r.out;
}

TEST(Cli, BadConfigsExitNonZeroNamingFileAndKey) {
  const fs::path dir = fresh_path("bad");
  fs::create_directories(dir);
  const fs::path unknown = dir / "unknown.toml", wrong = dir / "wrong.toml", heads = dir / "heads.toml";
  std::ofstream(unknown) << "[train]\nstepz = 10\n";
  std::ofstream(wrong) << "[train]\nsteps = \"ten\"\n";
  std::ofstream(heads) << "[model]\npreset = \"tiny\"\nheads = 3\n";

  Result r = sh("train --config " + unknown.string());
  EXPECT_EQ(r.code, 2);  // a configuration error
  EXPECT_NE(r.out.find("stepz"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("unknown.toml"), std::string::npos) << r.out;

  r = sh("train --config " + wrong.string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("train.steps"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("wrong.toml"), std::string::npos) << r.out;

  r = sh("train --config " + heads.string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("divisible"), std::string::npos) << r.out;

  r = sh("train --train.steps=abc");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("train.steps"), std::string::npos) << r.out;

  r = sh("train --model.preset=qwen9");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("qwen2.5-1.5b"), std::string::npos) << r.out;  // lists known presets

  r = sh("train --data.paths=/nonexistent/corpus --train.steps=1");
  EXPECT_EQ(r.code, 3);  // input data
  EXPECT_NE(r.out.find("/nonexistent/corpus"), std::string::npos) << r.out;

  r = sh("train --config " + (dir / "absent.toml").string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("absent.toml"), std::string::npos) << r.out;
}

TEST(Cli, ScoreMatchesTransformersLossAndExportReloads) {
  const fs::path fx = fs::path(SHARDTRAIN_TEST_DATA) / "hf" / "untied_kv2_sharded";
  const fs::path logits = fresh_path("logits.npy");
  Result r = sh("score --init-from " + fx.string() + " --tokens " + (fx / "tokens.npy").string() + " --logits-out " +
                logits.string());
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string j = read_file(fx / "expected.json");
  const double want = std::stod(j.substr(j.find("\"loss\"") + 7));
  const double got = std::stod(r.out.substr(r.out.find("loss ") + 5));
  EXPECT_NEAR(got, want, 1e-5 * want) << r.out;
  EXPECT_TRUE(fs::exists(logits));

  // Export to bf16, score again: close to the f32 loss; a second export is refused.
  const fs::path out = fresh_path("export_bf16");
  r = sh("export --init-from " + fx.string() + " --out " + out.string() + " --dtype bf16");
  ASSERT_EQ(r.code, 0) << r.out;
  r = sh("score --init-from " + out.string() + " --tokens " + (fx / "tokens.npy").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NEAR(std::stod(r.out.substr(r.out.find("loss ") + 5)), want, 0.02 * want) << r.out;
  r = sh("export --init-from " + fx.string() + " --out " + out.string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--force"), std::string::npos) << r.out;
}

TEST(Cli, TrainFromAHuggingFaceModelAndExport) {
  const fs::path fx = fs::path(SHARDTRAIN_TEST_DATA) / "hf" / "tied_kv2_f32";
  const fs::path run = fresh_path("init_from_run"), out = fresh_path("init_from_export");
  Result r = sh("train --init-from " + fx.string() + " --data.source=random --train.steps=2 --train.seq_len=16 " +
                "--train.micro_batch=2 --run.out_dir=" + run.string() + " --run.export_dir=" + out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("vocab 96"), std::string::npos) << r.out;  // the model came from config.json
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
  // Exporting into a directory that holds a model fails before training starts.
  r = sh("train --init-from " + fx.string() + " --data.source=random --train.steps=2 --train.seq_len=16 " +
         "--run.out_dir=" + run.string() + " --run.export_dir=" + out.string());
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out.find("step 1/2"), std::string::npos) << r.out;
  // A checkpoint that does not match the model is one error listing the problems.
  r = sh("train --init-from " + fx.string() + " --model.config=" +
         (fs::path(SHARDTRAIN_TEST_DATA) / "hf" / "untied_kv1_f32").string() +
         " --data.source=random --train.steps=1 --train.seq_len=16 --run.out_dir=" + run.string());
  EXPECT_EQ(r.code, 3);  // the model files do not match
  EXPECT_NE(r.out.find("missing tensors"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lm_head.weight"), std::string::npos) << r.out;
}

// ---- hardening: the exit-code scheme and malformed inputs ------------------------------

bool has(const Result& r, const std::string& part) { return r.out.find(part) != std::string::npos; }

// A copy of a fixture model whose f32 tensor `tensor` has every value set to `v`.
fs::path model_with(const std::string& name, const std::string& tensor, float v) {
  const fs::path fx = fs::path(SHARDTRAIN_TEST_DATA) / "hf" / "tied_kv2_f32";
  const fs::path dir = fresh_path(name);
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(fx / f, dir / f);
  std::fstream io(dir / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  uint64_t n = 0;
  io.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  io.read(header.data(), static_cast<std::streamsize>(n));
  const std::string key = "\"" + tensor + "\"";
  const size_t at = header.find("data_offsets", header.find(key));
  unsigned long long b = 0, e = 0;
  std::sscanf(header.c_str() + header.find('[', at), "[%llu,%llu]", &b, &e);
  io.seekp(static_cast<std::streamoff>(8 + n + b));
  for (unsigned long long i = b; i < e; i += 4) io.write(reinterpret_cast<const char*>(&v), 4);
  return dir;
}

int free_port() { return st::test::free_port(); }

// 0 ok, 1 runtime, 2 usage/config, 3 input data or model files, 4 distributed
// (docs/operations.md, "Errors and exit codes"), from the binary as a user runs it.
TEST(Cli, ExitCodesFollowTheDocumentedScheme) {
  const fs::path fx = fs::path(SHARDTRAIN_TEST_DATA) / "hf" / "tied_kv2_f32";
  const std::string model = " --init-from " + fx.string();
  EXPECT_EQ(sh("presets").code, 0);
  EXPECT_EQ(sh("--help").code, 0);
  EXPECT_EQ(sh("--version").code, 0);

  // 2: the command line or the configuration.
  Result r = sh("train --no-such-flag");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(sh("score").code, 2);  // required options missing
  EXPECT_EQ(sh("frobnicate").code, 2);
  EXPECT_EQ(sh("train --train.steps=abc").code, 2);
  EXPECT_EQ(sh("train --model.heads=3").code, 2);
  EXPECT_EQ(sh("launch --nproc-per-node 0 -- train").code, 2);
  EXPECT_EQ(sh("export --out " + fresh_path("no_source").string()).code, 2);

  // 3: input data and model files.
  const fs::path dir = fresh_path("codes");
  fs::create_directories(dir);
  std::ofstream(dir / "bad.npy") << "\x93NUMPY\x01\x00\x10\x00{'descr': '<i4'}";
  r = sh("score" + model + " --tokens " + (dir / "bad.npy").string());
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_TRUE(has(r, "bad.npy")) << r.out;
  fs::create_directories(dir / "corrupt");
  fs::copy_file(fx / "config.json", dir / "corrupt" / "config.json");
  std::ofstream(dir / "corrupt" / "model.safetensors") << "\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": 1}       ";
  r = sh("score --init-from " + (dir / "corrupt").string() + " --tokens " + (fx / "tokens.npy").string());
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_TRUE(has(r, "model.safetensors")) << r.out;
  fs::create_directories(dir / "badjson");
  std::ofstream(dir / "badjson" / "config.json") << "{\"hidden_size\": ";
  r = sh("train --model.config=" + (dir / "badjson").string() + " --train.steps=1");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_TRUE(has(r, "--model.config")) << r.out;
  EXPECT_EQ(sh("train --data.paths=/nonexistent/corpus --train.steps=1").code, 3);

  // 1: runtime, here a run that cannot fit in memory (refused before it allocates).
  r = sh("train --model.preset=qwen2.5-7b --model.layers=100000 --train.steps=1 --run.out_dir=" +
         (dir / "huge").string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r, "not enough memory")) << r.out;
  EXPECT_LT(r.seconds, 20);

  // 4: distributed, a rank whose rendezvous server never answers.
  const std::string port = std::to_string(free_port());
  r = st::testing::run_shell("RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " " +
                             SHARDTRAIN_BINARY + " train --data.source=random --train.steps=1 --dist.timeout_s=1");
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_TRUE(has(r, "cannot reach the rendezvous server")) << r.out;

  // `launch` exits with the failing rank's code.
  r = sh("launch --nproc-per-node 2 --master-port " + std::to_string(free_port()) + " -- train --train.stepz=1");
  EXPECT_EQ(r.code, 2) << r.out;
  r = sh("launch --nproc-per-node 1 --master-port " + std::to_string(free_port()) + " -- score" + model + " --tokens " +
         (dir / "bad.npy").string());
  EXPECT_EQ(r.code, 3) << r.out;
}

TEST(Cli, UnknownOptionSuggestsTheNearestKey) {
  Result r = sh("train --train.stepz=3");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r, "unknown key 'train.stepz' (did you mean --train.steps?")) << r.out;
  r = sh("train --optim.lr 1e-3 --trian.seq_len 8");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r, "did you mean --train.seq_len?")) << r.out;
  r = sh("train stray");  // not an option at all: CLI11's own message
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r, "stray")) << r.out;
}

// A mistyped command is named, with the nearest one, at every level that takes a
// command; not "A subcommand is required" (one was given).
TEST(Cli, UnknownCommandSuggestsTheNearest) {
  for (const char* typo : {"traim", "trian"}) {
    const Result r = sh(typo);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_TRUE(has(r, std::string("unknown command '") + typo + "' (did you mean train?")) << r.out;
    EXPECT_FALSE(has(r, "A subcommand is required")) << r.out;
  }
  Result r = sh("data prepaer --help");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r, "unknown command 'data prepaer' (did you mean data prepare?")) << r.out;
  r = sh("xyzzy");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r, "unknown command 'xyzzy' (commands: train, ")) << r.out;
  EXPECT_EQ(sh("train --help").code, 0);  // a known command and options are untouched
  EXPECT_EQ(sh("--version").code, 0);
}

// A warm-up as long as the run: the schedule never decays, which deserves a word.
TEST(Cli, AWarmupAsLongAsTheRunIsWarnedAbout) {
  const std::string run = "train --train.seq_len=32 --train.micro_batch=2 --train.steps=2 --run.out_dir=" +
                          fresh_path("warmup").string();
  Result r = sh(run + " --optim.warmup_steps=2");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r, "warning: optim.warmup_steps (2) is not below train.steps (2)")) << r.out;
  r = sh(run + " --optim.warmup_steps=1 --run.resume=none");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(has(r, "optim.warmup_steps")) << r.out;
}

// "--run.out_dir=" is an empty value: it once took the next argument as its value and
// ran 300 steps into a directory named "--train.steps=1".
TEST(Cli, AnEmptyValueDoesNotSwallowTheNextArgument) {
  const fs::path cwd = fresh_path("empty_value");
  fs::create_directories(cwd);
  const Result r = st::testing::run_shell("cd " + cwd.string() + " && " + SHARDTRAIN_BINARY +
                                          " train --run.out_dir= --train.steps=1");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r, "--run.out_dir must not be empty")) << r.out;
  EXPECT_TRUE(fs::is_empty(cwd));
}

TEST(Cli, NonFiniteAndOutOfRangeNumbersAreRefused) {
  for (const char* v : {"inf", "nan", "1e30"}) {
    const Result r = sh(std::string("train --optim.lr=") + v);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_TRUE(has(r, "--optim.lr must be")) << r.out;
  }
  const std::string out = fresh_path("shard_gb").string();
  for (const char* v : {"nan", "inf", "1e30", "1e-12", "-1", "abc"}) {
    const Result r = sh("export --preset tiny --out " + out + " --max-shard-gb " + v);
    EXPECT_EQ(r.code, 2) << v << ": " << r.out;
    EXPECT_TRUE(has(r, "--max-shard-gb")) << r.out;
    EXPECT_LT(r.out.size(), 400u) << r.out;  // no 309-digit bound
    EXPECT_FALSE(fs::exists(out));
  }
  EXPECT_TRUE(has(sh("export --preset tiny --out " + out + " --max-shard-gb 1e30"), "[0.001, 1e+06]"));
  EXPECT_EQ(sh("launch --nproc-per-node 1 --grace-period nan -- presets").code, 2);
}

TEST(Cli, ScoreRefusesNonFiniteWeightsAndLosses) {
  const fs::path tokens = fs::path(SHARDTRAIN_TEST_DATA) / "hf" / "tied_kv2_f32" / "tokens.npy";
  const fs::path nan_model = model_with("nan_model", "model.norm.weight", std::nanf(""));
  Result r = sh("score --init-from " + nan_model.string() + " --tokens " + tokens.string());
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_TRUE(has(r, "model.norm.weight")) << r.out;
  EXPECT_FALSE(has(r, "loss ")) << r.out;
  // Finite weights too large for the activations: the loss is not a number.
  const fs::path huge = model_with("huge_model", "model.embed_tokens.weight", 3e38f);
  r = sh("score --init-from " + huge.string() + " --tokens " + tokens.string());
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_TRUE(has(r, "not a finite number")) << r.out;
  EXPECT_FALSE(has(r, "loss -nan")) << r.out;
}

TEST(Cli, ScoreChecksItsOutputBeforeScoring) {
  const fs::path fx = fs::path(SHARDTRAIN_TEST_DATA) / "hf" / "tied_kv2_f32";
  const fs::path dir = fresh_path("logits_dir");
  fs::remove(dir.string() + ".tmp");  // what an earlier, failing run may have left
  fs::create_directories(dir);
  Result r = sh("score --init-from " + fx.string() + " --tokens " + (fx / "tokens.npy").string() + " --logits-out " +
                dir.string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r, "--logits-out '" + dir.string() + "' is a directory")) << r.out;
  EXPECT_FALSE(has(r, "loss ")) << r.out;  // refused before the work
  EXPECT_FALSE(fs::exists(dir.string() + ".tmp"));
  r = sh("score --init-from " + fx.string() + " --tokens " + (fx / "tokens.npy").string() +
         " --logits-out /nonexistent/dir/logits.npy");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r, "'/nonexistent/dir' does not exist")) << r.out;
}

TEST(Cli, ScoreNamesItsOwnDeviceFlag) {
  const fs::path fx = fs::path(SHARDTRAIN_TEST_DATA) / "hf" / "tied_kv2_f32";
  if (st::visible_devices("cuda") > 0) GTEST_SKIP() << "a GPU is visible here";
  const Result r = sh("score --device cuda --init-from " + fx.string() + " --tokens " + (fx / "tokens.npy").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r, "--device cuda")) << r.out;
  EXPECT_FALSE(has(r, "train.device")) << r.out;
}

TEST(Cli, ExportKeepsTheSourceConfigsOtherKeys) {
  const fs::path fx = fs::path(SHARDTRAIN_TEST_DATA) / "hf" / "tied_kv2_f32";
  const fs::path out = fresh_path("keep_keys");
  const Result r = sh("export --init-from " + fx.string() + " --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string text = read_file(out / "config.json");
  for (const char* key : {"\"bos_token_id\"", "\"eos_token_id\"", "\"pad_token_id\"", "\"transformers_version\"",
                          "\"rope_parameters\"", "\"layer_types\""})
    EXPECT_NE(text.find(key), std::string::npos) << key << " dropped:\n" << text;
}

// Two jobs on one rendezvous port: a rank of the second reaching the first one's
// rank 0 is refused naming both jobs (exit 4), and the first job trains on.
TEST(Cli, ARankOfAnotherJobCannotJoin) {
  const fs::path dir = fresh_path("two_jobs");
  fs::create_directories(dir);
  const std::string port = std::to_string(free_port()), bin = SHARDTRAIN_BINARY, d = dir.string();
  const std::string common = " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " WORLD_SIZE=2 " + bin +
                             " train --data.source=random --train.steps=1 --train.seq_len=16 --train.micro_batch=2"
                             " --dist.timeout_s=60 --run.progress=off --run.out_dir=";
  const Result r = st::testing::run_shell(
      "(SHARDTRAIN_JOB_ID=job-a RANK=0" + common + d + "/a > " + d + "/a0.log 2>&1; echo $? > " + d + "/a0.rc) & " +
      "SHARDTRAIN_JOB_ID=job-b RANK=1" + common + d + "/b > " + d + "/b1.log 2>&1; echo $? > " + d + "/b1.rc; " +
      "SHARDTRAIN_JOB_ID=job-a RANK=1" + common + d + "/a > " + d + "/a1.log 2>&1; echo $? > " + d + "/a1.rc; wait");
  auto read = [&](const char* f) { return read_file(dir / f); };
  EXPECT_EQ(read("b1.rc"), "4\n") << read("b1.log");
  EXPECT_NE(read("b1.log").find("rank 1 of job 'job-b' reached the rendezvous of another job"), std::string::npos)
      << read("b1.log");
  EXPECT_EQ(read("a0.rc"), "0\n") << read("a0.log");
  EXPECT_EQ(read("a1.rc"), "0\n") << read("a1.log");
  EXPECT_NE(read("a0.log").find("step 1/1"), std::string::npos) << read("a0.log");
}

TEST(Cli, ASymbolicLinkLoopInTheDataIsNamed) {
  const fs::path dir = fresh_path("loop");
  fs::create_directories(dir / "a");
  std::ofstream(dir / "a" / "text.txt") << "some text to train on, long enough for a window";
  fs::create_directory_symlink(dir, dir / "a" / "loop");
  const Result r = sh("train --data.paths=" + dir.string() + " --train.steps=1 --run.out_dir=" + (dir / "out").string());
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_TRUE(has(r, "symbolic link loop")) << r.out;
  EXPECT_TRUE(has(r, (dir / "a" / "loop").string())) << r.out;
  EXPECT_FALSE(has(r, "does not exist")) << r.out;
}

}  // namespace


// The binary as a user runs it: exit codes, messages, files written.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "support/shell.h"

namespace {
namespace fs = std::filesystem;

using Result = st::testing::ShellResult;
Result sh(const std::string& args) { return st::testing::run_shell(std::string(SHARDTRAIN_BINARY) + " " + args); }

fs::path temp(const std::string& name) {
  fs::path p = fs::path(::testing::TempDir()) / ("st_cli_" + name);
  fs::remove_all(p);
  return p;
}

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
  const fs::path out = temp("run");
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
  const fs::path dir = temp("bad");
  fs::create_directories(dir);
  const fs::path unknown = dir / "unknown.toml", wrong = dir / "wrong.toml", heads = dir / "heads.toml";
  std::ofstream(unknown) << "[train]\nstepz = 10\n";
  std::ofstream(wrong) << "[train]\nsteps = \"ten\"\n";
  std::ofstream(heads) << "[model]\npreset = \"tiny\"\nheads = 3\n";

  Result r = sh("train --config " + unknown.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("stepz"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("unknown.toml"), std::string::npos) << r.out;

  r = sh("train --config " + wrong.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("train.steps"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("wrong.toml"), std::string::npos) << r.out;

  r = sh("train --config " + heads.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("divisible"), std::string::npos) << r.out;

  r = sh("train --train.steps=abc");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("train.steps"), std::string::npos) << r.out;

  r = sh("train --model.preset=qwen9");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("qwen2.5-1.5b"), std::string::npos) << r.out;  // lists known presets

  r = sh("train --data.paths=/nonexistent/corpus --train.steps=1");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("/nonexistent/corpus"), std::string::npos) << r.out;

  r = sh("train --config " + (dir / "absent.toml").string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("absent.toml"), std::string::npos) << r.out;
}

TEST(Cli, ScoreMatchesTransformersLossAndExportReloads) {
  const fs::path fx = fs::path(SHARDTRAIN_TEST_DATA) / "hf" / "untied_kv2_sharded";
  const fs::path logits = temp("logits.npy");
  Result r = sh("score --init-from " + fx.string() + " --tokens " + (fx / "tokens.npy").string() + " --logits-out " +
                logits.string());
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream jf(fx / "expected.json");
  std::stringstream js;
  js << jf.rdbuf();
  const std::string j = js.str();
  const double want = std::stod(j.substr(j.find("\"loss\"") + 7));
  const double got = std::stod(r.out.substr(r.out.find("loss ") + 5));
  EXPECT_NEAR(got, want, 1e-5 * want) << r.out;
  EXPECT_TRUE(fs::exists(logits));

  // Export to bf16, score again: close to the f32 loss; a second export is refused.
  const fs::path out = temp("export_bf16");
  r = sh("export --init-from " + fx.string() + " --out " + out.string() + " --dtype bf16");
  ASSERT_EQ(r.code, 0) << r.out;
  r = sh("score --init-from " + out.string() + " --tokens " + (fx / "tokens.npy").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NEAR(std::stod(r.out.substr(r.out.find("loss ") + 5)), want, 0.02 * want) << r.out;
  r = sh("export --init-from " + fx.string() + " --out " + out.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--force"), std::string::npos) << r.out;
}

TEST(Cli, TrainFromAHuggingFaceModelAndExport) {
  const fs::path fx = fs::path(SHARDTRAIN_TEST_DATA) / "hf" / "tied_kv2_f32";
  const fs::path run = temp("init_from_run"), out = temp("init_from_export");
  Result r = sh("train --init-from " + fx.string() + " --data.source=random --train.steps=2 --train.seq_len=16 " +
                "--train.micro_batch=2 --run.out_dir=" + run.string() + " --run.export_dir=" + out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("vocab 96"), std::string::npos) << r.out;  // the model came from config.json
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
  // Exporting into a directory that holds a model fails before training starts.
  r = sh("train --init-from " + fx.string() + " --data.source=random --train.steps=2 --train.seq_len=16 " +
         "--run.out_dir=" + run.string() + " --run.export_dir=" + out.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out.find("step 1/2"), std::string::npos) << r.out;
  // A checkpoint that does not match the model is one error listing the problems.
  r = sh("train --init-from " + fx.string() + " --model.config=" +
         (fs::path(SHARDTRAIN_TEST_DATA) / "hf" / "untied_kv1_f32").string() + " --train.steps=1 --train.seq_len=16 --run.out_dir=" +
         run.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("missing tensors"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lm_head.weight"), std::string::npos) << r.out;
}

}  // namespace

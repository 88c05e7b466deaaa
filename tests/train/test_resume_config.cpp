// Resuming under other settings (run.resume_config): a checkpoint's manifest records the
// run config it was saved under; a run resuming from it under settings that change what
// is trained is refused naming every such key, old -> new (exit 2), unless
// run.resume_config = "override", which warns naming them; train.steps, logging and output
// settings may change in silence.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "config/run_config.h"
#include "core/error.h"
#include "support/errors.h"
#include "support/shell.h"
#include "support/temp_dir.h"
#include "support/tiny_run.h"
#include "train/resume_config.h"
#include "train/trainer.h"

namespace st {
namespace {

namespace fs = std::filesystem;
using testing::caught_error;
using testing::temp_dir;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ---- the comparison of two configurations ------------------------------------------------

TEST(RunConfigChanges, NamesEveryKeyThatDiffersOldAndNewInSchemaOrder) {
  RunConfig before = testing::tiny_run(4);
  before.data.paths = {"a.txt"};
  RunConfig after = before;
  EXPECT_TRUE(run_config_changes(run_config_toml(before), "saved", after).empty());
  after.train.micro_batch = 16;
  after.optim.lr = 1e-3;
  after.data.paths = {"a.txt", "b.txt"};
  const std::vector<ConfigChange> c = run_config_changes(run_config_toml(before), "saved", after);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].key, "train.micro_batch");
  EXPECT_EQ(c[0].before, "8");
  EXPECT_EQ(c[0].after, "16");
  EXPECT_EQ(c[1].key, "optim.lr");
  EXPECT_EQ(c[1].after, "0.001");
  EXPECT_EQ(c[2].key, "data.paths");
  EXPECT_EQ(c[2].before, "[\"a.txt\"]");
  EXPECT_EQ(c[2].after, "[\"a.txt\", \"b.txt\"]");
}

// A text of another version: a key it lacks is not compared, one this version does not
// know is passed over; a value of the wrong type is a data error naming the source.
TEST(RunConfigChanges, ComparesOnlyTheKeysTheSavedTextHolds) {
  RunConfig now = testing::tiny_run(4);
  now.optim.lr = 0.5;
  EXPECT_TRUE(run_config_changes("[train]\nmicro_batch = 8\nfuture_key = 3\n[future]\nx = 1\n", "saved", now).empty());
  const std::vector<ConfigChange> c = run_config_changes("[train]\nmicro_batch = 4\n", "saved", now);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].key, "train.micro_batch");
  const std::optional<Error> e = caught_error([&] { run_config_changes("[train]\nsteps = \"x\"\n", "m.json", now); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::Data);
  EXPECT_TRUE(has(e->what(), "m.json")) << e->what();
  EXPECT_TRUE(has(e->what(), "train.steps")) << e->what();
}

// ---- the policy ----------------------------------------------------------------------------

TEST(ResumeConfig, FreeKeysPassInSilenceOthersAreRefusedAllNamed) {
  RunConfig saved = testing::tiny_run(4);
  const std::string text = run_config_toml(saved);
  RunConfig now = saved;
  now.train.steps = 40;
  now.train.log_every = 3;
  now.run.out_dir = "elsewhere";
  now.run.checkpoint_every = 7;
  now.run.profile = true;
  now.fabric.transport = "socket";
  now.dist.timeout_s = 10;
  now.dist.overlap = false;
  now.train.matmul_dtype = "fp8";  // the same fp32 state either way
  EXPECT_EQ(check_resume_config(text, "ck/step-2", now), "");
  now.train.micro_batch = 4;
  now.train.seed = 9;
  now.dist.reduce_dtype = "bf16";
  const std::optional<Error> e = caught_error([&] { check_resume_config(text, "ck/step-2", now); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::Usage);
  const std::string m = e->what();
  EXPECT_TRUE(has(m, "ck/step-2")) << m;
  EXPECT_TRUE(has(m, "train.micro_batch 8 -> 4")) << m;
  EXPECT_TRUE(has(m, "train.seed 1234 -> 9")) << m;
  EXPECT_TRUE(has(m, "dist.reduce_dtype \"fp32\" -> \"bf16\"")) << m;
  EXPECT_FALSE(has(m, "train.steps")) << m;
  EXPECT_FALSE(has(m, "run.out_dir \"")) << m;
  EXPECT_TRUE(has(m, "--run.resume_config=override")) << m;
  now.run.resume_config = "override";
  const std::string w = check_resume_config(text, "ck/step-2", now);
  EXPECT_TRUE(has(w, "train.micro_batch 8 -> 4")) << w;
  EXPECT_TRUE(has(w, "train.seed 1234 -> 9")) << w;
  EXPECT_FALSE(has(w, "train.steps")) << w;
  // A checkpoint that records no configuration has nothing to compare.
  now.run.resume_config = "refuse";
  EXPECT_EQ(check_resume_config("", "ck/step-2", now), "");
}

// ---- the trainer, in process ----------------------------------------------------------------

TEST(ResumeConfig, TheTrainerRefusesBeforeLoadingAndOverrideContinues) {
  const fs::path dir = temp_dir("resume_config");
  RunConfig cfg = testing::tiny_run(4, {.micro_batch = 4, .warmup_steps = 1});
  cfg.run.checkpoint_dir = (dir / "ck").string();
  cfg.run.checkpoint_every = 2;
  ASSERT_EQ(testing::train_on_cpu(cfg).losses.size(), 4u);
  // More steps, other logging: continues from step 4.
  RunConfig longer = cfg;
  longer.train.steps = 6;
  longer.train.log_every = 2;
  EXPECT_EQ(testing::train_on_cpu(longer).losses.size(), 2u);
  // Another micro-batch and learning rate, from step 6: refused, both named.
  RunConfig other = longer;
  other.train.steps = 8;
  other.train.micro_batch = 8;
  other.optim.lr = 1e-3;
  const std::optional<Error> e = caught_error([&] { testing::train_on_cpu(other); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::Usage);
  EXPECT_TRUE(has(e->what(), (dir / "ck/step-6").string())) << e->what();
  EXPECT_TRUE(has(e->what(), "train.micro_batch 4 -> 8")) << e->what();
  EXPECT_TRUE(has(e->what(), "optim.lr 0.003 -> 0.001")) << e->what();
  EXPECT_FALSE(fs::exists(dir / "ck/step-8"));
  // Override: trained on under the new settings, with a warning naming them.
  other.run.resume_config = "override";
  ::testing::internal::CaptureStderr();
  const std::optional<Error> failed = caught_error([&] { EXPECT_EQ(testing::train_on_cpu(other).losses.size(), 2u); });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(failed) << failed->what();
  EXPECT_TRUE(has(err, "train.micro_batch 4 -> 8")) << err;
  EXPECT_TRUE(has(err, "optim.lr 0.003 -> 0.001")) << err;
  // The new checkpoint records the new settings: resuming under them again is silent.
  other.train.steps = 10;
  other.run.resume_config = "refuse";
  EXPECT_EQ(testing::train_on_cpu(other).losses.size(), 2u);
}

// ---- the command line ---------------------------------------------------------------------

TEST(ResumeConfig, TheCommandLineRefusesWithExitTwoAndOverrideWarns) {
  const fs::path out = temp_dir("resume_config_cli") / "run";
  const std::string run = std::string(SHARDTRAIN_BINARY) +
                          " train --model.preset=tiny --model.layers=2 --model.hidden_size=64"
                          " --model.intermediate_size=128 --train.seq_len=32 --optim.warmup_steps=1"
                          " --run.progress=off --run.checkpoint_every=2 --run.out_dir=" + out.string();
  const auto first = testing::run_shell(run + " --train.steps=2 --train.micro_batch=4");
  ASSERT_EQ(first.code, 0) << first.out;
  const auto refused = testing::run_shell(run + " --train.steps=4 --train.micro_batch=8");
  EXPECT_EQ(refused.code, 2) << refused.out;
  EXPECT_TRUE(has(refused.out, "train.micro_batch 4 -> 8")) << refused.out;
  EXPECT_TRUE(has(refused.out, "--run.resume_config=override")) << refused.out;
  const auto overridden =
      testing::run_shell(run + " --train.steps=4 --train.micro_batch=8 --run.resume_config=override");
  EXPECT_EQ(overridden.code, 0) << overridden.out;
  EXPECT_TRUE(has(overridden.out, "warning: run.resume_config=override")) << overridden.out;
  EXPECT_TRUE(has(overridden.out, "train.micro_batch 4 -> 8")) << overridden.out;
}

}  // namespace
}  // namespace st

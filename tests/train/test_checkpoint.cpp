// Sharded checkpoints: a resumed run repeats an uninterrupted one bit for bit; a
// checkpoint saved at N ranks (FSDP or HSDP) loads at M ranks with every master
// weight and AdamW moment where it belongs; a damaged checkpoint is refused naming
// the file; a killed save is never picked.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "backend/backend.h"
#include "comm/comm_gloo.h"
#include "comm/process_groups.h"
#include "comm/tcp_store.h"
#include "core/error.h"
#include "fsdp/fsdp.h"
#include "io/checkpoint.h"
#include "config/model_config.h"
#include "model/init.h"
#include "support/errors.h"
#include "support/fork_ranks.h"
#include "support/temp_dir.h"
#include "support/tiny_run.h"
#include "train/checkpointing.h"
#include "train/trainer.h"

namespace st {
namespace {

namespace fs = std::filesystem;

using testing::error_of;
using testing::temp_dir;
using testing::tiny_run;

ModelConfig small_model() {
  ModelConfig c = model_preset("tiny");
  c.num_layers = 2;
  c.hidden_size = 32;
  c.intermediate_size = 40;
  c.vocab_size = 61;  // odd unit sizes: shards need padding at every world size
  return c;
}

RunConfig small_run(int steps, const fs::path& ckpt) {
  RunConfig cfg = tiny_run(steps, {.micro_batch = 4, .warmup_steps = 3});
  cfg.run.checkpoint_dir = ckpt.string();
  return cfg;
}

TrainResult train(const RunConfig& cfg, std::vector<float>* final_weights = nullptr) {
  return testing::train_on_cpu(cfg, [&](Trainer& t) {
    if (final_weights)
      for (int u = 0; u < t.params().plan().num_units(); ++u)
        for (float x : t.params().gather_unit(u)) final_weights->push_back(x);
  });
}

TEST(Checkpoint, ResumedRunRepeatsTheUninterruptedOneBitForBit) {
  const fs::path dir = temp_dir("resume");
  RunConfig straight = small_run(12, dir / "straight");
  straight.run.checkpoint_every = 5;  // step-5, step-10, step-12
  straight.run.keep_last = 0;
  std::vector<float> want_w;
  const TrainResult a = train(straight, &want_w);
  ASSERT_TRUE(fs::exists(dir / "straight/step-5/manifest.json"));
  // From step 5, as if the run had been killed after it: the same 7 steps after it.
  RunConfig again = small_run(12, dir / "straight");
  again.run.resume = (dir / "straight/step-5").string();
  std::vector<float> got_w;
  const TrainResult b = train(again, &got_w);
  ASSERT_EQ(b.losses.size(), 7u);
  for (size_t i = 0; i < 7; ++i) {
    EXPECT_EQ(b.losses[i], a.losses[5 + i]) << "step " << 6 + i;  // bitwise
    EXPECT_EQ(b.grad_norms[i], a.grad_norms[5 + i]) << "step " << 6 + i;
  }
  EXPECT_EQ(got_w, want_w);
  // auto: the newest complete checkpoint (step 12: nothing left to do).
  RunConfig autorun = small_run(12, dir / "straight");
  EXPECT_TRUE(train(autorun).losses.empty());
  autorun.run.resume = "none";
  EXPECT_EQ(train(autorun).losses.size(), 12u);
}

// bf16 master and moments, offloaded to host memory: checkpoints store them as fp32
// (exactly: bf16 widens without loss) and a resume converts them back, so the resumed
// run repeats the uninterrupted one bit for bit; resuming with the state on the device
// instead (train.offload is free to change) changes nothing either.
TEST(Checkpoint, Bf16OffloadedStateResumesBitForBit) {
  const fs::path dir = temp_dir("resume-bf16");
  RunConfig straight = small_run(8, dir / "run");
  straight.optim.state_dtype = straight.optim.master_dtype = "bf16";
  straight.train.offload = "optimizer+master";
  straight.run.checkpoint_every = 4;
  straight.run.keep_last = 0;
  std::vector<float> want_w;
  const TrainResult a = train(straight, &want_w);
  for (const char* offload : {"optimizer+master", "none"}) {
    RunConfig again = straight;
    again.train.offload = offload;
    again.run.checkpoint_every = 0;
    again.run.resume = (dir / "run/step-4").string();
    std::vector<float> got_w;
    const TrainResult b = train(again, &got_w);
    ASSERT_EQ(b.losses.size(), 4u) << offload;
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(b.losses[i], a.losses[4 + i]) << offload << ", step " << 5 + i;
    EXPECT_EQ(got_w, want_w) << offload;
  }
  // An fp32 checkpoint continues under bf16 state (converted on load, rounded to nearest).
  RunConfig f32 = small_run(8, dir / "f32");
  f32.run.checkpoint_every = 4;
  train(f32);
  RunConfig to_bf16 = f32;
  to_bf16.optim.state_dtype = to_bf16.optim.master_dtype = "bf16";
  to_bf16.run.checkpoint_every = 0;
  to_bf16.run.resume = (dir / "f32/step-4").string();
  const TrainResult c = train(to_bf16);
  ASSERT_EQ(c.losses.size(), 4u);
  for (double l : c.losses) EXPECT_TRUE(std::isfinite(l));
}

// FP8 with delayed scaling: the checkpoint carries the amax history (manifest.json's
// fp8_scaling), so the resumed run scales as the uninterrupted one did and repeats it
// bit for bit (without it, the first resumed step would scale from its current amax).
// A run whose FP8 layers differ starts a history of its own; a damaged record is a data
// error naming the manifest and the field.
TEST(Checkpoint, Fp8DelayedScalingResumesBitForBit) {
  const fs::path dir = temp_dir("resume-fp8");
  RunConfig straight = small_run(8, dir / "run");
  straight.train.matmul_dtype = "fp8";
  straight.train.fp8_scaling = "delayed";
  // With the lm_head's gradients, rounded stochastically: the count of casts that keys
  // the rounding is saved too.
  straight.train.fp8_layers = {"qkv", "o", "gate_up", "down", "lm_head_grad"};
  straight.train.fp8_dlogits_rounding = "stochastic";
  straight.run.checkpoint_every = 4;
  straight.run.keep_last = 0;
  std::vector<float> want_w;
  const TrainResult a = train(straight, &want_w);
  const fs::path step4 = dir / "run/step-4";
  const CheckpointManifest m = read_checkpoint(step4.string(), true);
  ASSERT_TRUE(m.fp8_scaling.is_object()) << m.to_json().dump();
  EXPECT_EQ(m.fp8_scaling.at("rolls"), 3) << "steps 2-4 rolled the history";
  EXPECT_EQ(m.fp8_scaling.at("history_len"), Qwen2Model::kFp8History);
  EXPECT_GT(m.fp8_scaling.at("dlogits_casts").get<int>(), 0);

  RunConfig again = straight;
  again.run.checkpoint_every = 0;
  again.run.resume = step4.string();
  std::vector<float> got_w;
  const TrainResult b = train(again, &got_w);
  ASSERT_EQ(b.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(b.losses[i], a.losses[4 + i]) << "step " << 5 + i;  // bitwise
    EXPECT_EQ(b.grad_norms[i], a.grad_norms[4 + i]) << "step " << 5 + i;
  }
  EXPECT_EQ(got_w, want_w);

  // Other FP8 layers: the saved history does not fit; the run goes on from its current amax.
  RunConfig other = again;
  other.train.fp8_layers = {"gate_up", "down", "lm_head_grad"};
  const TrainResult c = train(other);
  ASSERT_EQ(c.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(std::isfinite(c.losses[i])) << "step " << 5 + i;
  EXPECT_NE(c.losses[0], a.losses[4]);

  // A damaged record: refused, naming the manifest and the field.
  nlohmann::json j = m.to_json();
  std::string hist = j["fp8_scaling"]["history"].get<std::string>();
  j["fp8_scaling"]["history"] = hist.substr(0, hist.size() - 8);
  {
    std::ofstream out(step4 / "manifest.json", std::ios::trunc);
    out << j.dump(1);
  }
  const std::string e = error_of([&] { train(again); });
  EXPECT_NE(e.find("manifest.json: fp8_scaling"), std::string::npos) << e;
  EXPECT_NE(e.find("'history'"), std::string::npos) << e;
}

// A fresh start over a run that stopped half way without checkpoints is refused,
// saying how to go on; over a finished run, or with resume=none, it starts.
TEST(Checkpoint, AnUnfinishedRunDirectoryIsNotWrittenOver) {
  const fs::path dir = temp_dir("outdir");
  RunConfig cfg = small_run(2, dir / "ck");
  cfg.run.out_dir = (dir / "run").string();
  EXPECT_EQ(train(cfg).losses.size(), 2u);
  EXPECT_EQ(train(cfg).losses.size(), 2u);  // finished: a new run may take the directory
  fs::remove(dir / "run/summary.json");     // as if killed before the end
  const std::string e = error_of([&] { train(cfg); });
  EXPECT_NE(e.find("holds an unfinished run"), std::string::npos) << e;
  EXPECT_NE(e.find("--run.resume=none"), std::string::npos) << e;
  cfg.run.resume = "none";
  EXPECT_EQ(train(cfg).losses.size(), 2u);
}

// What every rank's shard must hold: the init values for the master weights, and
// moments that are a function of the global element index.
float m_of(size_t unit, size_t i) { return static_cast<float>(unit * 100000 + i) * 1e-3f; }
float v_of(size_t unit, size_t i) { return static_cast<float>(unit * 7 + i) * 1e-4f + 1.0f; }

// Saves at `from` ranks (shard groups of `from_g`), loads at `to` ranks (groups of
// `to_g`), and checks every element of every rank's shards after the load.
void reshard(const std::string& name, int from, int from_g, int to, int to_g) {
  const ModelConfig c = small_model();
  const fs::path dir = temp_dir(name);
  auto run = [&](int world, int g, bool save) {
    const int port = test::free_port();
    return test::run_ranks(world, [&](int rank) {
      auto be = make_cpu_backend();
      const Rendezvous where{.rank = rank, .world = world, .master_port = port};
      ProcessGroups groups = world == 1 ? make_single_process_groups(*be) : init_process_groups(where, *be, g, 30);
      ParamLayout layout(c);
      ShardPlan plan(layout, groups.shard->world());
      Fsdp f(plan, *be, *groups.shard, groups.replicate.get(), {});
      if (save) {
        f.init_weights(17);
        for (int u = 0; u < plan.num_units(); ++u) {
          const ElemRange r = plan.range_of(u, groups.shard->rank());
          std::vector<float> m(r.size()), v(r.size());
          for (size_t i = 0; i < r.size(); ++i) {
            const bool pad = r.begin + i >= plan.numel(u);
            m[i] = pad ? 0 : m_of(u, r.begin + i);
            v[i] = pad ? 0 : v_of(u, r.begin + i);
          }
          f.upload_shard(u, ShardState::AdamM, m);
          f.upload_shard(u, ShardState::AdamV, v);
        }
        CheckpointSave w;
        w.dir = dir.string();
        w.step = 3;
        save_checkpoint(w, c, f, *groups.world, *groups.shard, groups.replicate.get());
        return;
      }
      f.init_weights(99);  // different values: the load must replace all of them
      const CheckpointManifest m = load_checkpoint(checkpoint_step_dir(dir.string(), 3), c, f, *groups.world,
                                                   *groups.shard);
      ST_CHECK(m.step == 3 && m.shard_world == from_g, "rank ", rank, ": manifest step/world");
      size_t differ = 0, checked = 0;
      for (int u = 0; u < plan.num_units(); ++u) {
        const ElemRange r = plan.range_of(u, groups.shard->rank());
        std::vector<float> want(r.size());
        init_unit_values(layout.unit(u), 17, 0.02, r.begin, r.end, want.data());
        const auto master = f.download_shard(u, ShardState::Master), mm = f.download_shard(u, ShardState::AdamM),
                   vv = f.download_shard(u, ShardState::AdamV);
        for (size_t i = 0; i < r.size(); ++i) {
          const bool pad = r.begin + i >= plan.numel(u);
          differ += master[i] != want[i];
          differ += mm[i] != (pad ? 0.0f : m_of(u, r.begin + i));
          differ += vv[i] != (pad ? 0.0f : v_of(u, r.begin + i));
          checked += 3;
        }
      }
      ST_CHECK(differ == 0, "rank ", rank, ": ", differ, " of ", checked, " values differ after loading");
    });
  };
  for (const std::string& e : run(from, from_g, true)) ASSERT_EQ(e, "") << name << " save";
  const auto m = read_checkpoint(checkpoint_step_dir(dir.string(), 3), true);
  EXPECT_EQ(m.shard_world, from_g);
  EXPECT_EQ(static_cast<int>(m.files.size()), from_g);  // one file per shard rank, not per replica
  for (const std::string& e : run(to, to_g, false)) EXPECT_EQ(e, "") << name << " load";
}

TEST(Checkpoint, ReshardsTwoRanksToThree) { reshard("2to3", 2, 2, 3, 3); }
TEST(Checkpoint, ReshardsFourRanksToOne) { reshard("4to1", 4, 4, 1, 1); }
TEST(Checkpoint, ReshardsHsdpTwoByTwoToFour) { reshard("hsdp", 4, 2, 4, 4); }

// ---- integrity -----------------------------------------------------------------------

class Damaged : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp_dir("damaged");
    RunConfig cfg = small_run(2, dir_);
    cfg.run.checkpoint_every = 2;
    train(cfg);
    step_ = dir_ / "step-2";
    ASSERT_TRUE(fs::exists(step_ / "manifest.json"));
  }
  std::string load_error(const ModelConfig* other = nullptr) {
    RunConfig cfg = small_run(4, dir_);
    if (other) cfg.model = *other;
    cfg.run.resume = step_.string();
    return error_of([&] { train(cfg); });
  }
  fs::path dir_, step_;
};

TEST_F(Damaged, AFlippedByteIsRefusedNamingTheFile) {
  const fs::path shard = step_ / checkpoint_shard_file(0, 1);
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(shard) / 2));
    char c;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(fs::file_size(shard) / 2));
    c = static_cast<char>(c ^ 0x10);
    f.write(&c, 1);
  }
  const std::string e = load_error();
  EXPECT_NE(e.find(shard.string()), std::string::npos) << e;
  EXPECT_NE(e.find("corrupt"), std::string::npos) << e;
}

TEST_F(Damaged, ATruncatedOrMissingShardIsRefused) {
  const fs::path shard = step_ / checkpoint_shard_file(0, 1);
  fs::resize_file(shard, fs::file_size(shard) - 100);
  std::string e = load_error();
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  fs::remove(shard);
  e = load_error();
  EXPECT_NE(e.find(shard.string() + ": missing"), std::string::npos) << e;
}

TEST_F(Damaged, AnotherModelIsRefused) {
  RunConfig other = small_run(4, dir_);
  other.model.hidden_size = 128;
  const std::string e = load_error(&other.model);
  EXPECT_NE(e.find("a checkpoint of another model"), std::string::npos) << e;
}

TEST_F(Damaged, AKilledSaveIsNeverPicked) {
  // A save killed before its rename leaves step-N.tmp: auto takes the last complete one.
  fs::create_directories(dir_ / "step-4.tmp");
  std::ofstream(dir_ / "step-4.tmp" / "manifest.json") << "{}";
  EXPECT_EQ(find_latest_checkpoint(dir_.string()), step_.string());
  // `latest` naming a directory without its manifest is passed over too.
  fs::create_directories(dir_ / "step-6");
  std::ofstream(dir_ / "latest") << "step-6\n";
  EXPECT_EQ(find_latest_checkpoint(dir_.string()), step_.string());
  // ... and named, for the warning that says so.
  std::vector<std::string> passed_over;
  EXPECT_EQ(find_latest_checkpoint(dir_.string(), &passed_over), step_.string());
  EXPECT_EQ(passed_over, std::vector<std::string>{(dir_ / "step-6").string()});
  prune_checkpoints(dir_.string(), 1);
  EXPECT_FALSE(fs::exists(dir_ / "step-4.tmp"));
  EXPECT_TRUE(fs::exists(step_));
}

// keep_last removes an old checkpoint all or nothing: renamed to step-N.deleting first
// (which nothing loads), then removed, so a process killed while removing it never
// leaves a step-N with only part of its files; what it leaves goes at the next prune.
TEST(Checkpoint, PruningIsAllOrNothingWhenKilledHalfWay) {
  const fs::path dir = temp_dir("prune_kill");
  constexpr int kFiles = 20000;  // enough that removing them takes a while
  fs::create_directories(dir / "step-2");
  std::ofstream(dir / "step-2" / "manifest.json") << "{}";
  fs::create_directories(dir / "step-1");
  std::ofstream(dir / "step-1" / "manifest.json") << "{}";
  for (int i = 0; i < kFiles; ++i) std::ofstream(dir / "step-1" / ("f" + std::to_string(i)));
  auto entries = [](const fs::path& p) {
    std::error_code ec;
    int n = 0;
    for (auto it = fs::directory_iterator(p, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) ++n;
    return n;
  };
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    prune_checkpoints(dir.string(), 1);
    ::_exit(0);
  }
  // Kill it as soon as the removal has begun: step-1 gone or shrinking.
  while (fs::exists(dir / "step-1") && entries(dir / "step-1") == kFiles + 1) {
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (fs::exists(dir / "step-1")) EXPECT_EQ(entries(dir / "step-1"), kFiles + 1) << "step-1 was left half removed";
  EXPECT_EQ(find_latest_checkpoint(dir.string()), (dir / "step-2").string());
  prune_checkpoints(dir.string(), 1);
  EXPECT_FALSE(fs::exists(dir / "step-1"));
  EXPECT_FALSE(fs::exists(dir / "step-1.deleting"));
  EXPECT_TRUE(fs::exists(dir / "step-2" / "manifest.json"));
}

}  // namespace
}  // namespace st

// The run configuration: TOML reading, command-line overrides, checks, round trip.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "config/run_config.h"
#include "support/temp_dir.h"

namespace st {
namespace {

namespace fs = std::filesystem;

// A new, empty <temp>/st_<pid>_run_config_<name>, removed when the test passes.
fs::path temp_dir(const std::string& name) { return st::testing::temp_dir("run_config_" + name); }

// Writes `text` to <temp>/<name>/run.toml and returns the path.
std::string write_toml(const std::string& name, const std::string& text) {
  fs::path p = temp_dir(name) / "run.toml";
  std::ofstream(p) << text;
  return p.string();
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

template <class F>
ErrorKind kind_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.kind();
  }
  ADD_FAILURE() << "no error thrown";
  return ErrorKind::Runtime;
}

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << "'" << (part) << "' not in: " << (msg)

// The TOML without its comment lines (the header comment says where values came from).
std::string without_comments(const std::string& text) {
  std::istringstream in(text);
  std::string out;
  for (std::string line; std::getline(in, line);)
    if (line.rfind('#', 0) != 0) out += line + "\n";
  return out;
}

std::string repo_config(const char* name) { return std::string(SHARDTRAIN_SOURCE_DIR) + "/configs/" + name; }

TEST(RunConfig, DefaultsAreTheTinyCpuRun) {
  const RunConfig c = load_run_config("", {});
  EXPECT_EQ(c.model_options.preset, "tiny");
  EXPECT_EQ(c.model.source, "tiny");
  EXPECT_EQ(c.model.hidden_size, 128);
  EXPECT_EQ(c.train.steps, 300);
  EXPECT_EQ(c.train.device, "cpu");
  EXPECT_EQ(c.data.source, "text");
}

TEST(RunConfig, RepoTinyConfigMatchesTheDefaults) {
  const RunConfig c = load_run_config(repo_config("tiny.toml"), {});
  const RunConfig d = load_run_config("", {});
  EXPECT_EQ(c.model_options.preset, "tiny");
  EXPECT_EQ(c.model.num_params(), d.model.num_params());
  EXPECT_EQ(c.data.source, "text");
  EXPECT_EQ(c.data.paths, std::vector<std::string>{"/usr/share/common-licenses"});
  EXPECT_EQ(c.train.steps, 300);
  EXPECT_EQ(c.train.seq_len, 128);
  EXPECT_EQ(c.train.micro_batch, 16);
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-3);
  EXPECT_EQ(c.optim.warmup_steps, 20);
  EXPECT_EQ(c.run.out_dir, "runs/tiny");
  // Everything but out_dir is the built-in default.
  RunConfig same = c;
  same.run.out_dir = d.run.out_dir;
  EXPECT_EQ(run_config_toml(same), run_config_toml(d));
}

TEST(RunConfig, RepoQwen15bConfig) {
  const RunConfig c = load_run_config(repo_config("qwen2.5-1.5b.toml"), {});
  EXPECT_EQ(c.model_options.preset, "qwen2.5-1.5b");
  EXPECT_EQ(c.model.num_params(), 1'543'714'304LL);
  EXPECT_EQ(c.data.source, "random");
  EXPECT_TRUE(c.data.paths.empty());
  EXPECT_EQ(c.train.seq_len, 2048);
  EXPECT_EQ(c.train.micro_batch, 4);
  EXPECT_EQ(c.train.device, "cuda");
  EXPECT_EQ(c.train.steps, 20);
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-4);
  EXPECT_EQ(c.optim.warmup_steps, 5);
  EXPECT_EQ(c.run.out_dir, "runs/qwen2.5-1.5b");
}

TEST(RunConfig, TomlValuesAndIntegerForFloat) {
  const std::string path = write_toml("values", R"(
[train]
steps = 7
seed = 42
[optim]
lr = 1e-4
weight_decay = 0     # an integer where a float is expected is fine
[data]
source = "random"
paths = []
[dist]
reshard_after_forward = false
)");
  const RunConfig c = load_run_config(path, {});
  EXPECT_FALSE(c.dist.reshard_after_forward);
  EXPECT_TRUE(load_run_config(path, {{"dist.reshard_after_forward", "true"}}).dist.reshard_after_forward);
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_EQ(c.train.seed, 42u);
  EXPECT_DOUBLE_EQ(c.optim.lr, 1e-4);
  EXPECT_DOUBLE_EQ(c.optim.weight_decay, 0.0);
  EXPECT_TRUE(c.data.paths.empty());
}

TEST(RunConfig, UnknownKeyListsTheSectionsKeys) {
  const std::string path = write_toml("unknown", "[train]\nsteps = 3\nstepz = 4\n");
  const std::string msg = error_of([&] { load_run_config(path, {}); });
  EXPECT_HAS(msg, path + ": unknown key 'train.stepz'");
  EXPECT_HAS(msg, "line 3");
  EXPECT_HAS(msg, "known keys in [train]: steps, seq_len, micro_batch");
}

TEST(RunConfig, UnknownSectionAndTopLevelKey) {
  std::string msg = error_of([&] { load_run_config(write_toml("sec", "[trian]\nsteps = 3\n"), {}); });
  EXPECT_HAS(msg, "unknown section [trian]");
  EXPECT_HAS(msg, "[model], [train], [optim], [data], [dist], [fabric], [run]");
  msg = error_of([&] { load_run_config(write_toml("top", "steps = 3\n"), {}); });
  EXPECT_HAS(msg, "unknown key 'steps'");
  EXPECT_HAS(msg, "keys belong in a section");
  msg = error_of([&] { load_run_config(write_toml("not_table", "train = 3\n"), {}); });
  EXPECT_HAS(msg, "'train' must be the section [train], got an integer (line 1)");
  msg = error_of([&] { load_run_config(write_toml("nested", "[train.extra]\nx = 1\n"), {}); });
  EXPECT_HAS(msg, "unknown key 'train.extra'");
}

TEST(RunConfig, WrongTomlTypes) {
  struct Case {
    const char* toml;
    const char* expect;
  };
  const Case cases[] = {
      {"[train]\nsteps = \"300\"\n", "key 'train.steps' must be an integer, got a string"},
      {"[train]\nsteps = 3.5\n", "key 'train.steps' must be an integer, got a floating-point number"},
      {"[train]\nsteps = 5000000000\n", "train.steps"},
      {"[train]\nseed = -1\n", "key 'train.seed' must be a non-negative integer"},
      {"[optim]\nlr = \"fast\"\n", "key 'optim.lr' must be a number, got a string"},
      {"[train]\ndevice = 1\n", "key 'train.device' must be one of cpu, cuda, got an integer"},
      {"[data]\npaths = \"a.txt\"\n", "key 'data.paths' must be an array of strings, got a string"},
      {"[data]\npaths = [\"a\", 2]\n", "key 'data.paths' must be an array of strings, got an array holding an integer"},
      {"[model]\npreset = true\n", "key 'model.preset' must be a string, got a boolean"},
      {"[dist]\nreshard_after_forward = \"no\"\n",
       "key 'dist.reshard_after_forward' must be true or false, got a string"},
      {"[dist]\nreshard_after_forward = 0\n",
       "key 'dist.reshard_after_forward' must be true or false, got an integer"},
  };
  for (const Case& c : cases) {
    const std::string path = write_toml("types", c.toml);
    const std::string msg = error_of([&] { load_run_config(path, {}); });
    EXPECT_HAS(msg, path + ": ");
    EXPECT_HAS(msg, c.expect);
    EXPECT_HAS(msg, "(line 2)");
  }
}

TEST(RunConfig, TomlSyntaxErrorGivesFileLineAndColumn) {
  const std::string path = write_toml("syntax", "[train]\nsteps = 3\nlr = = 4\n");
  const std::string msg = error_of([&] { load_run_config(path, {}); });
  EXPECT_HAS(msg, path + ":3:");
  EXPECT_HAS(msg, "TOML syntax error");
}

TEST(RunConfig, MissingFile) {
  const std::string msg = error_of([] { load_run_config("/nonexistent/run.toml", {}); });
  EXPECT_HAS(msg, "/nonexistent/run.toml: cannot open");
}

TEST(RunConfig, CommandLineWinsOverFileInOrder) {
  const std::string path = write_toml("precedence", "[train]\nsteps = 50\nseq_len = 64\n[optim]\nlr = 1e-3\n");
  const RunConfig c = load_run_config(
      path, {{"train.steps", "9"}, {"optim.lr", "2e-4"}, {"train.steps", "11"}, {"data.paths", "a.txt,b"}});
  EXPECT_EQ(c.train.steps, 11);  // the last of two wins
  EXPECT_EQ(c.train.seq_len, 64);
  EXPECT_DOUBLE_EQ(c.optim.lr, 2e-4);
  EXPECT_EQ(c.data.paths, (std::vector<std::string>{"a.txt", "b"}));
}

TEST(RunConfig, BadCommandLineValues) {
  struct Case {
    const char* key;
    const char* value;
    const char* expect;
  };
  const Case cases[] = {
      {"train.steps", "abc", "command line: --train.steps expects an integer, got 'abc'"},
      {"train.steps", "12x", "--train.steps expects an integer, got '12x'"},
      {"train.steps", "", "--train.steps expects an integer, got ''"},
      {"train.micro_batch", "99999999999", "--train.micro_batch expects an integer"},
      {"train.seed", "-3", "--train.seed expects a non-negative integer, got '-3'"},
      {"optim.lr", "fast", "--optim.lr expects a number, got 'fast'"},
      {"dist.reshard_after_forward", "yes", "--dist.reshard_after_forward expects true or false, got 'yes'"},
      {"train.device", "gpu", "command line: --train.device must be one of cpu, cuda, got 'gpu'"},
      {"train.stepz", "3", "command line: unknown key 'train.stepz' (did you mean --train.steps? known keys in [train]: steps"},
      {"trian.steps", "3", "command line: unknown key 'trian.steps' (did you mean --train.steps? known sections: [model]"},
  };
  for (const Case& c : cases) EXPECT_HAS(error_of([&] { load_run_config("", {{c.key, c.value}}); }), c.expect);
}

TEST(RunConfig, RangeChecksNameKeyAndSource) {
  struct Case {
    const char* key;
    const char* value;
    const char* expect;
  };
  const Case cases[] = {
      {"train.steps", "0", "--train.steps must be >= 1, got 0"},
      {"train.seq_len", "0", "--train.seq_len must be >= 1"},
      {"train.seq_len", "2048", "--train.seq_len (2048) exceeds max_position_embeddings (1024) of model tiny"},
      {"train.micro_batch", "0", "--train.micro_batch must be >= 1"},
      {"train.grad_accum", "-1", "--train.grad_accum must be >= 1"},
      {"train.log_every", "0", "--train.log_every must be >= 1"},
      {"optim.lr", "0", "--optim.lr must be in (0, 1], got 0"},
      {"optim.lr", "nan", "--optim.lr must be a finite number, got nan"},
      {"optim.min_lr_ratio", "1.5", "--optim.min_lr_ratio must be in [0, 1], got 1.5"},
      {"optim.warmup_steps", "-1", "--optim.warmup_steps must be >= 0"},
      {"optim.beta1", "1", "--optim.beta1 must be in [0, 1), got 1"},
      {"optim.beta2", "-0.1", "--optim.beta2 must be in [0, 1)"},
      {"optim.eps", "0", "--optim.eps must be in (0, 1], got 0"},
      {"optim.weight_decay", "-0.1", "--optim.weight_decay must be in [0, 1], got -0.1"},
      {"optim.grad_clip", "-1", "--optim.grad_clip must be >= 0"},
      {"data.source", "files", "--data.source must be one of random, text, tokens, got 'files'"},
      {"data.paths", "", "--data.paths must list at least one"},
      {"run.progress", "maybe", "--run.progress must be one of auto, on, off"},
      {"run.out_dir", "", "--run.out_dir must not be empty"},
      {"model.layers", "-2", "--model.layers must be >= 0"},
      {"model.preset", "qwen9", "--model.preset: unknown model preset 'qwen9' (known presets: tiny"},
  };
  for (const Case& c : cases) {
    const std::string msg = error_of([&] { load_run_config("", {{c.key, c.value}}); });
    EXPECT_HAS(msg, "command line: ");
    EXPECT_HAS(msg, c.expect);
  }
  // From a file, the message names the file and the line.
  const std::string path = write_toml("range", "[train]\nsteps = 1\n\n[optim]\nbeta2 = 1.0\n");
  const std::string msg = error_of([&] { load_run_config(path, {}); });
  EXPECT_HAS(msg, path + ": optim.beta2 must be in [0, 1), got 1 (line 5)");
}

// dist.reduce_dtype: fp32 (the default) or bf16, from a file or the command line;
// anything else is a configuration error (exit 2) naming the key and the choices.
TEST(RunConfig, ReduceDtypeIsFp32OrBf16) {
  EXPECT_EQ(load_run_config("", {}).dist.reduce_dtype, "fp32");
  EXPECT_EQ(load_run_config("", {{"dist.reduce_dtype", "bf16"}}).dist.reduce_dtype, "bf16");
  CLI::App app("test");
  ConfigOverrides out;
  add_config_options(app, out);
  const char* argv[] = {"prog", "--dist.reduce_dtype=bf16"};
  app.parse(static_cast<int>(std::size(argv)), argv);
  EXPECT_EQ(load_run_config("", out).dist.reduce_dtype, "bf16");
  EXPECT_HAS(app.help(), "--dist.reduce_dtype fp32|bf16=fp32");
  EXPECT_HAS(run_config_toml(load_run_config("", out)), "reduce_dtype = \"bf16\"");
  for (const char* bad : {"f32", "fp16", "BF16", ""}) {
    const std::string msg = error_of([&] { load_run_config("", {{"dist.reduce_dtype", bad}}); });
    EXPECT_HAS(msg, std::string("command line: --dist.reduce_dtype must be one of fp32, bf16, got '") + bad + "'");
    EXPECT_EQ(kind_of([&] { load_run_config("", {{"dist.reduce_dtype", bad}}); }), ErrorKind::Usage) << bad;
  }
  const std::string path = write_toml("reduce_dtype", "[dist]\nreduce_dtype = \"fp16\"\n");
  EXPECT_HAS(error_of([&] { load_run_config(path, {}); }),
             path + ": dist.reduce_dtype must be one of fp32, bf16, got 'fp16' (line 2)");
}

TEST(RunConfig, FloatKeysMustBeFiniteAndWithinSensibleBounds) {
  struct Case {
    const char* key;
    const char* value;
    const char* expect;
  };
  const Case cases[] = {
      {"optim.lr", "inf", "--optim.lr must be a finite number, got inf"},
      {"optim.lr", "-inf", "--optim.lr must be a finite number, got -inf"},
      {"optim.lr", "1e30", "--optim.lr must be in (0, 1], got 1e+30"},
      {"optim.eps", "inf", "--optim.eps must be a finite number"},
      {"optim.eps", "2", "--optim.eps must be in (0, 1], got 2"},
      {"optim.weight_decay", "1e30", "--optim.weight_decay must be in [0, 1], got 1e+30"},
      {"optim.grad_clip", "inf", "--optim.grad_clip must be a finite number"},
      {"optim.min_lr_ratio", "nan", "--optim.min_lr_ratio must be a finite number, got nan"},
      {"train.peak_tflops", "inf", "--train.peak_tflops must be a finite number"},
      {"dist.timeout_s", "1e30", "--dist.timeout_s must be in (0, 604800], got 1e+30"},
      {"run.term_grace_s", "inf", "--run.term_grace_s must be a finite number"},
      {"run.term_grace_s", "1e9", "--run.term_grace_s must be in (0, 86400]"},
  };
  for (const Case& c : cases) {
    const std::string msg = error_of([&] { load_run_config("", {{c.key, c.value}}); });
    EXPECT_HAS(msg, "command line: ");
    EXPECT_HAS(msg, c.expect);
    EXPECT_EQ(kind_of([&] { load_run_config("", {{c.key, c.value}}); }), ErrorKind::Usage) << c.key;
  }
  // TOML spells them too.
  for (const char* v : {"inf", "nan", "-inf", "+inf"}) {
    const std::string path = write_toml("nonfinite", std::string("[optim]\nlr = ") + v + "\n");
    const std::string msg = error_of([&] { load_run_config(path, {}); });
    EXPECT_HAS(msg, path + ": optim.lr must be a finite number, got ");
    EXPECT_HAS(msg, "(line 2)");
  }
}

TEST(RunConfig, TokensPerMicroBatchOverflowNamesBothKeys) {
  // micro_batch x seq_len is the token count of a micro-batch, a 32-bit int in the ops.
  const ConfigOverrides o = {{"train.micro_batch", "1000000000"}};
  const std::string msg = error_of([&] { load_run_config("", o); });
  EXPECT_HAS(msg, "command line: --train.micro_batch (1000000000) x train.seq_len (128)");
  EXPECT_HAS(msg, "2147483647");
  EXPECT_EQ(kind_of([&] { load_run_config("", o); }), ErrorKind::Usage);
  // The same from a file names it.
  const std::string path = write_toml("tokens", "[train]\nmicro_batch = 3000000\nseq_len = 1024\n");
  EXPECT_HAS(error_of([&] { load_run_config(path, {}); }), path + ": train.micro_batch (3000000) x train.seq_len (1024)");
  // Named where it was set.
  EXPECT_HAS(error_of([&] { load_run_config("", {{"train.seq_len", "2147483647"}}); }),
             "command line: --train.seq_len (2147483647) x train.micro_batch (16)");
  EXPECT_NO_THROW(load_run_config("", {{"train.micro_batch", "16777215"}}));  // (2^24 - 1) x 128 < 2^31
  EXPECT_ANY_THROW(load_run_config("", {{"train.micro_batch", "16777216"}}));  // 2^24 x 128 = 2^31
}

TEST(RunConfig, UnknownKeysSuggestTheNearestKnownOne) {
  const std::string path = write_toml("suggest", "[train]\nstepz = 4\n");
  EXPECT_HAS(error_of([&] { load_run_config(path, {}); }), "unknown key 'train.stepz' at line 2 (did you mean 'train.steps'?");
  EXPECT_HAS(error_of([&] { load_run_config("", {{"train.stepz", "3"}}); }),
             "command line: unknown key 'train.stepz' (did you mean --train.steps?");
  EXPECT_HAS(error_of([&] { load_run_config("", {{"trian.seq_len", "3"}}); }), "did you mean --train.seq_len?");
  EXPECT_HAS(error_of([&] { load_run_config("", {{"optim.learning_rate", "3"}}); }), "known keys in [optim]: lr");
  EXPECT_EQ(error_of([&] { load_run_config("", {{"optim.learning_rate", "3"}}); }).find("did you mean"),
            std::string::npos);  // nothing near enough
  EXPECT_EQ(kind_of([&] { load_run_config(path, {}); }), ErrorKind::Usage);
}

TEST(RunConfig, PathsNeedNotExistButMustBeGivenForText) {
  EXPECT_NO_THROW(load_run_config("", {{"data.paths", "/no/such/file"}}));
  EXPECT_NO_THROW(load_run_config("", {{"data.source", "random"}, {"data.paths", ""}}));
}

TEST(RunConfig, ModelOverridesApplyAfterThePreset) {
  const RunConfig c = load_run_config("", {{"model.preset", "qwen2.5-0.5b"}, {"model.layers", "2"},
                                           {"model.vocab_size", "1000"}, {"train.seq_len", "64"}});
  EXPECT_EQ(c.model.num_layers, 2);
  EXPECT_EQ(c.model.vocab_size, 1000);
  EXPECT_EQ(c.model.hidden_size, 896);  // kept from the preset
  EXPECT_HAS(c.model.source, "qwen2.5-0.5b with model.layers=2 (command line), model.vocab_size=1000");
}

TEST(RunConfig, BadModelOverrideNamesWhereTheValuesCameFrom) {
  const std::string path = write_toml("model_override", "[model]\nheads = 3\n");
  const std::string msg = error_of([&] { load_run_config(path, {{"model.hidden_size", "100"}}); });
  EXPECT_HAS(msg, "model.heads=3 (" + path + ")");
  EXPECT_HAS(msg, "model.hidden_size=100 (command line)");
  EXPECT_HAS(msg, "hidden_size (100) is not divisible by num_attention_heads (3)");
}

TEST(RunConfig, ModelConfigJsonWinsOverPreset) {
  const fs::path dir = temp_dir("hf");
  ModelConfig m = model_preset("tiny");
  m.num_layers = 2;
  m.max_position_embeddings = 256;
  std::ofstream(dir / "config.json") << hf_config_json(m).dump(2);
  const std::string path = write_toml("hf_toml", "[model]\npreset = \"qwen2.5-7b\"\nconfig = \"" + dir.string() + "\"\n");
  const RunConfig c = load_run_config(path, {});
  EXPECT_EQ(c.model.num_layers, 2);
  EXPECT_EQ(c.model.hidden_size, 128);
  EXPECT_EQ(c.model.source, (dir / "config.json").string());
  // seq_len is checked against the config.json's max_position_embeddings.
  const std::string msg = error_of([&] { load_run_config(path, {{"train.seq_len", "512"}}); });
  EXPECT_HAS(msg, "exceeds max_position_embeddings (256)");
  // A config.json error says which key named the file.
  const std::string bad = error_of([&] { load_run_config("", {{"model.config", "/no/such/dir"}}); });
  EXPECT_HAS(bad, "command line: --model.config = '/no/such/dir'");
  EXPECT_HAS(bad, "/no/such/dir: cannot open");
}

TEST(RunConfig, TomlRoundTrip) {
  const fs::path dir = temp_dir("rt_hf");
  std::ofstream(dir / "config.json") << hf_config_json(model_preset("tiny")).dump();
  const RunConfig a = load_run_config(
      repo_config("qwen2.5-1.5b.toml"),
      {{"model.config", dir.string()}, {"model.layers", "3"}, {"train.seed", "9223372036854775807"},
       {"optim.lr", "0.000123456789"}, {"optim.grad_clip", "0"}, {"data.source", "text"},
       {"data.paths", "a \"quoted\" path,b\\c"}, {"run.out_dir", "runs/x y"}, {"train.seq_len", "1024"}});
  const std::string text = run_config_toml(a);
  const std::string path = write_toml("rt", text);
  const RunConfig b = load_run_config(path, {});
  EXPECT_EQ(without_comments(run_config_toml(b)), without_comments(text));
  EXPECT_EQ(b.model_options.config, dir.string());
  EXPECT_EQ(b.model.num_layers, 3);
  EXPECT_EQ(b.train.seed, 9223372036854775807ull);
  EXPECT_EQ(b.optim.lr, 0.000123456789);  // exact: shortest round-trip formatting
  EXPECT_EQ(b.optim.grad_clip, 0.0);
  EXPECT_EQ(b.data.paths, (std::vector<std::string>{"a \"quoted\" path", "b\\c"}));
  EXPECT_EQ(b.run.out_dir, "runs/x y");
  EXPECT_EQ(b.model.num_params(), a.model.num_params());
  // The defaults round-trip too.
  const RunConfig d = load_run_config("", {});
  EXPECT_EQ(run_config_toml(load_run_config(write_toml("rt_default", run_config_toml(d)), {})), run_config_toml(d));
}

TEST(ConfigOptions, CliRegistersDottedOptionsAndKeepsOrder) {
  CLI::App app("test");
  ConfigOverrides out;
  add_config_options(app, out);
  const char* argv[] = {"prog", "--train.steps=5", "--optim.lr", "1e-4", "--train.steps", "7", "--data.paths=a,b"};
  app.parse(static_cast<int>(std::size(argv)), argv);
  const ConfigOverrides want = {{"train.steps", "5"}, {"optim.lr", "1e-4"}, {"train.steps", "7"}, {"data.paths", "a,b"}};
  EXPECT_EQ(out, want);
  const RunConfig c = load_run_config("", out);
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_DOUBLE_EQ(c.optim.lr, 1e-4);
}

TEST(ConfigOptions, HelpShowsEveryKeyWithHelpAndDefault) {
  CLI::App app("test");
  ConfigOverrides out;
  add_config_options(app, out);
  const std::string help = app.help();
  EXPECT_HAS(help, "--train.steps INT=300");
  EXPECT_HAS(help, "optimizer steps");
  EXPECT_HAS(help, "--train.device cpu|cuda=cpu");
  EXPECT_HAS(help, "--data.paths LIST=/usr/share/common-licenses");
  EXPECT_HAS(help, "--optim.lr FLOAT=0.003");
  EXPECT_HAS(help, "--model.kv_heads");
  EXPECT_HAS(help, "Run configuration [optim]");
}

TEST(ConfigOptions, AnEmptyValueIsEmptyAndDoesNotTakeTheNextOption) {
  CLI::App app("test");
  ConfigOverrides out;
  add_config_options(app, out);
  const char* argv[] = {"prog", "--run.out_dir=", "--train.steps=1", "--run.export_dir=", "--train.log_every", "2"};
  app.parse(static_cast<int>(std::size(argv)), argv);
  const ConfigOverrides want = {{"run.out_dir", ""}, {"train.steps", "1"}, {"run.export_dir", ""}, {"train.log_every", "2"}};
  EXPECT_EQ(out, want);
  EXPECT_HAS(error_of([&] { load_run_config("", out); }), "command line: --run.out_dir must not be empty");
  // An option without any value, last or before another option, is empty too.
  for (const std::vector<const char*>& args :
       {std::vector<const char*>{"prog", "--train.steps"}, std::vector<const char*>{"prog", "--train.steps", "--train.seq_len=8"}}) {
    CLI::App a("test");
    ConfigOverrides o;
    add_config_options(a, o);
    a.parse(static_cast<int>(args.size()), args.data());
    ASSERT_FALSE(o.empty());
    EXPECT_EQ(o[0], (std::pair<std::string, std::string>{"train.steps", ""}));
    EXPECT_HAS(error_of([&] { load_run_config("", o); }), "--train.steps expects an integer, got ''");
  }
  // Negative numbers are values, not options.
  CLI::App b("test");
  ConfigOverrides o;
  add_config_options(b, o);
  const char* neg[] = {"prog", "--data.ignore_index", "-7"};
  b.parse(static_cast<int>(std::size(neg)), neg);
  EXPECT_EQ(o, (ConfigOverrides{{"data.ignore_index", "-7"}}));
}

TEST(ConfigOptions, CliValuesAreCheckedWhenLoaded) {
  CLI::App app("test");
  ConfigOverrides out;
  add_config_options(app, out);
  const char* argv[] = {"prog", "--train.steps", "abc"};
  app.parse(static_cast<int>(std::size(argv)), argv);
  EXPECT_HAS(error_of([&] { load_run_config("", out); }), "command line: --train.steps expects an integer, got 'abc'");
}

}  // namespace
}  // namespace st

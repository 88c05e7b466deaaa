// Presets, parameter counts, config.json in and out, and validation messages.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "config/model_config.h"
#include "support/errors.h"
#include "support/temp_dir.h"

namespace st {
namespace {

namespace fs = std::filesystem;

using testing::expect_error;
using testing::temp_dir;

fs::path write_json(const fs::path& dir, const nlohmann::json& j) {
  fs::path p = dir / "config.json";
  std::ofstream(p) << j.dump(2);
  return p;
}

// The config.json of Qwen/Qwen2.5-1.5B as published on the Hugging Face hub.
nlohmann::json qwen25_1p5b_json() {
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 1536,
    "initializer_range": 0.02,
    "intermediate_size": 8960,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 12,
    "num_hidden_layers": 28,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": true,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.1",
    "use_cache": true,
    "use_sliding_window": false,
    "vocab_size": 151936
  })");
}

TEST(ModelPreset, NamesAndDimensions) {
  EXPECT_EQ(model_preset_names(),
            (std::vector<std::string>{"tiny", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b",
                                      "qwen2.5-14b"}));
  for (const std::string& n : model_preset_names()) {
    const ModelConfig c = model_preset(n);
    EXPECT_EQ(c.source, n);
    EXPECT_NO_THROW(validate_model_config(c)) << n;
    EXPECT_DOUBLE_EQ(c.rms_norm_eps, n == "qwen2.5-14b" ? 1e-5 : 1e-6) << n;
  }
  const ModelConfig q = model_preset("qwen2.5-1.5b");
  EXPECT_EQ(q.hidden_size, 1536);
  EXPECT_EQ(q.intermediate_size, 8960);
  EXPECT_EQ(q.num_layers, 28);
  EXPECT_EQ(q.num_heads, 12);
  EXPECT_EQ(q.num_kv_heads, 2);
  EXPECT_EQ(q.head_dim(), 128);
  EXPECT_EQ(q.max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(q.rope_theta, 1e6);
  EXPECT_TRUE(q.tie_word_embeddings);

  const ModelConfig big = model_preset("qwen2.5-7b");
  EXPECT_EQ(big.vocab_size, 152064);
  EXPECT_EQ(big.max_position_embeddings, 131072);
  EXPECT_FALSE(big.tie_word_embeddings);

  // Qwen2.5-14B's config.json: hidden 5120, intermediate 13824, 48 layers, 40 heads,
  // 8 kv heads, vocab 152064, untied, 131072 positions, rms_norm_eps 1e-5, theta 1e6.
  const ModelConfig q14 = model_preset("qwen2.5-14b");
  EXPECT_EQ(q14.hidden_size, 5120);
  EXPECT_EQ(q14.intermediate_size, 13824);
  EXPECT_EQ(q14.num_layers, 48);
  EXPECT_EQ(q14.num_heads, 40);
  EXPECT_EQ(q14.num_kv_heads, 8);
  EXPECT_EQ(q14.head_dim(), 128);
  EXPECT_EQ(q14.vocab_size, 152064);
  EXPECT_EQ(q14.max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(q14.rope_theta, 1e6);
  EXPECT_FALSE(q14.tie_word_embeddings);

  const ModelConfig tiny = model_preset("tiny");
  EXPECT_EQ(tiny.vocab_size, 256);
  EXPECT_EQ(tiny.max_position_embeddings, 1024);
  EXPECT_DOUBLE_EQ(tiny.rope_theta, 10000);
}

TEST(ModelPreset, NumParamsMatchesPublishedCounts) {
  EXPECT_EQ(model_preset("qwen2.5-0.5b").num_params(), 494'032'768LL);
  EXPECT_EQ(model_preset("qwen2.5-1.5b").num_params(), 1'543'714'304LL);
  EXPECT_EQ(model_preset("qwen2.5-3b").num_params(), 3'085'938'688LL);
  EXPECT_EQ(model_preset("qwen2.5-7b").num_params(), 7'615'616'512LL);
  EXPECT_EQ(model_preset("qwen2.5-14b").num_params(), 14'770'033'664LL);
  // tiny by hand: embed 256*128; per layer q 128*128+128, k,v 2*(128*64+64), o 128*128,
  // mlp 3*128*384, norms 2*128; final norm 128.
  const long long layer = (128 * 128 + 128) + 2 * (128 * 64 + 64) + 128 * 128 + 3 * 128 * 384 + 2 * 128;
  EXPECT_EQ(model_preset("tiny").num_params(), 256 * 128 + 4 * layer + 128);
  EXPECT_EQ(model_preset("tiny").num_params(), 821'376LL);
}

TEST(ModelPreset, UntyingAddsTheOutputProjection) {
  ModelConfig c = model_preset("qwen2.5-1.5b");
  const long long tied = c.num_params();
  c.tie_word_embeddings = false;
  EXPECT_EQ(c.num_params() - tied, 151936LL * 1536);
}

TEST(ModelPreset, UnknownNameListsKnownOnes) {
  expect_error([] { model_preset("qwen3"); }, {"qwen3", "tiny", "qwen2.5-0.5b", "qwen2.5-7b"});
}

TEST(HfConfig, ReadsPublishedQwen25ConfigFromFileAndDirectory) {
  const fs::path dir = temp_dir("published");
  const fs::path file = write_json(dir, qwen25_1p5b_json());
  for (const std::string& path : {file.string(), dir.string()}) {
    const ModelConfig c = load_hf_config(path);
    EXPECT_EQ(c.source, file.string());
    EXPECT_EQ(c.vocab_size, 151936);
    EXPECT_EQ(c.hidden_size, 1536);
    EXPECT_EQ(c.intermediate_size, 8960);
    EXPECT_EQ(c.num_layers, 28);
    EXPECT_EQ(c.num_heads, 12);
    EXPECT_EQ(c.num_kv_heads, 2);
    EXPECT_EQ(c.max_position_embeddings, 131072);
    EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
    EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
    EXPECT_TRUE(c.tie_word_embeddings);
    EXPECT_EQ(c.num_params(), 1'543'714'304LL);
  }
}

TEST(HfConfig, DefaultsFollowTransformersQwen2Config) {
  nlohmann::json j = {{"vocab_size", 1000}, {"hidden_size", 64}, {"intermediate_size", 128},
                      {"num_hidden_layers", 2}, {"num_attention_heads", 4}};
  const ModelConfig c = load_hf_config(write_json(temp_dir("defaults"), j).string());
  EXPECT_EQ(c.num_kv_heads, 4);  // absent: as many KV heads as query heads
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000);
  EXPECT_FALSE(c.tie_word_embeddings);
}

TEST(HfConfig, WrittenConfigReadsBackTheSame) {
  for (const std::string& n : model_preset_names()) {
    const ModelConfig want = model_preset(n);
    const nlohmann::json j = hf_config_json(want);
    EXPECT_EQ(j["architectures"], nlohmann::json::array({"Qwen2ForCausalLM"}));
    EXPECT_EQ(j["model_type"], "qwen2");
    EXPECT_EQ(j["hidden_act"], "silu");
    EXPECT_EQ(j["torch_dtype"], "bfloat16");
    EXPECT_EQ(j["use_sliding_window"], false);
    const ModelConfig got = load_hf_config(write_json(temp_dir("roundtrip_" + n), j).string());
    EXPECT_EQ(got.vocab_size, want.vocab_size) << n;
    EXPECT_EQ(got.hidden_size, want.hidden_size) << n;
    EXPECT_EQ(got.intermediate_size, want.intermediate_size) << n;
    EXPECT_EQ(got.num_layers, want.num_layers) << n;
    EXPECT_EQ(got.num_heads, want.num_heads) << n;
    EXPECT_EQ(got.num_kv_heads, want.num_kv_heads) << n;
    EXPECT_EQ(got.max_position_embeddings, want.max_position_embeddings) << n;
    EXPECT_DOUBLE_EQ(got.rms_norm_eps, want.rms_norm_eps) << n;
    EXPECT_DOUBLE_EQ(got.rope_theta, want.rope_theta) << n;
    EXPECT_EQ(got.tie_word_embeddings, want.tie_word_embeddings) << n;
  }
}

// Each rejected config.json: the edit to the published config, and what the error names.
TEST(HfConfig, ErrorsNameTheFileAndTheKey) {
  struct Case {
    const char* name;
    std::function<void(nlohmann::json&)> edit;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"missing", [](auto& j) { j.erase("hidden_size"); }, {"missing required key 'hidden_size'"}},
      {"wrong_type", [](auto& j) { j["num_hidden_layers"] = "28"; }, {"num_hidden_layers", "integer", "string"}},
      {"float_int", [](auto& j) { j["vocab_size"] = 151936.5; }, {"vocab_size", "integer"}},
      {"bad_eps_type", [](auto& j) { j["rms_norm_eps"] = "small"; }, {"rms_norm_eps", "number"}},
      {"bad_tie_type", [](auto& j) { j["tie_word_embeddings"] = 1; }, {"tie_word_embeddings", "boolean"}},
      {"model_type", [](auto& j) { j["model_type"] = "llama"; }, {"model_type", "llama", "qwen2"}},
      {"hidden_act", [](auto& j) { j["hidden_act"] = "gelu"; }, {"hidden_act", "gelu", "silu"}},
      {"head_dim", [](auto& j) { j["head_dim"] = 64; }, {"head_dim", "64", "128", "supported"}},
      {"sliding", [](auto& j) { j["use_sliding_window"] = true; }, {"use_sliding_window", "not supported"}},
      {"rope_scaling", [](auto& j) { j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}}; },
       {"rope_scaling", "yarn", "supported"}},
      {"rope_parameters", [](auto& j) { j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}}; },
       {"rope_parameters", "linear", "supported"}},
      {"divisible", [](auto& j) { j["num_attention_heads"] = 7; }, {"hidden_size (1536)", "num_attention_heads (7)"}},
  };
  for (const Case& c : cases) {
    nlohmann::json j = qwen25_1p5b_json();
    c.edit(j);
    const fs::path file = write_json(temp_dir(std::string("err_") + c.name), j);
    SCOPED_TRACE(c.name);
    std::vector<std::string> parts = c.expect;
    parts.push_back(file.string());
    expect_error([&] { load_hf_config(file.string()); }, parts);
  }
}

TEST(HfConfig, MatchingHeadDimAndNullRopeScalingAreAccepted) {
  nlohmann::json j = qwen25_1p5b_json();
  j["head_dim"] = 128;
  j["rope_scaling"] = nullptr;
  EXPECT_EQ(load_hf_config(write_json(temp_dir("ok_head_dim"), j).string()).head_dim(), 128);
}

TEST(HfConfig, Transformers5RopeParametersGiveTheta) {
  nlohmann::json j = qwen25_1p5b_json();
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  EXPECT_DOUBLE_EQ(load_hf_config(write_json(temp_dir("rope_parameters"), j).string()).rope_theta, 500000.0);
}

TEST(HfConfig, MissingFileAndBadJsonNameTheFile) {
  const fs::path dir = temp_dir("missing");
  expect_error([&] { load_hf_config(dir.string()); }, {(dir / "config.json").string(), "cannot open"});
  const fs::path bad = dir / "bad.json";
  std::ofstream(bad) << "{ \"hidden_size\": ";
  expect_error([&] { load_hf_config(bad.string()); }, {bad.string(), "invalid JSON"});
}

TEST(ValidateModelConfig, EachCheckNamesTheSourceAndTheKey) {
  struct Case {
    std::function<void(ModelConfig&)> edit;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {[](auto& c) { c.vocab_size = 0; }, {"vocab_size", "positive"}},
      {[](auto& c) { c.hidden_size = -1; }, {"hidden_size", "positive"}},
      {[](auto& c) { c.intermediate_size = 0; }, {"intermediate_size"}},
      {[](auto& c) { c.num_layers = 0; }, {"num_hidden_layers"}},
      {[](auto& c) { c.num_heads = 0; }, {"num_attention_heads"}},
      {[](auto& c) { c.num_kv_heads = 0; }, {"num_key_value_heads"}},
      {[](auto& c) { c.max_position_embeddings = 0; }, {"max_position_embeddings"}},
      {[](auto& c) { c.hidden_size = 100, c.num_heads = 3; },
       {"hidden_size (100) is not divisible by num_attention_heads (3)"}},
      {[](auto& c) { c.num_kv_heads = 3; }, {"num_attention_heads (4) is not divisible by num_key_value_heads (3)"}},
      {[](auto& c) { c.hidden_size = 132; }, {"head_dim", "33", "even"}},
      {[](auto& c) { c.rms_norm_eps = 0; }, {"rms_norm_eps"}},
      {[](auto& c) { c.rope_theta = -1; }, {"rope_theta"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    ModelConfig c = model_preset("tiny");
    c.source = "my/config.json";
    cases[i].edit(c);
    SCOPED_TRACE(i);
    std::vector<std::string> parts = cases[i].expect;
    parts.push_back("my/config.json: ");
    expect_error([&] { validate_model_config(c); }, parts);
  }
}

}  // namespace
}  // namespace st

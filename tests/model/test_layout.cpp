#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "config/model_config.h"
#include "model/layout.h"

namespace st {
namespace {

ModelConfig small(bool tied) {
  ModelConfig c;
  c.source = "test";
  c.vocab_size = 50;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = tied;
  return c;
}

TEST(Layout, UnitsTileWithoutGaps) {
  for (bool tied : {true, false}) {
    ParamLayout lay(small(tied));
    ASSERT_EQ(lay.num_units(), 3 + 2);
    EXPECT_EQ(lay.total_numel(), static_cast<size_t>(small(tied).num_params()));
    size_t largest = 0;
    for (const Unit& u : lay.units()) {
      size_t off = 0;
      for (const ParamSpec& p : u.params) {
        EXPECT_EQ(p.offset, off) << p.name;
        off += p.numel;
      }
      EXPECT_EQ(off, u.numel);
      largest = std::max(largest, u.numel);
    }
    EXPECT_EQ(lay.largest_unit_numel(), largest);
  }
}

TEST(Layout, BlockOffsetsAreTheNamedTensors) {
  ParamLayout lay(small(false));
  const BlockOffsets& o = lay.block();
  for (int l = 0; l < 3; ++l) {
    const Unit& b = lay.unit(lay.layer_unit(l));
    const std::string p = "model.layers." + std::to_string(l) + ".";
    EXPECT_EQ(o.ln1, b.param(p + "input_layernorm.weight").offset);
    EXPECT_EQ(o.qkv_w, b.param(p + "self_attn.q_proj.weight").offset);
    EXPECT_EQ(o.qkv_b, b.param(p + "self_attn.q_proj.bias").offset);
    EXPECT_EQ(o.o_w, b.param(p + "self_attn.o_proj.weight").offset);
    EXPECT_EQ(o.ln2, b.param(p + "post_attention_layernorm.weight").offset);
    EXPECT_EQ(o.gate_up_w, b.param(p + "mlp.gate_proj.weight").offset);
    EXPECT_EQ(o.down_w, b.param(p + "mlp.down_proj.weight").offset);
  }
  EXPECT_EQ(lay.lm_head_offset(), lay.unit(lay.final_unit()).param("lm_head.weight").offset);
}

TEST(Layout, FusedWeightsAreContiguous) {
  ParamLayout lay(small(true));
  const Unit& b = lay.unit(lay.layer_unit(1));
  const BlockOffsets& o = lay.block();
  const int C = 16, hd = 4, QKV = (4 + 2 * 2) * hd;
  EXPECT_EQ(b.param("model.layers.1.self_attn.q_proj.weight").offset, o.qkv_w);
  EXPECT_EQ(b.param("model.layers.1.self_attn.v_proj.weight").offset + 2 * hd * C, o.qkv_w + QKV * C);
  EXPECT_EQ(b.param("model.layers.1.self_attn.q_proj.bias").offset, o.qkv_b);
  EXPECT_EQ(b.param("model.layers.1.mlp.up_proj.weight").offset, o.gate_up_w + 24 * C);
  EXPECT_FALSE(b.param("model.layers.1.input_layernorm.weight").decay);
  EXPECT_FALSE(b.param("model.layers.1.self_attn.k_proj.bias").decay);
  EXPECT_TRUE(b.param("model.layers.1.mlp.down_proj.weight").decay);
}

TEST(Layout, FindsTensorsByHuggingFaceName) {
  ParamLayout untied(small(false));
  int u = -1;
  const ParamSpec* p = nullptr;
  ASSERT_TRUE(untied.find("lm_head.weight", &u, &p));
  EXPECT_EQ(u, untied.final_unit());
  EXPECT_EQ(p->offset, untied.lm_head_offset());
  EXPECT_EQ(untied.lm_head_unit(), untied.final_unit());
  ParamLayout tied(small(true));
  EXPECT_FALSE(tied.find("lm_head.weight", &u, &p));
  EXPECT_EQ(tied.lm_head_unit(), tied.embed_unit());
  ASSERT_TRUE(tied.find("model.layers.2.mlp.down_proj.weight", &u, &p));
  EXPECT_EQ(u, tied.layer_unit(2));
  EXPECT_EQ(p->shape, (std::vector<int64_t>{16, 24}));
}

}  // namespace
}  // namespace st

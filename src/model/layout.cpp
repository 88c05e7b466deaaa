#include "model/layout.h"

#include <algorithm>

#include "core/error.h"

namespace st {

const ParamSpec& Unit::param(const std::string& pname) const {
  for (const auto& p : params)
    if (p.name == pname) return p;
  fail("unit '", name, "' has no parameter '", pname, "'");
}

namespace {

void add(Unit& u, std::string name, std::vector<int64_t> shape) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.numel = 1;
  for (int64_t d : p.shape) p.numel *= static_cast<size_t>(d);
  p.offset = u.numel;
  p.decay = p.shape.size() == 2;
  u.numel += p.numel;
  u.params.push_back(std::move(p));
}

}  // namespace

ParamLayout::ParamLayout(const ModelConfig& cfg) : cfg_(cfg) {
  const int64_t C = cfg.hidden_size, F = cfg.intermediate_size, V = cfg.vocab_size;
  const int64_t hd = cfg.head_dim(), q = cfg.num_heads * hd, kv = cfg.num_kv_heads * hd;

  Unit embed{"embed"};
  add(embed, "model.embed_tokens.weight", {V, C});
  units_.push_back(std::move(embed));

  for (int l = 0; l < cfg.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Unit b{"layers." + std::to_string(l)};
    add(b, p + "input_layernorm.weight", {C});
    add(b, p + "self_attn.q_proj.weight", {q, C});
    add(b, p + "self_attn.k_proj.weight", {kv, C});
    add(b, p + "self_attn.v_proj.weight", {kv, C});
    add(b, p + "self_attn.q_proj.bias", {q});
    add(b, p + "self_attn.k_proj.bias", {kv});
    add(b, p + "self_attn.v_proj.bias", {kv});
    add(b, p + "self_attn.o_proj.weight", {C, q});
    add(b, p + "post_attention_layernorm.weight", {C});
    add(b, p + "mlp.gate_proj.weight", {F, C});
    add(b, p + "mlp.up_proj.weight", {F, C});
    add(b, p + "mlp.down_proj.weight", {C, F});
    if (l == 0) {
      // The fused ranges start at their first tensor; the order above keeps the rest
      // of each one right behind it.
      auto at = [&](const char* name) { return b.param(p + name).offset; };
      block_ = BlockOffsets{at("input_layernorm.weight"),          at("self_attn.q_proj.weight"),
                            at("self_attn.q_proj.bias"),           at("self_attn.o_proj.weight"),
                            at("post_attention_layernorm.weight"), at("mlp.gate_proj.weight"),
                            at("mlp.down_proj.weight")};
    }
    units_.push_back(std::move(b));
  }

  Unit fin{"final"};
  add(fin, "model.norm.weight", {C});
  if (!cfg.tie_word_embeddings) add(fin, "lm_head.weight", {V, C});
  units_.push_back(std::move(fin));
}

size_t ParamLayout::lm_head_offset() const {
  return cfg_.tie_word_embeddings ? 0 : units_.back().param("lm_head.weight").offset;
}

size_t ParamLayout::largest_unit_numel() const {
  size_t n = 0;
  for (const auto& u : units_) n = std::max(n, u.numel);
  return n;
}

bool ParamLayout::find(const std::string& name, int* unit, const ParamSpec** spec) const {
  for (int u = 0; u < num_units(); ++u)
    for (const auto& p : units_[u].params)
      if (p.name == name) {
        *unit = u;
        *spec = &p;
        return true;
      }
  return false;
}

size_t ParamLayout::total_numel() const {
  size_t n = 0;
  for (const auto& u : units_) n += u.numel;
  return n;
}

}  // namespace st

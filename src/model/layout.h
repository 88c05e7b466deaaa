// The Qwen2 parameter layout: which tensors exist, their shapes, and where each
// lives inside its unit's flat buffer. Units are the embedding, each decoder block,
// and the final norm (+ lm_head when untied). The layout knows nothing of ranks:
// how a unit is padded and split across them is src/fsdp/shard_plan.h's business.
// A buffer handed to the model may be longer than the unit (padding); only
// [0, numel) is read.
//
// Inside a block the order is chosen so that fused GEMMs read one contiguous
// weight: q,k,v weights back to back ((H+2KV)*hd, C), then q,k,v biases, and
// gate,up weights back to back (2F, C).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/model_config.h"

namespace st {

struct ParamSpec {
  std::string name;            // Hugging Face tensor name
  std::vector<int64_t> shape;
  size_t offset = 0;           // elements from the start of the unit buffer
  size_t numel = 0;
  bool decay = false;          // weight decay applies (2-D weights; not norms or biases)
};

struct Unit {
  std::string name;            // "embed", "layers.3", "final"
  std::vector<ParamSpec> params;
  size_t numel = 0;            // sum of params

  const ParamSpec& param(const std::string& name) const;
};

// Offsets of one block's tensors within its unit (see the order above), looked up by
// name; C hidden, hd head dim, H heads, KV kv heads, F intermediate.
struct BlockOffsets {
  size_t ln1;        // (C)                input_layernorm.weight
  size_t qkv_w;      // ((H+2KV)*hd, C)    q_proj, k_proj, v_proj weights back to back
  size_t qkv_b;      // ((H+2KV)*hd)       q_proj, k_proj, v_proj biases back to back
  size_t o_w;        // (C, H*hd)          o_proj.weight
  size_t ln2;        // (C)                post_attention_layernorm.weight
  size_t gate_up_w;  // (2F, C)            gate_proj, up_proj weights back to back
  size_t down_w;     // (C, F)             down_proj.weight
};

class ParamLayout {
 public:
  explicit ParamLayout(const ModelConfig& cfg);

  const ModelConfig& config() const { return cfg_; }
  const std::vector<Unit>& units() const { return units_; }
  const Unit& unit(int u) const { return units_.at(u); }
  int num_units() const { return static_cast<int>(units_.size()); }

  int embed_unit() const { return 0; }
  int layer_unit(int layer) const { return 1 + layer; }
  int final_unit() const { return 1 + cfg_.num_layers; }
  // The unit holding lm_head's weight: the embedding when tied.
  int lm_head_unit() const { return cfg_.tie_word_embeddings ? embed_unit() : final_unit(); }

  const BlockOffsets& block() const { return block_; }  // same for every layer
  size_t embed_offset() const { return 0; }
  size_t final_norm_offset() const { return 0; }
  size_t lm_head_offset() const;  // within lm_head_unit()

  // Finds a tensor by its Hugging Face name; returns false if there is none.
  bool find(const std::string& name, int* unit, const ParamSpec** spec) const;
  size_t total_numel() const;     // tied embedding once
  size_t largest_unit_numel() const;

 private:
  ModelConfig cfg_;
  std::vector<Unit> units_;
  BlockOffsets block_{};
};

}  // namespace st

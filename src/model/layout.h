// The Qwen2 parameter layout: which tensors exist, their shapes, and where each
// lives inside its FSDP unit's flat buffer. Units are the embedding, each decoder
// block, and the final norm (+ lm_head when untied). A unit's buffer is padded to a
// multiple of the world size so that rank r owns the contiguous slice
// [r * shard, (r + 1) * shard): a checkpoint saved at N ranks reshards to M by
// offset arithmetic alone.
//
// Inside a block the order is chosen so that fused GEMMs read one contiguous
// weight: q,k,v weights back to back ((H+2KV)*hd, C), then q,k,v biases, and
// gate,up weights back to back (2F, C).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

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
  size_t padded_numel = 0;     // numel rounded up to a multiple of world
  size_t shard_numel = 0;      // padded_numel / world

  const ParamSpec& param(const std::string& name) const;
};

// Offsets of one block's tensors within its unit (see the order above).
struct BlockOffsets {
  size_t ln1, qkv_w, qkv_b, o_w, ln2, gate_up_w, down_w;
};

class ParamLayout {
 public:
  ParamLayout(const ModelConfig& cfg, int world);

  const ModelConfig& config() const { return cfg_; }
  int world() const { return world_; }
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
  size_t total_numel() const;     // unpadded, tied embedding once

 private:
  ModelConfig cfg_;
  int world_;
  std::vector<Unit> units_;
  BlockOffsets block_{};
};

}  // namespace st

// Qwen2 weights in Hugging Face form: a directory with config.json and safetensors
// (model.safetensors, or shards with model.safetensors.index.json), tensor names as
// transformers' Qwen2ForCausalLM has them. The layout already uses those names, so
// mapping is by name; this module adds validation and dtype conversion.
#pragma once
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/layout.h"

namespace st {

// Every unit's values (unpadded, f32) read from `dir`. Missing, unexpected and
// wrongly shaped tensors are reported together in one st::Error that lists them all.
// A tied model may carry lm_head.weight only if it equals the embedding.
std::vector<std::vector<float>> load_hf_weights(const std::string& dir, const ParamLayout& layout);

struct ExportOptions {
  DType dtype = DType::BF16;                      // BF16 or F32
  uint64_t max_shard_bytes = 5ull << 30;          // larger models are split, with an index
  bool overwrite = false;                         // replace a model already in `dir`
  // A Hugging Face config.json (or the directory holding it) the model came from: its
  // keys are kept, those the export writes replaced ("" = none).
  std::string config_from;
};

// Throws unless `dir` can take an export: absent, empty, or (with overwrite) holding
// a model. Call before long work so that nothing is lost at the end.
void check_export_dir(const std::string& dir, bool overwrite);

// The dtype an export dtype name means (export_dtypes(), config/options.h: "bf16", "f32").
DType parse_export_dtype(const std::string& name);

// Writes config.json and the safetensors file(s) that Qwen2ForCausalLM.from_pretrained
// reads. Each file is written to a temporary name and renamed into place.
void export_hf_model(const std::string& dir, const ParamLayout& layout,
                     const std::vector<std::vector<float>>& units, const ExportOptions& options);

}  // namespace st

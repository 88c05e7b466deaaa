#include "io/hf_checkpoint.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "io/safetensors.h"

namespace st {
namespace fs = std::filesystem;

namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Appends up to `limit` names of a problem list to the message.
void list(std::ostringstream& os, const char* what, const std::vector<std::string>& items) {
  if (items.empty()) return;
  constexpr size_t limit = 12;
  os << "\n  " << what << " (" << items.size() << "):";
  for (size_t i = 0; i < items.size() && i < limit; ++i) os << "\n    " << items[i];
  if (items.size() > limit) os << "\n    ... and " << items.size() - limit << " more";
}

bool is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F64; }

}  // namespace

static std::vector<std::vector<float>> load_hf_weights_unclassified(const std::string& dir, const ParamLayout& layout) {
  const SafetensorsSet set = SafetensorsSet::open(dir);
  std::vector<std::string> missing, unexpected, bad_shape, bad_dtype;
  std::set<std::string> known;
  for (const Unit& u : layout.units())
    for (const ParamSpec& p : u.params) {
      known.insert(p.name);
      const TensorInfo* t = set.find(p.name);
      if (!t) {
        missing.push_back(p.name + " " + shape_text(p.shape));
        continue;
      }
      if (t->shape != p.shape) bad_shape.push_back(p.name + ": expected " + shape_text(p.shape) + ", found " + shape_text(t->shape));
      if (!is_float(t->dtype)) bad_dtype.push_back(p.name + ": " + safetensors_dtype_name(t->dtype));
    }
  const bool tied = layout.config().tie_word_embeddings;
  for (const std::string& name : set.names()) {
    if (known.count(name)) continue;
    // transformers may save a tied lm_head; accept it when it is the embedding.
    if (tied && name == "lm_head.weight" && set.find("model.embed_tokens.weight")) {
      const TensorInfo* a = set.find(name);
      const TensorInfo* b = set.find("model.embed_tokens.weight");
      if (a->shape == b->shape && a->dtype == b->dtype && std::memcmp(set.data(name), set.data("model.embed_tokens.weight"), a->nbytes()) == 0)
        continue;
      unexpected.push_back(name + " (the config ties embeddings, but it differs from model.embed_tokens.weight)");
      continue;
    }
    unexpected.push_back(name);
  }
  if (!missing.empty() || !unexpected.empty() || !bad_shape.empty() || !bad_dtype.empty()) {
    std::ostringstream os;
    os << set.source() << ": the checkpoint does not match the model (" << layout.config().source << ")";
    list(os, "missing tensors", missing);
    list(os, "unexpected tensors", unexpected);
    list(os, "wrong shapes", bad_shape);
    list(os, "not floating point", bad_dtype);
    throw Error(os.str());
  }

  std::vector<std::vector<float>> units;
  for (const Unit& u : layout.units()) {
    std::vector<float> v(u.numel);
    for (const ParamSpec& p : u.params) {
      const std::vector<float> t = set.read_f32(p.name);
      // A NaN or infinity would only show up later as a NaN loss.
      for (size_t i = 0; i < t.size(); ++i)
        if (!std::isfinite(t[i]))
          fail_data(set.source(), ": tensor '", p.name, "' holds ", t[i], " at element ", i,
                    "; every weight must be a finite number");
      std::copy(t.begin(), t.end(), v.begin() + static_cast<std::ptrdiff_t>(p.offset));
    }
    units.push_back(std::move(v));
  }
  return units;
}

std::vector<std::vector<float>> load_hf_weights(const std::string& dir, const ParamLayout& layout) {
  // A checkpoint that cannot be read or does not match the model is a data error (exit 3).
  return classify_errors(ErrorKind::Data, [&] { return load_hf_weights_unclassified(dir, layout); });
}

DType parse_export_dtype(const std::string& name) {
  if (name == "bf16") return DType::BF16;
  if (name == "f32") return DType::F32;
  fail("export dtype must be bf16 or f32, got '", name, "'");
}

void check_export_dir(const std::string& dir, bool overwrite) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    // It will be made next to it: the nearest existing ancestor must take a new entry.
    fs::path p = fs::absolute(dir, ec).parent_path();
    while (!p.empty() && !fs::exists(p, ec) && p != p.parent_path()) p = p.parent_path();
    ST_CHECK_CONFIG(fs::is_directory(p, ec), "export: cannot create '", dir, "': '", p.string(), "' is not a directory");
    ST_CHECK_CONFIG(::access(p.c_str(), W_OK | X_OK) == 0, "export: cannot create '", dir, "': '", p.string(),
             "' is not writable");
    return;
  }
  ST_CHECK_CONFIG(fs::is_directory(dir, ec), "export: '", dir, "' exists and is not a directory");
  if (fs::is_empty(dir, ec)) return;
  ST_CHECK_CONFIG(overwrite, "export: '", dir, "' is not empty; choose another directory or pass --force to replace the model in it");
}

namespace {

// The config.json an export starts from: its keys are kept (token ids, generation
// settings, ...). A file that is not a JSON object is a data error naming it.
nlohmann::json source_config(const std::string& path) {
  std::error_code ec;
  const std::string file = fs::is_directory(path, ec) ? (fs::path(path) / "config.json").string() : path;
  std::ifstream in(file);
  ST_CHECK_DATA(in, file, ": cannot open the config.json whose keys the export keeps");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail_data(file, ": invalid JSON: ", e.what());
  }
  ST_CHECK_DATA(j.is_object(), file, ": expected a JSON object at the top level");
  return j;
}

// The files of an export, written into `dir` as they are (no staging); config.json is
// `cfg` (the source's keys, or none) with the model's keys over it.
void write_model_files(const std::string& dir, const ParamLayout& layout,
                       const std::vector<std::vector<float>>& units, const ExportOptions& options,
                       nlohmann::json cfg) {
  std::error_code ec;

  // Convert each tensor into its own buffer in the export dtype.
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorToWrite> tensors;
  for (int u = 0; u < layout.num_units(); ++u) {
    const Unit& unit = layout.unit(u);
    ST_CHECK(units[u].size() == unit.numel, "export: unit '", unit.name, "' has ", units[u].size(),
             " values, expected ", unit.numel);
    for (const ParamSpec& p : unit.params) {
      const float* src = units[u].data() + p.offset;
      std::vector<uint8_t> bytes(p.numel * dtype_size(options.dtype));
      if (options.dtype == DType::F32) {
        std::memcpy(bytes.data(), src, bytes.size());
      } else {
        auto* dst = reinterpret_cast<uint16_t*>(bytes.data());
        for (size_t i = 0; i < p.numel; ++i) dst[i] = f32_to_bf16(src[i]);
      }
      storage.push_back(std::move(bytes));
      tensors.push_back({p.name, options.dtype, p.shape, storage.back().data()});
    }
  }
  write_safetensors_sharded(dir, tensors, options.max_shard_bytes, {{"format", "pt"}});

  const ModelConfig& mc = layout.config();
  const nlohmann::json ours = hf_config_json(mc);
  for (const auto& [key, value] : ours.items()) cfg[key] = value;
  const char* dtype = options.dtype == DType::BF16 ? "bfloat16" : "float32";
  cfg["torch_dtype"] = dtype;
  // Kept keys that restate what may have changed follow the model written.
  if (cfg.contains("dtype")) cfg["dtype"] = dtype;  // transformers 5's name for torch_dtype
  if (cfg.contains("head_dim")) cfg["head_dim"] = mc.head_dim();
  if (cfg.contains("layer_types")) cfg["layer_types"] = std::vector<std::string>(mc.num_layers, "full_attention");
  const std::string path = dir + "/config.json", tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    ST_CHECK(out, "export: cannot write '", tmp, "'");
    out << cfg.dump(2) << "\n";
    ST_CHECK(out.flush(), "export: writing '", tmp, "' failed");
  }
  fs::rename(tmp, path, ec);
  ST_CHECK(!ec, "export: cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

}  // namespace

void export_hf_model(const std::string& dir, const ParamLayout& layout,
                     const std::vector<std::vector<float>>& units, const ExportOptions& options) {
  // Read (and refused when bad) before anything is written.
  const nlohmann::json source =
      options.config_from.empty() ? nlohmann::json::object() : source_config(options.config_from);
  ST_CHECK(options.dtype == DType::BF16 || options.dtype == DType::F32, "export: dtype must be bf16 or f32, got ",
           dtype_name(options.dtype));
  ST_CHECK(units.size() == static_cast<size_t>(layout.num_units()), "export: expected ", layout.num_units(),
           " units of weights, got ", units.size());
  check_export_dir(dir, options.overwrite);
  // The whole model goes into a new directory beside `dir`, which then takes its
  // place: a reader sees the old model or the new one, and no file of the old one
  // (a shard the new one does not have) survives.
  replace_directory(dir, "export",
                    [&](const std::string& stage) { write_model_files(stage, layout, units, options, source); });
}

}  // namespace st

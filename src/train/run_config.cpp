// The run configuration. One schema table below lists every key once; the TOML
// reader, the command-line options, the range checks and the TOML writer all walk it,
// so a new key is one line here plus its field in RunConfig.
#include "train/run_config.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <toml++/toml.h>
#include <variant>

#include "backend/factory.h"
#include "core/error.h"
#include "core/utf8.h"
#include "io/hf_checkpoint.h"
#include "model/qwen2.h"
#include "train/metrics.h"
#include "train/toml_text.h"

namespace st {

namespace {

constexpr const char* kCommandLine = "command line";
constexpr double kInf = std::numeric_limits<double>::infinity();

// Where a RunConfig field got its value; errors start with `where`.
struct Origin {
  std::string where = "default";
  long line = 0;  // TOML line, 0 where there is none
};

// ---- the schema -----------------------------------------------------------------

// A key's value inside its section: `&member<&RunConfig::train, &TrainOptions::steps>`
// reaches cfg.train.steps. The variant's index is the value type (see expected_text).
template <class T>
using Ref = T& (*)(RunConfig&);
using Field = std::variant<Ref<int>, Ref<uint64_t>, Ref<double>, Ref<std::string>, Ref<std::vector<std::string>>,
                           Ref<bool>>;

template <auto Section, auto Member>
auto& member(RunConfig& cfg) {
  return (cfg.*Section).*Member;
}

template <auto Section, auto Member>
Field field() {
  using T = std::remove_reference_t<decltype(member<Section, Member>(std::declval<RunConfig&>()))>;
  return Field{static_cast<Ref<T>>(&member<Section, Member>)};
}

// A numeric interval. contains() is written so that NaN is never inside.
struct Range {
  double lo = -kInf, hi = kInf;
  bool lo_open = false, hi_open = false;
  bool contains(double v) const {
    return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
};
Range at_least(double lo) { return {lo, kInf, false, false}; }
Range below(double hi) { return {-kInf, hi, false, true}; }
Range closed(double lo, double hi) { return {lo, hi, false, false}; }
Range left_open(double lo, double hi) { return {lo, hi, true, false}; }
Range half_open(double lo, double hi) { return {lo, hi, false, true}; }

struct Key {
  std::string name;  // "section.key": the TOML key and the --section.key option
  Field field;
  std::string help;
  std::optional<Range> range = {};
  std::vector<std::string> choices = {};  // non-empty: a string that must be one of these
};

const std::vector<Key>& schema() {
  static const std::vector<Key> keys = [] {
    std::string presets;
    for (const std::string& n : model_preset_names()) presets += (presets.empty() ? "" : ", ") + n;
    const char* keep = "; 0 keeps the preset's / config.json's value";
    return std::vector<Key>{
        {"model.preset", field<&RunConfig::model_options, &ModelOptions::preset>(), "built-in model: " + presets},
        {"model.config", field<&RunConfig::model_options, &ModelOptions::config>(),
         "Hugging Face config.json (file or directory); when set it wins over model.preset"},
        {"model.init_from", field<&RunConfig::model_options, &ModelOptions::init_from>(),
         "Hugging Face model directory (config.json + safetensors) whose weights start the run; its "
         "config.json gives the model unless model.config is set"},
        {"model.layers", field<&RunConfig::model_options, &ModelOptions::layers>(), std::string("number of layers") + keep, at_least(0)},
        {"model.hidden_size", field<&RunConfig::model_options, &ModelOptions::hidden_size>(), std::string("hidden size") + keep, at_least(0)},
        {"model.intermediate_size", field<&RunConfig::model_options, &ModelOptions::intermediate_size>(),
         std::string("MLP intermediate size") + keep, at_least(0)},
        {"model.heads", field<&RunConfig::model_options, &ModelOptions::heads>(), std::string("attention heads") + keep, at_least(0)},
        {"model.kv_heads", field<&RunConfig::model_options, &ModelOptions::kv_heads>(), std::string("key/value heads") + keep, at_least(0)},
        {"model.vocab_size", field<&RunConfig::model_options, &ModelOptions::vocab_size>(), std::string("vocabulary size") + keep, at_least(0)},

        {"train.steps", field<&RunConfig::train, &TrainOptions::steps>(), "optimizer steps", at_least(1)},
        {"train.seq_len", field<&RunConfig::train, &TrainOptions::seq_len>(), "tokens per sequence (at most the model's max_position_embeddings)",
         at_least(1)},
        {"train.micro_batch", field<&RunConfig::train, &TrainOptions::micro_batch>(), "sequences per forward/backward pass", at_least(1)},
        {"train.grad_accum", field<&RunConfig::train, &TrainOptions::grad_accum>(), "micro-batches accumulated per optimizer step", at_least(1)},
        {"train.seed", field<&RunConfig::train, &TrainOptions::seed>(), "seed for initialisation and data order"},
        {"train.device", field<&RunConfig::train, &TrainOptions::device>(), "where to train", {}, backend_devices()},
        {"train.log_every", field<&RunConfig::train, &TrainOptions::log_every>(), "log loss and throughput every N steps", at_least(1)},
        {"train.recompute", field<&RunConfig::train, &TrainOptions::recompute>(),
         "activations recomputed in backward instead of kept (less memory, same results): none, norm (the RMSNorm "
         "outputs), swiglu (its output), ffn (norm 2, gate|up, SwiGLU), attn (norm 1, qkv, attention), block "
         "(all but each layer's input)",
         {}, recompute_choices()},
        {"train.peak_tflops", field<&RunConfig::train, &TrainOptions::peak_tflops>(),
         "dense bf16 TFLOP/s that MFU is measured against; 0 = the datasheet value for the GPU "
         "(H100/H200 989, A100 312, L4 121)",
         closed(0, 1e6)},

        {"optim.lr", field<&RunConfig::optim, &OptimOptions::lr>(), "peak learning rate (AdamW)", left_open(0, 1)},
        {"optim.min_lr_ratio", field<&RunConfig::optim, &OptimOptions::min_lr_ratio>(), "cosine decay ends at lr * min_lr_ratio", closed(0, 1)},
        {"optim.warmup_steps", field<&RunConfig::optim, &OptimOptions::warmup_steps>(), "linear warmup steps", at_least(0)},
        {"optim.beta1", field<&RunConfig::optim, &OptimOptions::beta1>(), "AdamW beta1", half_open(0, 1)},
        {"optim.beta2", field<&RunConfig::optim, &OptimOptions::beta2>(), "AdamW beta2", half_open(0, 1)},
        {"optim.eps", field<&RunConfig::optim, &OptimOptions::eps>(), "AdamW epsilon", left_open(0, 1)},
        {"optim.weight_decay", field<&RunConfig::optim, &OptimOptions::weight_decay>(), "decoupled weight decay", closed(0, 1)},
        {"optim.grad_clip", field<&RunConfig::optim, &OptimOptions::grad_clip>(), "clip the global gradient norm to this; 0 disables",
         at_least(0)},

        {"data.source", field<&RunConfig::data, &DataOptions::source>(), "random tokens, byte-level text from data.paths, or token shards from data.paths (shardtrain data prepare)", {},
         data_sources()},
        {"data.paths", field<&RunConfig::data, &DataOptions::paths>(),
         "text: files or directories; tokens: prepared directories (comma-separated on the command line)"},
        // Negative so that it can never collide with a token id.
        {"data.ignore_index", field<&RunConfig::data, &DataOptions::ignore_index>(), "target id that the loss skips", below(0)},

        {"dist.shard_group_size", field<&RunConfig::dist, &DistOptions::shard_group_size>(),
         "ranks that shard the model together; 0 = all ranks (FSDP), G = shard within groups of G ranks and "
         "replicate across groups (HSDP; world size must be a multiple of G)",
         at_least(0)},
        {"dist.reshard_after_forward", field<&RunConfig::dist, &DistOptions::reshard_after_forward>(),
         "free each unit's gathered weights after its forward and all-gather them again for backward "
         "(less memory); false keeps them from forward to backward (one all-gather per unit fewer)"},
        {"dist.timeout_s", field<&RunConfig::dist, &DistOptions::timeout_s>(),
         "seconds any rendezvous or collective may wait before the run fails naming the missing ranks",
         left_open(0, 604800)},

        {"fabric.transport", field<&RunConfig::fabric, &FabricOptions::transport>(),
         "network NCCL must use between nodes: efa (AWS OFI plugin on EFA), ib, socket, or auto (NCCL's "
         "choice); forced ones make NCCL fail instead of falling back to sockets. Variables already in the "
         "environment win",
         {}, fabric_transports()},
        {"fabric.socket_ifname", field<&RunConfig::fabric, &FabricOptions::socket_ifname>(),
         "NCCL_SOCKET_IFNAME (interfaces for bootstrap and the socket transport); empty = NCCL's choice"},
        {"fabric.expect_transport", field<&RunConfig::fabric, &FabricOptions::expect_transport>(),
         "refuse to train unless NCCL's log shows this transport: efa | ib | socket (inter-node paths), "
         "nvlink | shm (intra-node paths); empty = report only",
         {}, fabric_expect_transports()},
        {"fabric.log_dir", field<&RunConfig::fabric, &FabricOptions::log_dir>(),
         "directory for NCCL's INFO logs (one per rank); empty = <run.out_dir>/nccl"},

        {"run.out_dir", field<&RunConfig::run, &RunOptions::out_dir>(), "directory for logs, config and checkpoints"},
        {"run.progress", field<&RunConfig::run, &RunOptions::progress>(), "progress bar (auto: only on a terminal)", {},
         progress_modes()},
        {"run.export_dir", field<&RunConfig::run, &RunOptions::export_dir>(),
         "after training, write the model here in Hugging Face format (config.json + model.safetensors)"},
        {"run.export_dtype", field<&RunConfig::run, &RunOptions::export_dtype>(), "dtype of exported weights", {}, export_dtypes()},
        {"run.checkpoint_every", field<&RunConfig::run, &RunOptions::checkpoint_every>(),
         "save a sharded checkpoint every N steps and after the last; 0 = never", at_least(0)},
        {"run.checkpoint_dir", field<&RunConfig::run, &RunOptions::checkpoint_dir>(),
         "where checkpoints go (step-N directories and `latest`); empty = <run.out_dir>/checkpoints"},
        {"run.keep_last", field<&RunConfig::run, &RunOptions::keep_last>(),
         "complete checkpoints to keep (older ones are deleted); 0 keeps all", at_least(0)},
        {"run.resume", field<&RunConfig::run, &RunOptions::resume>(),
         "auto: continue from the newest complete checkpoint in run.checkpoint_dir if there is one; none: start "
         "afresh; or a step-N checkpoint directory (at any world size)"},
        {"run.term_grace_s", field<&RunConfig::run, &RunOptions::term_grace_s>(),
         "seconds a stop by SIGTERM/SIGINT may take to save its checkpoint (the pod's terminationGracePeriodSeconds "
         "should be larger); past it the run exits without the save, the last complete checkpoint stays",
         left_open(0, 86400)},
        {"run.profile", field<&RunConfig::run, &RunOptions::profile>(),
         "time every op over a window of steps (CUDA events on a GPU) and print a table; also <run.out_dir>/profile.json"},
        {"run.profile_warmup", field<&RunConfig::run, &RunOptions::profile_warmup>(),
         "steps run before the profile window opens", at_least(0)},
        {"run.profile_steps", field<&RunConfig::run, &RunOptions::profile_steps>(), "steps in the profile window",
         at_least(1)},
        {"run.tensorboard", field<&RunConfig::run, &RunOptions::tensorboard>(),
         "write TensorBoard events (loss, lr, grad norm, tokens/s, TFLOP/s, MFU, memory per step) to "
         "<run.out_dir>/tb (rank 0)"},
    };
  }();
  return keys;
}

std::string section_of(const std::string& name) { return name.substr(0, name.find('.')); }

const Key* find_key(const std::string& name) {
  for (const Key& k : schema())
    if (k.name == name) return &k;
  return nullptr;
}

std::vector<std::string> sections() {
  std::vector<std::string> out;
  for (const Key& k : schema())
    if (out.empty() || out.back() != section_of(k.name)) out.push_back(section_of(k.name));
  return out;
}

std::string known_sections() {
  std::string s;
  for (const std::string& sec : sections()) s += (s.empty() ? "[" : ", [") + sec + "]";
  return s;
}

std::string known_keys_in(const std::string& section) {
  std::string s;
  for (const Key& k : schema())
    if (section_of(k.name) == section) s += (s.empty() ? "" : ", ") + k.name.substr(section.size() + 1);
  return s;
}

// Levenshtein distance: single-character insertions, deletions and substitutions.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The candidate nearest to `name` when it is near enough to be a typo of it (at most
// two edits, or a quarter of the name); empty otherwise.
std::string nearest(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates)
    if (const size_t d = edit_distance(name, c); d < best_d) best = c, best_d = d;
  return best_d <= std::max<size_t>(2, name.size() / 4) ? best : std::string();
}

std::vector<std::string> key_names() {
  std::vector<std::string> names;
  for (const Key& k : schema()) names.push_back(k.name);
  return names;
}

// The error for a key the schema does not know: the nearest known key when there is
// one ("did you mean"), and the keys the section does know. From the command line the
// key is spelled as the option (--train.steps).
[[noreturn]] void fail_unknown(const std::string& where, const std::string& name, const std::string& at) {
  const std::string sec = section_of(name);
  const bool cli = where == kCommandLine;
  const std::string near = nearest(name, key_names());
  const std::string hint = near.empty() ? "" : cli ? "did you mean --" + near + "? " : "did you mean '" + near + "'? ";
  if (name.find('.') == std::string::npos)
    fail_config(where, ": unknown key '", name, "'", at, " (", hint, "keys belong in a section: ", known_sections(), ")");
  if (known_keys_in(sec).empty())
    fail_config(where, ": unknown key '", name, "'", at, " (", hint, "known sections: ", known_sections(), ")");
  fail_config(where, ": unknown key '", name, "'", at, " (", hint, "known keys in [", sec, "]: ", known_keys_in(sec), ")");
}

// ---- values: text, TOML, and the type rules shared by both -------------------------

std::string format_double(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest text that reads back exactly
  return std::string(buf, r.ptr);
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

// "an integer", "one of cpu, cuda", ... as used in "must be ..." / "expects ...".
std::string expected_text(const Key& k) {
  if (!k.choices.empty()) return "one of " + join(k.choices, ", ");
  switch (k.field.index()) {
    case 0: return "an integer";
    case 1: return "a non-negative integer";
    case 2: return "a number";
    case 3: return "a string";
    case 4: return "an array of strings";
    default: return "true or false";
  }
}

// Integer range checks that belong to the type (32-bit fields; a seed TOML can hold).
bool fits_field(const Field& f, long long v) {
  if (f.index() == 0) return v >= INT_MIN && v <= INT_MAX;
  if (f.index() == 1) return v >= 0;
  return true;
}

// Stores TOML value `v` into the field of `k`; errors name the file, the key and the line.
void set_from_toml(RunConfig& cfg, const Key& k, const toml::node& v, const std::string& file) {
  auto wrong_type = [&](const std::string& got) {
    fail_config(file, ": key '", k.name, "' must be ", expected_text(k), ", got ", got, toml_line_text(v));
  };
  std::visit(
      [&](auto get) {
        using T = std::remove_reference_t<decltype(get(cfg))>;
        if constexpr (std::is_same_v<T, int> || std::is_same_v<T, uint64_t>) {
          if (!v.is_integer()) wrong_type(toml_type_name(v));
          const long long x = v.as_integer()->get();
          if (!fits_field(k.field, x))
            wrong_type(std::to_string(x) + (x < 0 ? "" : ", which does not fit in 32 bits"));
          get(cfg) = static_cast<T>(x);
        } else if constexpr (std::is_same_v<T, double>) {
          // An integer is a fine number: `weight_decay = 0` should not need a ".0".
          if (!v.is_floating_point() && !v.is_integer()) wrong_type(toml_type_name(v));
          get(cfg) = v.is_integer() ? static_cast<double>(v.as_integer()->get())
                                       : v.as_floating_point()->get();
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (!v.is_string()) wrong_type(toml_type_name(v));
          get(cfg) = v.as_string()->get();
        } else if constexpr (std::is_same_v<T, bool>) {
          if (!v.is_boolean()) wrong_type(toml_type_name(v));
          get(cfg) = v.as_boolean()->get();
        } else {
          if (!v.is_array()) wrong_type(toml_type_name(v));
          T items;
          for (const toml::node& e : *v.as_array()) {
            if (!e.is_string()) wrong_type("an array holding " + toml_type_name(e));
            items.push_back(e.as_string()->get());
          }
          get(cfg) = std::move(items);
        }
      },
      k.field);
}

// Stores command-line text into the field of `k`, with the same type rules as TOML.
void set_from_text(RunConfig& cfg, const Key& k, const std::string& text) {
  auto bad = [&]() { fail_config(kCommandLine, ": --", k.name, " expects ", expected_text(k), ", got '", text, "'"); };
  // The resolved config is saved as TOML (run_config_toml), whose strings are UTF-8.
  if (utf8_replace_invalid(text) != text)
    fail_config(kCommandLine, ": --", k.name, " is not valid UTF-8 text: '", utf8_replace_invalid(text), "'");
  const char* b = text.data();
  const char* e = b + text.size();
  std::visit(
      [&](auto get) {
        using T = std::remove_reference_t<decltype(get(cfg))>;
        if constexpr (std::is_same_v<T, int> || std::is_same_v<T, uint64_t>) {
          long long x = 0;  // TOML integers are signed 64-bit; so are ours, to round-trip
          auto r = std::from_chars(b, e, x);
          if (text.empty() || r.ec != std::errc() || r.ptr != e || !fits_field(k.field, x)) bad();
          get(cfg) = static_cast<T>(x);
        } else if constexpr (std::is_same_v<T, double>) {
          double x = 0;
          auto r = std::from_chars(b, e, x);
          if (text.empty() || r.ec != std::errc() || r.ptr != e) bad();
          get(cfg) = x;
        } else if constexpr (std::is_same_v<T, std::string>) {
          get(cfg) = text;
        } else if constexpr (std::is_same_v<T, bool>) {
          if (text != "true" && text != "false") bad();  // as TOML spells them
          get(cfg) = text == "true";
        } else {
          T items;  // "a,b,c"; empty pieces are dropped, so "" is the empty list
          std::stringstream ss(text);
          for (std::string item; std::getline(ss, item, ',');)
            if (!item.empty()) items.push_back(item);
          get(cfg) = std::move(items);
        }
      },
      k.field);
}

// The value of `k` as TOML (for run_config_toml) or as plain text (for --help).
std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string value_text(const RunConfig& cfg, const Key& k, bool as_toml) {
  return std::visit(
      [&](auto get) -> std::string {
        const auto& v = get(const_cast<RunConfig&>(cfg));  // read only
        using T = std::remove_cvref_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int> || std::is_same_v<T, uint64_t>) {
          return std::to_string(v);
        } else if constexpr (std::is_same_v<T, double>) {
          std::string s = format_double(v);
          // TOML reads "1" as an integer; keep floats floats ("inf"/"nan" are TOML too).
          if (as_toml && s.find_first_of(".eEn") == std::string::npos) s += ".0";
          return s;
        } else if constexpr (std::is_same_v<T, std::string>) {
          return as_toml ? quote(v) : v;
        } else if constexpr (std::is_same_v<T, bool>) {
          return v ? "true" : "false";
        } else {
          if (!as_toml) return join(v, ",");
          std::vector<std::string> q;
          for (const std::string& s : v) q.push_back(quote(s));
          return "[" + join(q, ", ") + "]";
        }
      },
      k.field);
}

// The placeholder --help shows: INT, FLOAT, cpu|cuda, ...
std::string type_label(const Key& k) {
  if (!k.choices.empty()) return join(k.choices, "|");
  static const char* const names[] = {"INT", "UINT", "FLOAT", "TEXT", "LIST", "true|false"};
  return names[k.field.index()];
}

// ---- the layers: TOML file, then command line --------------------------------------

using Origins = std::map<std::string, Origin>;

void read_toml(const std::string& path, RunConfig& cfg, Origins& origins) {
  toml::table root = parse_toml_file(path, "run config");

  for (const auto& [sec_key, sec_node] : root) {
    const std::string sec(sec_key.str());
    const bool known = !known_keys_in(sec).empty();
    if (!known && !sec_node.is_table()) fail_unknown(path, sec, toml_at_line(sec_node));  // keys live in [sections]
    if (!known) {
      const std::string near = nearest(sec, sections());
      fail_config(path, ": unknown section [", sec, "]", toml_at_line(sec_node), " (",
                  near.empty() ? "" : "did you mean [" + near + "]? ", "known sections: ", known_sections(), ")");
    }
    if (!sec_node.is_table())
      fail_config(path, ": '", sec, "' must be the section [", sec, "], got ", toml_type_name(sec_node), toml_line_text(sec_node));
    for (const auto& [key, node] : *sec_node.as_table()) {
      const std::string name = sec + "." + std::string(key.str());
      const Key* k = find_key(name);
      if (!k) fail_unknown(path, name, toml_at_line(node));
      set_from_toml(cfg, *k, node, path);
      origins[name] = {path, static_cast<long>(node.source().begin.line)};
    }
  }
}

void apply_overrides(const ConfigOverrides& overrides, RunConfig& cfg, Origins& origins) {
  for (const auto& [raw_name, value] : overrides) {
    // Accept "--train.steps" as well as "train.steps".
    const std::string name = raw_name.rfind("--", 0) == 0 ? raw_name.substr(2) : raw_name;
    const Key* k = find_key(name);
    if (!k) fail_unknown(kCommandLine, name, "");
    set_from_text(cfg, *k, value);
    origins[name] = {kCommandLine, 0};
  }
}

// ---- checks and model resolution -----------------------------------------------------

// "configs/x.toml: train.steps<parts> (line 4)" or "command line: --train.steps<parts>".
// A configuration error (exit 2), or of `kind` (a model file the key names is corrupt).
template <class... Parts>
[[noreturn]] void fail_key_as(ErrorKind kind, const Origins& origins, const std::string& name, Parts&&... parts) {
  auto it = origins.find(name);
  const Origin o = it == origins.end() ? Origin{} : it->second;
  const std::string shown = o.where == kCommandLine ? "--" + name : name;
  fail_as(kind, o.where, ": ", shown, concat(std::forward<Parts>(parts)...),
          o.line ? " (line " + std::to_string(o.line) + ")" : "");
}
template <class... Parts>
[[noreturn]] void fail_key(const Origins& origins, const std::string& name, Parts&&... parts) {
  fail_key_as(ErrorKind::Usage, origins, name, std::forward<Parts>(parts)...);
}

std::string describe(const Range& r) {
  const bool has_lo = std::isfinite(r.lo), has_hi = std::isfinite(r.hi);
  if (has_lo && has_hi)
    return std::string("in ") + (r.lo_open ? "(" : "[") + format_double(r.lo) + ", " + format_double(r.hi) +
           (r.hi_open ? ")" : "]");
  if (has_lo) return (r.lo_open ? "> " : ">= ") + format_double(r.lo);
  return (r.hi_open ? "< " : "<= ") + format_double(r.hi);
}

void check_values(const RunConfig& cfg, const Origins& origins) {
  for (const Key& k : schema()) {
    // inf and nan read as numbers (TOML and from_chars spell them) but are no setting.
    if (const auto* get = std::get_if<Ref<double>>(&k.field); get && !std::isfinite((*get)(const_cast<RunConfig&>(cfg))))
      fail_key(origins, k.name, " must be a finite number, got ", value_text(cfg, k, false));
    if (k.range) {
      double v = 0;
      std::visit(
          [&](auto get) {
            const auto& x = get(const_cast<RunConfig&>(cfg));  // read only
            if constexpr (std::is_arithmetic_v<std::remove_cvref_t<decltype(x)>>) v = static_cast<double>(x);
          },
          k.field);
      if (!k.range->contains(v))
        fail_key(origins, k.name, " must be ", describe(*k.range), ", got ", value_text(cfg, k, false));
    }
    if (!k.choices.empty()) {
      const std::string v = value_text(cfg, k, false);
      if (std::find(k.choices.begin(), k.choices.end(), v) == k.choices.end())
        fail_key(origins, k.name, " must be ", expected_text(k), ", got '", v, "'");
    }
  }
  if (cfg.run.out_dir.empty()) fail_key(origins, "run.out_dir", " must not be empty");
  // Only non-empty here: whether the paths exist is the data loader's business.
  if (cfg.data.source == "text" && cfg.data.paths.empty())
    fail_key(origins, "data.paths", " must list at least one file or directory when data.source is 'text'");
}

std::string origin_text(const Origins& origins, const std::string& name) {
  auto it = origins.find(name);
  return it == origins.end() ? "default" : it->second.where;
}

// model.config (a config.json) wins over model.preset; then the model.* overrides.
// The source stays the preset name or config.json path (the trainer prints it) plus
// each override and where it came from, so validate_model_config's errors say both.
ModelConfig resolve_model(const RunConfig& cfg, const Origins& origins) {
  ModelConfig m;
  if (!cfg.model_options.config.empty() || !cfg.model_options.init_from.empty()) {
    const char* key = cfg.model_options.config.empty() ? "model.init_from" : "model.config";
    const std::string& path = cfg.model_options.config.empty() ? cfg.model_options.init_from : cfg.model_options.config;
    try {
      m = load_hf_config(path);
    } catch (const Error& e) {
      fail_key_as(e.kind() == ErrorKind::Runtime ? ErrorKind::Usage : e.kind(), origins, key, " = '", path, "': ",
                  e.what());
    }
  } else {
    try {
      m = model_preset(cfg.model_options.preset);
    } catch (const Error& e) {
      fail_key(origins, "model.preset", ": ", e.what());
    }
  }

  const struct {
    const char* key;
    int value;    // 0: not overridden
    int* target;
  } overrides[] = {
      {"model.layers", cfg.model_options.layers, &m.num_layers},
      {"model.hidden_size", cfg.model_options.hidden_size, &m.hidden_size},
      {"model.intermediate_size", cfg.model_options.intermediate_size, &m.intermediate_size},
      {"model.heads", cfg.model_options.heads, &m.num_heads},
      {"model.kv_heads", cfg.model_options.kv_heads, &m.num_kv_heads},
      {"model.vocab_size", cfg.model_options.vocab_size, &m.vocab_size},
  };
  std::vector<std::string> applied;
  for (const auto& o : overrides) {
    if (o.value == 0) continue;
    *o.target = o.value;
    applied.push_back(std::string(o.key) + "=" + std::to_string(o.value) + " (" + origin_text(origins, o.key) + ")");
  }
  if (!applied.empty()) m.source += " with " + join(applied, ", ");
  validate_model_config(m);
  return m;
}

}  // namespace

void add_config_options(CLI::App& app, ConfigOverrides& out) {
  const RunConfig defaults;
  for (const Key& k : schema()) {
    const std::string name = k.name;
    CLI::Option* opt = app.add_option_function<std::string>(
        "--" + name, [&out, name](const std::string& v) { out.emplace_back(name, v); }, k.help);
    // trigger_on_parse runs the callback as each option is met, so `out` keeps the
    // command-line order (CLI11 otherwise runs callbacks in registration order) and a
    // repeated option is recorded each time (the last one wins when applied).
    // expected(0, 1): "--run.out_dir=" (or "--run.out_dir" before another option) is
    // the empty value, never the next argument; CLI11 would otherwise take the next
    // argument as the value when the one after '=' is empty. With no default_str, an
    // absent value is "" (CLI11 fills in default_str there); --help shows the default
    // through option_text instead.
    opt->trigger_on_parse()
        ->expected(0, 1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
        ->type_name(type_label(k))
        ->option_text(type_label(k) + (value_text(defaults, k, false).empty() ? "" : "=" + value_text(defaults, k, false)))
        ->group("Run configuration [" + section_of(name) + "]");
  }
  // An unknown --section.key[=value] goes to load_run_config like any key, so it is
  // refused with the same message as in a TOML file (naming the nearest known key);
  // anything else not understood is CLI11's own error.
  app.allow_extras();
  app.parse_complete_callback([&app, &out] {
    const std::vector<std::string> rest = app.remaining();
    std::vector<std::string> other;
    for (size_t i = 0; i < rest.size(); ++i) {
      const std::string& a = rest[i];
      const size_t eq = a.find('=');
      const std::string name = a.substr(0, eq);
      if (a.rfind("--", 0) != 0 || name.find('.') == std::string::npos) {
        other.push_back(a);
        continue;
      }
      std::string value;
      if (eq != std::string::npos)
        value = a.substr(eq + 1);
      else if (i + 1 < rest.size() && rest[i + 1].rfind("--", 0) != 0)
        value = rest[++i];
      out.emplace_back(name, value);
    }
    if (!other.empty()) throw CLI::ExtrasError(app.get_name(), other);
  });
}

RunConfig load_run_config(const std::string& toml_path, const ConfigOverrides& overrides) {
  RunConfig cfg;
  Origins origins;
  if (!toml_path.empty()) read_toml(toml_path, cfg, origins);
  apply_overrides(overrides, cfg, origins);
  check_values(cfg, origins);
  // A micro-batch's token count is a 32-bit int in the op interface (and sizes every
  // activation buffer): refuse a product that does not fit before anything uses it.
  if (static_cast<int64_t>(cfg.train.micro_batch) * cfg.train.seq_len > INT_MAX) {
    // Named where the first one that was set came from (micro_batch's when both were).
    const bool batch_set = origin_text(origins, "train.micro_batch") != "default";
    const std::string first = batch_set ? "train.micro_batch" : "train.seq_len";
    const std::string second = batch_set ? "train.seq_len" : "train.micro_batch";
    const std::string shown = origin_text(origins, second) == kCommandLine ? "--" + second : second;
    fail_key(origins, first, " (", batch_set ? cfg.train.micro_batch : cfg.train.seq_len, ") x ", shown, " (",
             batch_set ? cfg.train.seq_len : cfg.train.micro_batch, ") = ",
             static_cast<int64_t>(cfg.train.micro_batch) * cfg.train.seq_len,
             " tokens per micro-batch, more than the ", INT_MAX, " supported; lower one of them");
  }
  cfg.model = resolve_model(cfg, origins);
  if (cfg.train.seq_len > cfg.model.max_position_embeddings)
    fail_key(origins, "train.seq_len", " (", cfg.train.seq_len, ") exceeds max_position_embeddings (",
             cfg.model.max_position_embeddings, ") of model ", cfg.model.source);
  return cfg;
}

std::string run_config_toml(const RunConfig& cfg) {
  std::ostringstream os;
  os << "# shardtrain run configuration, as resolved (defaults, file, command line).\n"
     << "# Loading this file gives the same configuration back.\n";
  if (cfg.model.hidden_size > 0) {
    const ModelConfig& m = cfg.model;
    os << "# model: " << m.source << "\n#   " << m.num_params() << " parameters; vocab " << m.vocab_size
       << ", hidden " << m.hidden_size << ", intermediate " << m.intermediate_size << ", layers "
       << m.num_layers << ", heads " << m.num_heads << ", kv_heads " << m.num_kv_heads << ", max_pos "
       << m.max_position_embeddings << ", rope_theta " << format_double(m.rope_theta)
       << (m.tie_word_embeddings ? ", tied" : ", untied") << " embeddings\n";
  }
  std::string section;
  for (const Key& k : schema()) {
    if (section_of(k.name) != section) {
      section = section_of(k.name);
      os << "\n[" << section << "]\n";
    }
    os << "# " << k.help << "\n"
       << k.name.substr(section.size() + 1) << " = " << value_text(cfg, k, true) << "\n";
  }
  return os.str();
}

}  // namespace st

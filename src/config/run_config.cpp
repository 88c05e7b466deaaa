// The run configuration. One schema table below lists every key once; the TOML
// reader, the command-line options, the range checks and the TOML writer all walk it
// (config/schema.h), so a new key is one line here plus its field in its section.
#include "config/run_config.h"

#include <CLI/CLI.hpp>
#include <climits>
#include <sstream>

#include "config/toml_text.h"

namespace st {

namespace {

// ---- the schema -----------------------------------------------------------------

std::vector<Key> run_config_keys(RunConfig& c) {
  std::string presets;
  for (const std::string& n : model_preset_names()) presets += (presets.empty() ? "" : ", ") + n;
  const char* keep = "; 0 keeps the preset's / config.json's value";
  return std::vector<Key>{
      {"model.preset", &c.model_options.preset, "built-in model: " + presets},
      {"model.config", &c.model_options.config,
       "Hugging Face config.json (file or directory); when set it wins over model.preset"},
      {"model.init_from", &c.model_options.init_from,
       "Hugging Face model directory (config.json + safetensors) whose weights start the run; its "
       "config.json gives the model unless model.config is set"},
      {"model.layers", &c.model_options.layers, std::string("number of layers") + keep, at_least(0)},
      {"model.hidden_size", &c.model_options.hidden_size, std::string("hidden size") + keep, at_least(0)},
      {"model.intermediate_size", &c.model_options.intermediate_size,
       std::string("MLP intermediate size") + keep, at_least(0)},
      {"model.heads", &c.model_options.heads, std::string("attention heads") + keep, at_least(0)},
      {"model.kv_heads", &c.model_options.kv_heads, std::string("key/value heads") + keep, at_least(0)},
      {"model.vocab_size", &c.model_options.vocab_size, std::string("vocabulary size") + keep, at_least(0)},

      {"train.steps", &c.train.steps, "optimizer steps", at_least(1)},
      {"train.seq_len", &c.train.seq_len, "tokens per sequence (at most the model's max_position_embeddings)",
       at_least(1)},
      {"train.micro_batch", &c.train.micro_batch, "sequences per forward/backward pass", at_least(1)},
      {"train.grad_accum", &c.train.grad_accum, "micro-batches accumulated per optimizer step", at_least(1)},
      {"train.seed", &c.train.seed, "seed for initialisation and data order"},
      {"train.device", &c.train.device, "where to train", {}, train_devices()},
      {"train.log_every", &c.train.log_every, "log loss and throughput every N steps", at_least(1)},
      {"train.recompute", &c.train.recompute,
       "activations recomputed in backward instead of kept (less memory, same results): none, norm (the RMSNorm "
       "outputs), swiglu (its output), ffn (norm 2, gate|up, SwiGLU), attn (norm 1, qkv, attention), block "
       "(all but each layer's input)",
       {}, recompute_choices()},
      {"train.matmul_dtype", &c.train.matmul_dtype,
       "precision of the transformer blocks' linear layers: bf16 (the compute dtype; f32 on the CPU) or fp8 (those "
       "train.fp8_layers names: e4m3 weights and activations, e5m2 gradients, per-tensor scales, fp32 "
       "accumulation; sm_89/sm_90 GPUs, emulated exactly on the CPU). Master weights, optimizer state and "
       "attention are unchanged, so checkpoints are the same and a run may switch on resume",
       {}, matmul_dtypes()},
      {"train.fp8_scaling", &c.train.fp8_scaling,
       "how train.matmul_dtype=fp8 scales activations and gradients: current (each cast reads the tensor twice: "
       "its amax, then the cast with that scale) or delayed (one pass: the scale of the largest amax over the "
       "last 16 steps of every rank, this step's recorded as it casts; the first step of a fresh start uses "
       "current, a resume continues the checkpoint's history). "
       "Weights always use their current amax. Delayed (the default) moves fewer bytes and lets the SwiGLU "
       "kernels cast their own outputs (1.24x bf16 against current's 1.17x at 1.5B on an H100, with loss curves within "
       "noise of each other); values above the "
       "history's range "
       "saturate to the format's largest",
       {}, fp8_scalings()},
      {"train.fp8_layers", &c.train.fp8_layers,
       "with train.matmul_dtype=fp8: which linear layers compute in FP8 (the others in bf16): any of each block's "
       "qkv, o, gate_up, down, and lm_head, lm_head_grad or lm_head_fwd (comma-separated on the command line). "
       "lm_head: its three GEMMs in FP8 (the logits' gradient as e5m2, scaled by its known bound); lm_head_grad: "
       "only its two gradients' GEMMs, the logits and the loss in bf16; lm_head_fwd: only its forward (the "
       "logits), the loss and the gradients in bf16. The default, the MLP's two, keeps the attention "
       "projections (about an eighth of the blocks' matmul FLOPs) and the lm_head in bf16: 1.27x bf16 at 1.5B on "
       "an H100, its loss within 0.5% of bf16's on average at two seeds. All four kinds are about 2% faster; "
       "adding lm_head_fwd about 2% more (1.29x with the MLP's, 1.33x with all four) for a loss 0.2-0.3% higher "
       "than without it; adding lm_head_grad about 3% (1.31x) for one 0.25% lower (docs/performance.md)",
       {}, fp8_layer_kinds()},
      {"train.fp8_bf16_end_blocks", &c.train.fp8_bf16_end_blocks,
       "with train.matmul_dtype=fp8: this many blocks at each end of the stack (the first N and the last N) keep "
       "all their linear layers in bf16",
       at_least(0)},
      {"train.fp8_fast_accum", &c.train.fp8_fast_accum,
       "with train.matmul_dtype=fp8: true lets the forward GEMMs (e4m3 x e4m3) accumulate in the tensor cores' own "
       "faster, narrower accumulator (Transformer Engine's default split; the backward's always promote their sums "
       "to fp32 along the way). false (the default): every FP8 GEMM promotes; true saves about 0.8% of a 1.5B step and "
       "took the 0.5B parity run further from bf16 (docs/performance.md). A GPU choice: the CPU's emulation "
       "accumulates exactly either way"},
      {"train.fp8_dlogits_rounding", &c.train.fp8_dlogits_rounding,
       "with the lm_head's gradients in FP8 (train.fp8_layers naming lm_head or lm_head_grad): how the logits' "
       "gradient rounds "
       "to e5m2: nearest (even), or stochastic (up with probability equal to the distance from the grid point "
       "below, to 1/256; the same bits on the CPU and GPUs). Rounding to nearest loses about 0.4% of the mass of "
       "the softmax's many small probabilities, so the gradient's row no longer sums to zero and the run learns "
       "faster than bf16 (1% lower loss on average); stochastic (the default) keeps the mass on average and "
       "halves that gap, for about 1% of a 1.5B step",
       {}, fp8_roundings()},
      {"train.offload", &c.train.offload,
       "optimizer state kept in page-locked host memory instead of the GPU's, each unit's streamed through the "
       "GPU for its update: none, optimizer (AdamW's m and v), optimizer+master (and the master weights; the GPU "
       "keeps their compute-dtype copy). Frees GPU memory for big models at the cost of host<->GPU traffic every "
       "step (the state's bytes each way); the same results bit for bit. The CPU backend runs the same path, "
       "though its memory is the host's anyway",
       {}, offload_choices()},
      {"train.peak_tflops", &c.train.peak_tflops,
       "dense bf16 TFLOP/s that MFU is measured against; 0 = the datasheet value for the GPU "
       "(H100/H200 989, A100 312, L4 121)",
       closed(0, 1e6)},

      {"optim.lr", &c.optim.lr, "peak learning rate (AdamW)", left_open(0, 1)},
      {"optim.min_lr_ratio", &c.optim.min_lr_ratio, "cosine decay ends at lr * min_lr_ratio", closed(0, 1)},
      {"optim.warmup_steps", &c.optim.warmup_steps, "linear warmup steps", at_least(0)},
      {"optim.beta1", &c.optim.beta1, "AdamW beta1", half_open(0, 1)},
      {"optim.beta2", &c.optim.beta2, "AdamW beta2", half_open(0, 1)},
      {"optim.eps", &c.optim.eps, "AdamW epsilon", left_open(0, 1)},
      {"optim.weight_decay", &c.optim.weight_decay, "decoupled weight decay", closed(0, 1)},
      {"optim.grad_clip", &c.optim.grad_clip, "clip the global gradient norm to this; 0 disables",
       at_least(0)},
      {"optim.state_dtype", &c.optim.state_dtype,
       "dtype of AdamW's m and v: fp32, or bf16 (half the bytes; each update computed in fp32 and stored with "
       "stochastic rounding, seeded, so runs repeat bit for bit). Checkpoints store fp32 either way: a run may "
       "change it on resume",
       {}, state_dtypes()},
      {"optim.master_dtype", &c.optim.master_dtype,
       "dtype of the master weights the optimizer updates: fp32, or bf16 (stochastic rounding as above; on a GPU "
       "the bf16 master is also what is gathered, so its compute copy is not kept: 4 bytes per parameter fewer)",
       {}, state_dtypes()},

      {"data.source", &c.data.source, "random tokens, byte-level text from data.paths, or token shards from data.paths (shardtrain data prepare)", {},
       data_sources()},
      {"data.paths", &c.data.paths,
       "text: files or directories; tokens: prepared directories (comma-separated on the command line)"},
      // Negative so that it can never collide with a token id.
      {"data.ignore_index", &c.data.ignore_index, "target id that the loss skips", below(0)},

      {"dist.shard_group_size", &c.dist.shard_group_size,
       "ranks that shard the model together; 0 = all ranks (FSDP), G = shard within groups of G ranks and "
       "replicate across groups (HSDP; world size must be a multiple of G)",
       at_least(0)},
      {"dist.reshard_after_forward", &c.dist.reshard_after_forward,
       "free each unit's gathered weights after its forward and all-gather them again for backward "
       "(less memory); false keeps them from forward to backward (one all-gather per unit fewer)"},
      {"dist.timeout_s", &c.dist.timeout_s,
       "seconds any rendezvous or collective may wait before the run fails naming the missing ranks",
       left_open(0, 604800)},
      {"dist.reduce_dtype", &c.dist.reduce_dtype,
       "dtype gradients travel in for the reduce-scatter (and the HSDP replica all-reduce): fp32, or bf16 (the fp32 "
       "gradient rounded to bf16 first: half the bytes; the reduced shard is added to the fp32 gradient)",
       {}, reduce_dtypes()},
      {"dist.fp8_gather", &c.dist.fp8_gather,
       "with train.matmul_dtype=fp8: all-gather a block's FP8 MLP weights (gate|up and down, when train.fp8_layers "
       "names down) as e4m3 codes, one byte an element, each rank casting its own part with the scale of the whole "
       "tensor's amax, agreed once per step: the codes the GEMMs would use anyway, half the bytes of bf16 on the "
       "wire (the QKV and O weights, FP8 or not, travel in bf16, each rank's slice in one all-gather); the same "
       "training bit for bit. Nothing changes on one rank (nothing is gathered); false gathers bf16 and casts after "
       "the gather"},
      {"dist.overlap", &c.dist.overlap,
       "CPU backend: run the prefetched all-gathers and the gradient reduce-scatters (and HSDP all-reduces) on a "
       "communication thread beside the compute; false runs each inside its call (nothing overlaps; the same "
       "results bit for bit). On CUDA, NCCL's streams always overlap"},

      {"dist.bind", &c.dist.bind,
       "address rank 0's rendezvous store listens on: empty = the address the job names (MASTER_ADDR), so a "
       "job on 127.0.0.1 is not reachable from the network; 0.0.0.0 (or ::, *) = every interface; or a host "
       "name or address of rank 0's host"},

      {"fabric.transport", &c.fabric.transport,
       "network NCCL must use between nodes: efa (AWS OFI plugin on EFA), ib, socket, or auto (NCCL's "
       "choice); forced ones make NCCL fail instead of falling back to sockets. Variables already in the "
       "environment win",
       {}, fabric_transports()},
      {"fabric.socket_ifname", &c.fabric.socket_ifname,
       "NCCL_SOCKET_IFNAME (interfaces for bootstrap and the socket transport); empty = NCCL's choice"},
      {"fabric.expect_transport", &c.fabric.expect_transport,
       "refuse to train unless NCCL's log shows this transport: efa | ib | socket (inter-node paths), "
       "nvlink | shm (intra-node paths); empty = report only",
       {}, fabric_expect_transports()},
      {"fabric.log_dir", &c.fabric.log_dir,
       "directory for NCCL's INFO logs (one per rank); empty = <run.out_dir>/nccl"},

      {"run.out_dir", &c.run.out_dir, "directory for logs, config and checkpoints"},
      {"run.progress", &c.run.progress, "progress bar (auto: only on a terminal)", {},
       progress_modes()},
      {"run.export_dir", &c.run.export_dir,
       "after training, write the model here in Hugging Face format (config.json + model.safetensors)"},
      {"run.export_dtype", &c.run.export_dtype, "dtype of exported weights", {}, export_dtypes()},
      {"run.checkpoint_every", &c.run.checkpoint_every,
       "save a sharded checkpoint every N steps and after the last; 0 = never", at_least(0)},
      {"run.checkpoint_dir", &c.run.checkpoint_dir,
       "where checkpoints go (step-N directories and `latest`); empty = <run.out_dir>/checkpoints"},
      {"run.keep_last", &c.run.keep_last,
       "complete checkpoints to keep (older ones are deleted); 0 keeps all", at_least(0)},
      {"run.resume", &c.run.resume,
       "auto: continue from the newest complete checkpoint in run.checkpoint_dir if there is one; none: start "
       "afresh; or a step-N checkpoint directory (at any world size)"},
      {"run.resume_config", &c.run.resume_config,
       "a resume whose settings differ from the checkpoint's (the run config its manifest records) in a key "
       "that changes what is trained (model, data, optimizer, batch, seed, reduce dtype): refuse names every "
       "such key, old -> new, and stops (exit 2); override continues under the new settings with a warning naming "
       "them. Keys such as train.steps, logging, progress, profiling, checkpointing and paths of outputs may "
       "always change (docs/operations.md)",
       {}, resume_configs()},
      {"run.term_grace_s", &c.run.term_grace_s,
       "seconds a stop by SIGTERM/SIGINT may take to save its checkpoint (the pod's terminationGracePeriodSeconds "
       "should be larger); past it the run exits without the save, the last complete checkpoint stays",
       left_open(0, 86400)},
      {"run.dry_run", &c.run.dry_run,
       "plan, do not train: print one rank's memory (weights, gradients, optimizer state, gathered units, "
       "activations per recompute choice, workspace, host) and the largest micro-batch that fits, then exit 0; "
       "needs no GPU and allocates nothing"},
      {"run.gpu_memory_gib", &c.run.gpu_memory_gib,
       "run.dry_run: GiB of GPU memory to plan for (e.g. 22.5 for an L4, 80 for an H100); 0 = the GPU here, if any",
       closed(0, 1e6)},
      {"run.dry_run_world", &c.run.dry_run_world,
       "run.dry_run: ranks to plan for (dist.shard_group_size applies); 0 = the launch environment's WORLD_SIZE, "
       "else 1",
       closed(0, 1 << 20)},
      {"run.profile", &c.run.profile,
       "time every op over a window of steps (CUDA events on a GPU) and print a table; also <run.out_dir>/profile.json"},
      {"run.profile_warmup", &c.run.profile_warmup,
       "steps run before the profile window opens", at_least(0)},
      {"run.profile_steps", &c.run.profile_steps, "steps in the profile window",
       at_least(1)},
      {"run.tensorboard", &c.run.tensorboard,
       "write TensorBoard events (loss, lr, grad norm, tokens/s, TFLOP/s, MFU, memory per step) to "
       "<run.out_dir>/tb (rank 0)"},
  };
}

std::string section_of(const std::string& name) { return name.substr(0, name.find('.')); }

// Checks across keys, after every layer is in.
void check_run_values(const RunConfig& cfg, const Schema& s) {
  s.check();
  if (cfg.run.out_dir.empty()) s.fail_key("run.out_dir", " must not be empty");
  // Only non-empty here: whether the paths exist is the data loader's business.
  if (cfg.data.source == "text" && cfg.data.paths.empty())
    s.fail_key("data.paths", " must list at least one file or directory when data.source is 'text'");
  // A micro-batch's token count is a 32-bit int in the op interface (and sizes every
  // activation buffer): refuse a product that does not fit before anything uses it.
  if (static_cast<int64_t>(cfg.train.micro_batch) * cfg.train.seq_len > INT_MAX) {
    // Named where the first one that was set came from (micro_batch's when both were).
    const bool batch_set = s.was_set("train.micro_batch");
    const std::string first = batch_set ? "train.micro_batch" : "train.seq_len";
    const std::string second = batch_set ? "train.seq_len" : "train.micro_batch";
    const std::string shown = s.origin(second).where == kCommandLine ? "--" + second : second;
    s.fail_key(first, " (", batch_set ? cfg.train.micro_batch : cfg.train.seq_len, ") x ", shown, " (",
               batch_set ? cfg.train.seq_len : cfg.train.micro_batch, ") = ",
               static_cast<int64_t>(cfg.train.micro_batch) * cfg.train.seq_len,
               " tokens per micro-batch, more than the ", INT_MAX, " supported; lower one of them");
  }
}

void check_seq_len(const RunConfig& cfg, const Schema& s) {
  if (cfg.train.seq_len > cfg.model.max_position_embeddings)
    s.fail_key("train.seq_len", " (", cfg.train.seq_len, ") exceeds max_position_embeddings (",
               cfg.model.max_position_embeddings, ") of model ", cfg.model.source);
}

// model.config (a config.json) wins over model.preset; then the model.* overrides.
// The source stays the preset name or config.json path (the trainer prints it) plus
// each override and where it came from, so validate_model_config's errors say both.
ModelConfig resolve_model(const RunConfig& cfg, const Schema& s) {
  ModelConfig m;
  if (!cfg.model_options.config.empty() || !cfg.model_options.init_from.empty()) {
    const char* key = cfg.model_options.config.empty() ? "model.init_from" : "model.config";
    const std::string& path = cfg.model_options.config.empty() ? cfg.model_options.init_from : cfg.model_options.config;
    try {
      m = load_hf_config(path);
    } catch (const Error& e) {
      s.fail_key_as(e.kind() == ErrorKind::Runtime ? ErrorKind::Usage : e.kind(), key, " = '", path, "': ",
                  e.what());
    }
  } else {
    try {
      m = model_preset(cfg.model_options.preset);
    } catch (const Error& e) {
      s.fail_key("model.preset", ": ", e.what());
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
    applied.push_back(std::string(o.key) + "=" + std::to_string(o.value) + " (" + s.origin(o.key).where + ")");
  }
  if (!applied.empty()) m.source += " with " + join(applied, ", ");
  validate_model_config(m);
  return m;
}

}  // namespace

void add_config_options(CLI::App& app, ConfigOverrides& out) {
  RunConfig defaults;
  const Schema schema(run_config_keys(defaults));
  for (const Key& k : schema.keys()) {
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
        ->type_name(Schema::type_label(k))
        ->option_text(Schema::type_label(k) + (schema.value_text(k, false).empty() ? "" : "=" + schema.value_text(k, false)))
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
  Schema s(run_config_keys(cfg));
  if (!toml_path.empty()) s.read_toml(parse_toml_file(toml_path, "run config"), toml_path);
  for (const auto& [name, value] : overrides) s.set_from_text(name, value);
  check_run_values(cfg, s);
  cfg.model = resolve_model(cfg, s);
  check_seq_len(cfg, s);
  return cfg;
}

RunConfig read_run_config(const std::string& path, std::string* model_note) {
  RunConfig cfg;
  // Whatever is wrong with a file a run wrote is a data error (exit 3).
  Schema s(run_config_keys(cfg), ErrorKind::Data);
  s.read_toml(parse_toml_file(path, "the run's configuration"), path, /*skip_unknown=*/true);
  check_run_values(cfg, s);
  // The model's dimensions, as the trainer resolved them; a config.json that is not
  // on this machine (a run made elsewhere) leaves them unknown, and says so.
  try {
    cfg.model = resolve_model(cfg, s);
    check_seq_len(cfg, s);
  } catch (const Error& e) {
    if (model_note) *model_note = e.what();
    cfg.model = ModelConfig{};
  }
  return cfg;
}

std::vector<ConfigChange> run_config_changes(const std::string& saved, const std::string& source,
                                             const RunConfig& now) {
  RunConfig before;
  Schema was(run_config_keys(before), ErrorKind::Data);
  toml::table root;
  try {
    root = toml::parse(saved, source);
  } catch (const toml::parse_error& e) {
    fail_data(source, ":", e.source().begin.line, ":", e.source().begin.column, ": TOML syntax error: ",
              e.description());
  }
  was.read_toml(root, source, /*skip_unknown=*/true);
  RunConfig copy = now;
  const Schema is(run_config_keys(copy));
  std::vector<ConfigChange> out;
  for (const Key& k : was.keys()) {
    if (!was.was_set(k.name)) continue;
    std::string a = was.value_text(k, true), b = is.value_text(*is.find(k.name), true);
    if (a != b) out.push_back({k.name, std::move(a), std::move(b)});
  }
  return out;
}

std::string run_config_toml(const RunConfig& cfg) {
  RunConfig copy = cfg;
  const Schema schema(run_config_keys(copy));
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
  for (const Key& k : schema.keys()) {
    if (section_of(k.name) != section) {
      section = section_of(k.name);
      os << "\n[" << section << "]\n";
    }
    os << "# " << k.help << "\n"
       << k.name.substr(section.size() + 1) << " = " << schema.value_text(k, true) << "\n";
  }
  return os.str();
}

}  // namespace st

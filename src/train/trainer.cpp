#include "train/trainer.h"

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "core/nvtx.h"
#include "core/rng.h"
#include "fabric/transport_report.h"
#include "io/hf_checkpoint.h"
#include "io/checkpoint.h"
#include "core/files.h"
#include "train/checkpointing.h"
#include "train/flops.h"
#include "train/fp8_scaling_record.h"
#include "train/matmul_precision.h"
#include "train/memory_check.h"
#include "train/memory_plan.h"
#include "train/resume_config.h"
#include "metrics/run_summary.h"
#include "metrics/tb_events.h"
#include "train/stop_signal.h"

namespace st {
namespace {

// A test-only fault: SHARDTRAIN_TEST_FAULT="rank:step:marker" kills this process with
// SIGKILL after `step` on that rank, once (the marker file records that it happened).
void test_fault(int rank, int step) {
  const char* spec = std::getenv("SHARDTRAIN_TEST_FAULT");
  if (!spec) return;
  int r = -1, s = -1;
  char marker[512] = {};
  if (std::sscanf(spec, "%d:%d:%511s", &r, &s, marker) != 3 || r != rank || s != step) return;
  if (std::FILE* f = std::fopen(marker, "r")) {
    std::fclose(f);
    return;
  }
  if (std::FILE* f = std::fopen(marker, "w")) std::fclose(f);
  std::raise(SIGKILL);
}

// Before anything is written: an expectation nothing can check is an error.
void check_transport_checkable(const RunConfig& cfg, bool have_fabric, Device device) {
  ST_CHECK(cfg.fabric.expect_transport.empty() || have_fabric, "fabric.expect_transport=", cfg.fabric.expect_transport,
           " checks NCCL's transport, but this run has no NCCL communicator (",
           device == Device::CPU ? "the CPU backend uses Gloo" : "a world of 1 not started by a launcher",
           "); drop it, or run on GPUs under `shardtrain launch`");
}

// Whether a metrics.jsonl holds a step record: a run that stopped before its first
// step (a configuration error, a fabric mismatch) left nothing worth keeping.
bool has_step_record(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step")) return true;
  }
  return false;
}

// A fresh start must not write over a run that stopped half way and left nothing
// to continue from (its metrics would be lost in silence). Collective; rank 0 looks.
// A launcher's restart (restart > 0) starts again over its own failed attempt; a
// refusal is a usage error, which a launcher does not restart.
void check_out_dir_fresh(const RunConfig& cfg, Comm& comm, int start, int restart, bool out) {
  std::string why;
  if (comm.rank() == 0 && start == 0 && cfg.run.resume == "auto" && !cfg.run.out_dir.empty() &&
      has_step_record(cfg.run.out_dir + "/metrics.jsonl")) {
    bool finished = false;
    try {
      finished = read_run_summary(cfg.run.out_dir + "/summary.json").finished();
    } catch (const std::exception&) {
    }
    if (!finished && restart > 0) {
      if (out)
        log_info("restart " + std::to_string(restart) + " by the launcher: no checkpoint to continue from in '" +
                 cfg.run.out_dir + "'; starting again from step 0");
    } else if (!finished) {
      why = "run.out_dir '" + cfg.run.out_dir + "' holds an unfinished run (metrics.jsonl, no finished "
            "summary.json) and no checkpoint to continue from; pass --run.resume=none to start afresh over it, or "
            "choose another run.out_dir";
    }
  }
  if (comm.all_reduce_sum(why.empty() ? 0.0 : 1.0) > 0)
    fail_config(why.empty() ? "rank 0 refused to start: run.out_dir holds an unfinished run" : why);
}

// The AdamW parameters of step s (0-based): the schedule's learning rate, and the
// gradient scaled down to optim.grad_clip when its global norm is above it.
AdamWParams adamw_at(const OptimOptions& o, const LrSchedule& schedule, int s, double grad_norm, uint64_t seed) {
  AdamWParams p;
  p.lr = static_cast<float>(schedule.at(s));
  p.beta1 = static_cast<float>(o.beta1);
  p.beta2 = static_cast<float>(o.beta2);
  p.eps = static_cast<float>(o.eps);
  p.weight_decay = static_cast<float>(o.weight_decay);
  p.step = s + 1;
  const double clip = o.grad_clip;
  p.grad_scale = clip > 0 && grad_norm > clip ? static_cast<float>(clip / grad_norm) : 1.0f;
  // bf16 state rounds with fresh bits every step, the same on every rank and on resume.
  p.round_key = hash_combine(hash_combine(seed, 0x6f7074696d), static_cast<uint64_t>(s));
  return p;
}

// summary.json of a run stopped by signal `sig` after step `done`.
RunSummary interrupted_summary(int sig, int done, int steps, const std::string& checkpoint) {
  RunSummary s;
  s.steps = steps;
  s.interrupted = true;
  s.signal = sig, s.steps_done = done;
  s.checkpoint = checkpoint;
  return s;
}

}  // namespace

// What one run() keeps from step to step: what it writes and prints as it goes, and
// what it adds up for its result.
struct Trainer::RunState {
  bool out = false;                      // prints: verbose, on rank 0
  int start = 0;                         // the steps done before this run (resumed)
  std::unique_ptr<MetricsLog> metrics;   // rank 0 with a run.out_dir
  std::unique_ptr<TbEventWriter> tb;
  EtaEstimator eta;
  ProgressBar bar{"off"};
  TrainResult result;
  double timed_tokens = 0, timed_s = 0;  // over the steps after the first
  int timed_steps = 0;
  double timed_comm_bytes = 0, timed_comm_inter = 0, timed_comm_blocked_s = 0;
};

Trainer::Trainer(const RunConfig& cfg, Backend& backend, ProcessGroups& groups,
                 std::shared_ptr<const FabricReport> fabric)
    : cfg_(cfg),
      prof_(cfg.run.profile ? std::make_unique<ProfilingBackend>(backend) : nullptr),
      be_(prof_ ? static_cast<Backend&>(*prof_) : backend),
      comm_(*groups.world), shard_(*groups.shard), replicate_(groups.replicate.get()), comm_stats_(groups.stats),
      fabric_(std::move(fabric)) {
  layout_ = std::make_unique<ParamLayout>(cfg.model);
  plan_ = std::make_unique<ShardPlan>(*layout_, shard_.world());
  FsdpOptions fo;
  fo.compute_dtype = backend.device() == Device::CPU ? DType::F32 : DType::BF16;
  // First, so that building the attention plans (cuDNN compiles its engines, about
  // 1-2 s) overlaps the weight initialisation and allocations below.
  if (fo.compute_dtype == DType::BF16)
    be_.prepare_attention(cfg.train.micro_batch, cfg.train.seq_len, cfg.model.num_heads, cfg.model.num_kv_heads,
                          cfg.model.head_dim());
  fo.reshard_after_forward = cfg.dist.reshard_after_forward;
  fo.reduce_dtype = cfg.dist.reduce_dtype == "bf16" ? DType::BF16 : DType::F32;
  fo.master_dtype = cfg.optim.master_dtype == "bf16" ? DType::BF16 : DType::F32;
  fo.state_dtype = cfg.optim.state_dtype == "bf16" ? DType::BF16 : DType::F32;
  fo.offload_state = cfg.train.offload != "none";
  fo.offload_master = cfg.train.offload == "optimizer+master";
  const Fp8Options fp8 = Fp8Options::from(cfg.train);
  if (cfg.dist.fp8_gather) fo.fp8_gather = Qwen2Model::fp8_gather_spans(*layout_, fp8);
  // The inputs before the model's memory: bad data or a bad checkpoint is refused
  // before the shards and activations are allocated.
  data_ = make_token_source(cfg.data, cfg.model.vocab_size, cfg.train.seed, cfg.train.seq_len);
  std::vector<std::vector<float>> loaded;
  if (!cfg.model_options.init_from.empty()) loaded = load_hf_weights(cfg.model_options.init_from, *layout_);
  fsdp_ = std::make_unique<Fsdp>(*plan_, be_, shard_, replicate_, fo);
  fsdp_->init_weights(cfg.train.seed);
  for (size_t u = 0; u < loaded.size(); ++u) fsdp_->load_unit(static_cast<int>(u), loaded[u]);
  loaded = {};
  // On a GPU the lm_head + loss run over chunks of rows, so the (rows, vocab) logits
  // never exist for the whole micro-batch at once.
  const int head_chunk = backend.device() == Device::CPU ? 0 : 4096;
  model_ = std::make_unique<Qwen2Model>(*layout_, be_, fo.compute_dtype, cfg.train.micro_batch, cfg.train.seq_len,
                                        head_chunk, parse_recompute(cfg.train.recompute),
                                        fp8);
  base_workspace_ = be_.workspace_bytes();
  if (backend.device() != Device::CPU)
    attention_workspace_ = attention_workspace_bytes(cfg.model, cfg.train.micro_batch, cfg.train.seq_len);
  schedule_ = LrSchedule::from(cfg.optim, cfg.train.steps);
  flops_per_token_ = flops_per_token(cfg.model, cfg.train.seq_len);
  peak_tflops_ = cfg.train.peak_tflops > 0
                     ? cfg.train.peak_tflops
                     : (backend.device() == Device::CPU ? 0 : peak_bf16_tflops(backend.name()));
  batches_.resize(cfg.train.grad_accum);
  for (auto& b : batches_) b.B = cfg.train.micro_batch, b.T = cfg.train.seq_len;
}

Trainer::~Trainer() = default;

void Trainer::profile_step(int s, int first, const StepMetrics& m, bool out) {
  const int open_at = first + cfg_.run.profile_warmup, close_at = open_at + cfg_.run.profile_steps;
  if (s + 1 == open_at) {  // the window holds the steps after this one
    prof_->open_window();
    profile_ms_ = 0;
    return;
  }
  if (!prof_->window_open()) return;
  prof_->mark_step();
  profile_ms_ += m.step_s * 1e3;
  if (s + 1 < close_at && s + 1 < cfg_.train.steps) return;
  prof_->close_window();
  const int steps = prof_->steps();
  const DeviceCeilings c = device_ceilings(be_.name());
  const double peak = peak_tflops_ > 0 ? peak_tflops_ : c.tflops;
  const ProfileReport r = prof_->report(profile_ms_ / std::max(steps, 1), peak, c.gbps);
  if (!out) return;
  log_info(r.table());
  write_text_atomic(cfg_.run.out_dir + "/profile.json", r.json().dump(1) + "\n");
}

std::string Trainer::memory_check_line(size_t measured_peak) const {
  const GatheredMemory g = gathered_estimate();
  std::string line = "memory in step 1: ";
  if (measured_peak > 0)
    line += "peak " + human_bytes(static_cast<double>(measured_peak)) + " measured, " +
            human_bytes(static_cast<double>(estimated_peak_bytes())) + " estimated; ";
  line += "gathered units " + human_bytes(static_cast<double>(fsdp_->memory().gathered_peak_bytes)) +
          " measured, " + human_bytes(static_cast<double>(g.total())) + " estimated";
  if (attention_workspace_)  // cuDNN's workspace is sized by cuDNN at its first call: the one guess here
    line += "; workspace " + human_bytes(static_cast<double>(be_.workspace_bytes())) + " measured, " +
            human_bytes(static_cast<double>(base_workspace_ + attention_workspace_)) + " estimated";
  return line;
}

size_t Trainer::estimated_peak_bytes() const {
  const FsdpMemory mem = fsdp_->memory();
  return mem.master_bytes + mem.grad_bytes + mem.optimizer_bytes + mem.staging_bytes + gathered_estimate().total() +
         model_->activation_bytes() + base_workspace_ + attention_workspace_;
}

GatheredMemory Trainer::gathered_estimate() const {
  if (fsdp_->in_place()) {
    GatheredMemory none;
    none.where = "nothing (one rank: the model reads the shards in place)";
    return none;
  }
  const size_t cdt = dtype_size(be_.device() == Device::CPU ? DType::F32 : DType::BF16);
  return plan_->gathered_peak(cdt, cfg_.dist.reshard_after_forward, cfg_.dist.reduce_dtype == "bf16" ? 2 : 4);
}

void Trainer::print_header() const {
  const ModelConfig& m = cfg_.model;
  const long long global_seqs = 1LL * cfg_.train.micro_batch * cfg_.train.grad_accum * comm_.world();
  char buf[512];
  std::string sharding = "world " + std::to_string(comm_.world());
  if (replicate_)
    sharding += " (HSDP: sharded over groups of " + std::to_string(shard_.world()) + " ranks, " +
                std::to_string(replicate_->world()) + " replicas)";
  else if (comm_.world() > 1)
    sharding += " (FSDP: sharded over all ranks)";
  if (comm_.world() > 1) sharding += ", gradients reduced in " + cfg_.dist.reduce_dtype;
  if (shard_.world() > 1 && fsdp_->fp8_gathers())
    sharding += ", the MLP's FP8 weights gathered as e4m3";
  log_info(std::string("shardtrain ") + SHARDTRAIN_VERSION + " | backend " + be_.name() + " | " + sharding);
  std::snprintf(buf, sizeof buf, "model %s: %d layers, hidden %d, heads %d (kv %d), ffn %d, vocab %d, %s | %s params",
                m.source.c_str(), m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.intermediate_size,
                m.vocab_size, m.tie_word_embeddings ? "tied" : "untied",
                human_count(static_cast<double>(m.num_params())).c_str());
  log_info(buf);
  log_info("data: " + data_->describe());
  std::snprintf(buf, sizeof buf,
                "batch: micro %d x seq %d x accum %d x data-parallel %d = %lld sequences, %lld tokens per step",
                cfg_.train.micro_batch, cfg_.train.seq_len, cfg_.train.grad_accum, comm_.world(), global_seqs,
                global_seqs * cfg_.train.seq_len);
  log_info(buf);
  log_info(describe_matmul_dtype(cfg_, be_));
  const OptimOptions& o = cfg_.optim;
  std::snprintf(buf, sizeof buf,
                "optim: AdamW lr %.3g (warmup %d, cosine to %.3g at step %d), betas (%.3g, %.3g), wd %.3g, clip %.3g",
                o.lr, o.warmup_steps, o.lr * o.min_lr_ratio, cfg_.train.steps, o.beta1, o.beta2, o.weight_decay,
                o.grad_clip);
  log_info(buf);
  if (o.warmup_steps >= cfg_.train.steps)
    log_warn("optim.warmup_steps (" + std::to_string(o.warmup_steps) + ") is not below train.steps (" +
             std::to_string(cfg_.train.steps) + "): the learning rate only rises, and never decays; lower "
             "--optim.warmup_steps");
  std::snprintf(buf, sizeof buf,
                "flops: 6 x %s matmul params (lm_head included) + 6 x %d layers x %d hidden x %d seq (causal "
                "attention) = %.3g GFLOP per token",
                human_count(matmul_params(m)).c_str(), m.num_layers, m.hidden_size, cfg_.train.seq_len, flops_per_token_ / 1e9);
  log_info(buf);
  if (peak_tflops_ > 0) {
    std::snprintf(buf, sizeof buf, "mfu: model TFLOP/s per rank / %.0f TFLOP/s (%s, dense bf16)", peak_tflops_,
                  cfg_.train.peak_tflops > 0 ? "train.peak_tflops" : be_.name().c_str());
    log_info(buf);
  }
  // What this rank holds: its shards for the whole run, and at the worst point of a
  // step the gathered units, the reductions in flight and the activations.
  const FsdpMemory mem = fsdp_->memory();
  const GatheredMemory gathered = gathered_estimate();
  log_info("memory per rank (sharded over " + std::to_string(shard_.world()) + "):");
  auto row = [&](const std::string& what, size_t bytes) {
    std::snprintf(buf, sizeof buf, "  %-58s %12s", what.c_str(), human_bytes(static_cast<double>(bytes)).c_str());
    log_info(buf);
  };
  const MemoryRowLabels labels = memory_row_labels(cfg_, be_.device());
  row(labels.weights, mem.master_bytes);
  row(labels.gradients, mem.grad_bytes);
  if (cfg_.train.offload == "none") row(labels.optimizer, mem.optimizer_bytes);
  if (mem.staging_bytes) row(labels.staging, mem.staging_bytes);
  if (mem.host_bytes) row("host: " + labels.offloaded, mem.host_bytes);
  log_info("  gathered at the peak: " + gathered.where);
  if (gathered.weights) row("  unit weights (computing + prefetched)", gathered.weights);
  if (gathered.held_tied_embedding) row("  tied embedding (held from forward to backward)", gathered.held_tied_embedding);
  if (gathered.grads) row("  unit gradients (fp32, accumulating)", gathered.grads);
  if (gathered.in_flight)
    row("  reduction in flight (" + cfg_.dist.reduce_dtype + " input + shard)", gathered.in_flight);
  {
    const double tokens = static_cast<double>(cfg_.train.micro_batch) * cfg_.train.seq_len;
    std::snprintf(buf, sizeof buf, "activations and scratch (one micro-batch, %.2f MiB per token%s)",
                  static_cast<double>(model_->activation_bytes()) / tokens / (1 << 20),
                  cfg_.train.recompute == "none" ? "" : (", recompute " + cfg_.train.recompute).c_str());
    row(buf, model_->activation_bytes());
  }
  row("workspace", base_workspace_);
  if (attention_workspace_) row("attention workspace (cuDNN, sized at its first call)", attention_workspace_);
  row("total (estimate)", estimated_peak_bytes());
  if (fabric_) {
    for (const std::string& line : format_transport_report(*fabric_)) log_info(line);
    if (!cfg_.fabric.expect_transport.empty()) {
      const ExpectCheck c = check_expected_transport(*fabric_, cfg_.fabric.expect_transport);
      std::string notes;
      for (const std::string& n : c.notes) notes += "; " + n;
      log_info("fabric: expect_transport " + cfg_.fabric.expect_transport + ": " + (c.ok ? "ok" : "MISMATCH") + notes);
    }
  }
  if (!cfg_.run.out_dir.empty()) log_info("output: " + cfg_.run.out_dir + "/metrics.jsonl");
}

StepMetrics Trainer::step(int s) {
  ST_NVTX_RANGE("step", s + 1);
  const double t0 = now_seconds();
  const CommCounts comm0 = comm_stats_ ? comm_stats_->snapshot() : CommCounts{};
  // The whole step's micro-batches first: the loss is a mean over every valid
  // target of the global batch, so each micro-batch's gradient is scaled by one
  // global count and accumulation equals one big batch.
  int64_t valid = 0;
  for (int micro = 0; micro < cfg_.train.grad_accum; ++micro) {
    data_->fill(batches_[micro], BatchPosition{s, micro, cfg_.train.grad_accum, comm_.rank(), comm_.world()});
    for (int32_t t : batches_[micro].targets) valid += t != cfg_.data.ignore_index;
  }
  const double total_valid = comm_.all_reduce_sum(static_cast<double>(valid));
  ST_CHECK(total_valid > 0, "step ", s + 1, ": every target of the global batch is ignored");

  fsdp_->zero_grads();
  model_->begin_step();
  double loss_sum = 0;
  const float scale = static_cast<float>(1.0 / total_valid);
  for (size_t micro = 0; micro < batches_.size(); ++micro) {
    // HSDP: gradients are summed across replicas once per step, in the last backward.
    fsdp_->begin_micro_batch(static_cast<int>(micro), static_cast<int>(batches_.size()));
    const Batch& b = batches_[micro];
    ST_NVTX_RANGE("micro-batch", static_cast<int>(micro));
    loss_sum += model_->forward_backward(*fsdp_, b.inputs.data(), b.targets.data(), scale, cfg_.data.ignore_index).sum;
  }
  // Delayed FP8 scaling: every rank takes the largest amax of any rank into its
  // history, so all of them scale the next step alike (one state, saved once).
  if (const Tensor amax = model_->fp8_step_amax(); !amax.empty() && comm_.world() > 1)
    comm_.all_reduce_max(amax, amax.numel);
  const double loss = comm_.all_reduce_sum(loss_sum) / total_valid;
  ST_CHECK(std::isfinite(loss), "step ", s + 1, ": the loss is not finite (", loss,
           "); lower optim.lr or check the data");

  const double norm = fsdp_->grad_norm();
  const AdamWParams p = adamw_at(cfg_.optim, schedule_, s, norm, cfg_.train.seed);
  fsdp_->step(p);
  be_.synchronize();

  const double t1 = now_seconds();
  const int64_t step_tokens = static_cast<int64_t>(cfg_.train.micro_batch) * cfg_.train.seq_len * cfg_.train.grad_accum * comm_.world();
  tokens_seen_ += step_tokens;
  StepMetrics m;
  m.step = s + 1;
  m.total_steps = cfg_.train.steps;
  m.loss = loss;
  m.lr = p.lr;
  m.grad_norm = norm;
  m.step_s = t1 - t0;
  m.tokens_per_s = step_tokens / std::max(m.step_s, 1e-9);
  m.elapsed_s = t1 - t_start_;
  m.tokens = tokens_seen_;
  m.tflops = m.tokens_per_s * flops_per_token_ / comm_.world() / 1e12;
  m.mfu = peak_tflops_ > 0 ? m.tflops / peak_tflops_ : 0;
  m.peak_memory_bytes = be_.peak_allocated_bytes();
  if (comm_stats_) {
    const CommCounts c = comm_stats_->snapshot() - comm0;
    m.comm_all_gather_bytes = c.bytes[static_cast<int>(CollectiveKind::AllGather)];
    m.comm_reduce_scatter_bytes = c.bytes[static_cast<int>(CollectiveKind::ReduceScatter)];
    m.comm_all_reduce_bytes = c.bytes[static_cast<int>(CollectiveKind::AllReduce)];
    m.comm_broadcast_bytes = c.bytes[static_cast<int>(CollectiveKind::Broadcast)];
    m.comm_inter_node_bytes = c.inter_node_bytes;
    m.comm_blocked_s = c.blocked_s;
  }
  return m;
}

TrainResult Trainer::run(bool verbose) {
  check_transport_checkable(cfg_, fabric_ != nullptr, be_.device());
  // Where to continue from: rank 0 decides, every rank loads (collectively).
  const int start = resume();
  check_out_dir_fresh(cfg_, comm_, start, restart_count_, verbose && comm_.rank() == 0);
  RunState st = open_outputs(start, verbose && comm_.rank() == 0);
  t_start_ = now_seconds();
  StopSignals signals;
  int stopped_by = 0;
  CheckpointWriter writer;
  const CheckpointSchedule schedule = checkpoint_schedule(st);
  if (prof_ && cfg_.run.profile_warmup == 0) prof_->open_window(), profile_ms_ = 0;
  for (int s = start; s < cfg_.train.steps && !stopped_by; ++s) {  // a stop ends it on every rank, at one step
    StepMetrics m = step(s);
    record_step(st, s, m);
    test_fault(comm_.rank(), m.step);
    // The ranks agree at every step boundary whether any of them was told to stop.
    const StopRequest stop = signals.agree(comm_);
    stopped_by = stop.signal;
    const std::unique_ptr<GraceWatchdog> watchdog = watch_grace(stop, m.step, st.out);
    const size_t step1_peak = s == start ? be_.peak_allocated_bytes() : 0;
    if (s == start) be_.reset_peak_allocated();  // the first step's transient set-up is not the steady state
    writer.maybe_save(schedule, m.step, static_cast<uint64_t>(tokens_seen_), stop.requested(), cfg_.model, *fsdp_,
                      comm_, shard_, replicate_);
    print_step(st, m, s == start, step1_peak, stop.requested());
  }
  writer.finish(schedule, comm_);
  if (stopped_by) stop_interrupted(st, stopped_by);
  return finish(st);
}

Trainer::RunState Trainer::open_outputs(int start, bool out) {
  RunState st;
  st.out = out;
  st.start = start;
  const bool rank0 = comm_.rank() == 0;
  // Refuse an export target that would fail only after the whole run, before the run
  // directory is written: a configuration error leaves nothing behind.
  if (rank0 && !cfg_.run.export_dir.empty()) check_export_dir(cfg_.run.export_dir, false);
  if (rank0 && !cfg_.run.out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(cfg_.run.out_dir, ec);
    ST_CHECK(!ec, "run.out_dir: cannot create '", cfg_.run.out_dir, "': ", ec.message());
    write_text_atomic(cfg_.run.out_dir + "/config.toml", run_config_toml(cfg_));
    st.metrics = std::make_unique<MetricsLog>(cfg_.run.out_dir + "/metrics.jsonl", /*append=*/start > 0);
  }
  // TensorBoard: a new events file per run; a fresh start drops the old ones, as it
  // truncates metrics.jsonl, and a resumed run's START record supersedes the steps
  // after its checkpoint (docs/operations.md).
  if (st.metrics && cfg_.run.tensorboard && start < cfg_.train.steps) {
    if (start == 0) remove_tb_event_files(cfg_.run.out_dir + "/tb");
    st.tb = std::make_unique<TbEventWriter>(cfg_.run.out_dir + "/tb");
    st.tb->write_start(start + 1);
  }
  if (out) print_header();
  if (out && start > 0)
  {
    char buf[64];
    std::snprintf(buf, sizeof buf, ", loaded in %.2f s)", load_s_);
    log_info("resumed: " + resumed_from_ + " (step " + std::to_string(start) + " of " +
             std::to_string(cfg_.train.steps) + " done" + buf);
  }
  // The transport report goes in before the first step, and a run on the wrong
  // fabric stops here, on every rank, before any step has run.
  if (st.metrics && fabric_) st.metrics->write(nlohmann::json{{"transport_report", to_json(*fabric_)}});
  if (!cfg_.fabric.expect_transport.empty()) require_expected_transport(*fabric_, cfg_.fabric.expect_transport);
  st.bar = ProgressBar(out ? cfg_.run.progress : "off");
  return st;
}

CheckpointSchedule Trainer::checkpoint_schedule(RunState& st) const {
  CheckpointSchedule c;
  c.save.dir = checkpoint_dir();
  c.save.seed = cfg_.train.seed;
  if (!c.save.dir.empty()) c.save.run_config = run_config_toml(cfg_);
  c.save.keep_last = cfg_.run.keep_last;
  c.every = cfg_.run.checkpoint_every;
  c.last_step = cfg_.train.steps;
  c.say = [&st](const std::string& line) {
    if (!st.out) return;
    st.bar.clear();
    log_info(line);
  };
  c.fp8_scaling = [this] {
    const std::optional<Fp8ScalingState> s = model_->fp8_scaling_state();
    return s ? fp8_scaling_json(*s) : nlohmann::json();
  };
  return c;
}

void Trainer::record_step(RunState& st, int s, StepMetrics& m) {
  const int first = st.start;
  TrainResult& r = st.result;
  m.eta_s = st.eta.update(m.step, m.total_steps, m.step_s);
  if (s == first) first_step_after_start_ = seconds_since_process_start();
  r.losses.push_back(m.loss);
  r.grad_norms.push_back(m.grad_norm);
  if (s > first) {  // the first step warms up
    st.timed_tokens += m.tokens_per_s * m.step_s, st.timed_s += m.step_s, st.timed_steps += 1;
    st.timed_comm_bytes += static_cast<double>(m.comm_bytes());
    st.timed_comm_inter += static_cast<double>(m.comm_inter_node_bytes);
    st.timed_comm_blocked_s += m.comm_blocked_s;
  }
  if (st.metrics) st.metrics->write_step(m);
  if (st.tb) st.tb->write_scalars(m.step, step_scalars(m));
  if (prof_) profile_step(s, first, m, st.out);
}

void Trainer::print_step(RunState& st, const StepMetrics& m, bool first, size_t step1_peak, bool stop) {
  if (!st.out) return;
  if (first || m.step % cfg_.train.log_every == 0 || m.step == cfg_.train.steps || stop) {
    st.bar.clear();
    log_info(format_step_line(m));
  }
  if (first) {
    log_info(memory_check_line(step1_peak));
    if (first_step_after_start_ > 0) {
      char buf[128];
      std::snprintf(buf, sizeof buf, "first step done %.2f s after the process started (set-up %.2f s, step %.2f s)",
                    first_step_after_start_, first_step_after_start_ - m.step_s, m.step_s);
      log_info(buf);
    }
  }
  st.bar.update(m);
}

std::unique_ptr<GraceWatchdog> Trainer::watch_grace(const StopRequest& stop, int done, bool out) {
  if (!stop.requested()) return nullptr;
  const int sig = stop.signal;
  return std::make_unique<GraceWatchdog>(stop.since_s + cfg_.run.term_grace_s, sig, [this, out, done, sig] {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", cfg_.run.term_grace_s);
    std::fprintf(stderr,
                 "shardtrain: error: run.term_grace_s = %s s passed since signal %d before the checkpoint of "
                 "step %d was complete; exiting without it (resume=auto takes the last complete checkpoint)\n",
                 buf, sig, done);
    if (out) {
      try {
        RunSummary s = interrupted_summary(sig, done, cfg_.train.steps, "");
        s.checkpoint_incomplete = "term_grace_s passed";
        write_text_atomic(cfg_.run.out_dir + "/summary.json", run_summary_text(s));
      } catch (const std::exception&) {
      }
    }
  });
}

void Trainer::stop_interrupted(RunState& st, int sig) {
  st.bar.clear();
  const TrainResult& r = st.result;
  const int done = r.losses.empty() ? st.start : st.start + static_cast<int>(r.losses.size());
  if (st.metrics) {
    RunSummary s = interrupted_summary(sig, done, cfg_.train.steps,
                                       cfg_.run.checkpoint_every > 0 ? checkpoint_dir() : "");
    s.last_loss = r.losses.empty() ? 0.0 : r.losses.back();
    write_text_atomic(cfg_.run.out_dir + "/summary.json", run_summary_text(s));
  }
  throw Interrupted("interrupted by signal " + std::to_string(sig) + " after step " + std::to_string(done) +
                        (cfg_.run.checkpoint_every > 0 && !checkpoint_dir().empty()
                             ? "; checkpoint saved, rerun the same command to continue (run.resume=auto)"
                             : "; no checkpoint (run.checkpoint_every is 0)"),
                    sig);
}

TrainResult Trainer::finish(RunState& st) {
  st.bar.clear();
  TrainResult& r = st.result;
  if (r.losses.empty()) {  // resumed from the last step: nothing left to do
    if (st.out) log_info("done: all " + std::to_string(cfg_.train.steps) + " steps were done already (" + resumed_from_ + ")");
    return std::move(r);
  }
  r.tokens_per_s = st.timed_s > 0 ? st.timed_tokens / st.timed_s : 0;
  r.tflops_per_rank = r.tokens_per_s * flops_per_token_ / comm_.world() / 1e12;
  r.mfu = peak_tflops_ > 0 ? r.tflops_per_rank / peak_tflops_ : 0;
  r.peak_memory_bytes = be_.peak_allocated_bytes();
  if (st.timed_steps > 0) {
    r.comm_bytes_per_step = st.timed_comm_bytes / st.timed_steps;
    r.comm_inter_node_bytes_per_step = st.timed_comm_inter / st.timed_steps;
    r.comm_blocked_s_per_step = st.timed_comm_blocked_s / st.timed_steps;
  }
  if (st.out) {
    char buf[320];
    std::snprintf(buf, sizeof buf, "done: %d steps, loss %.4f -> %.4f, %s tok/s (mean after step 1), %.1fs",
                  cfg_.train.steps, r.losses.front(), r.losses.back(), human_count(r.tokens_per_s).c_str(),
                  now_seconds() - t_start_);
    std::string line = buf;
    if (r.mfu > 0) {
      std::snprintf(buf, sizeof buf, ", %.0f TFLOP/s per rank, MFU %.1f%%", r.tflops_per_rank, 100 * r.mfu);
      line += buf;
    }
    if (r.peak_memory_bytes > 0) line += ", peak memory " + human_bytes(static_cast<double>(r.peak_memory_bytes)) + " (after step 1)";
    log_info(line);
  }
  if (st.metrics) write_text_atomic(cfg_.run.out_dir + "/summary.json", run_summary_text(finished_summary(r)));
  if (!cfg_.run.export_dir.empty()) {
    export_model(cfg_.run.export_dir, parse_export_dtype(cfg_.run.export_dtype));
    if (st.out) log_info("exported: " + cfg_.run.export_dir + " (config.json + safetensors, " + cfg_.run.export_dtype + ")");
  }
  return std::move(r);
}

RunSummary Trainer::finished_summary(const TrainResult& r) const {
  RunSummary s;
  s.steps = cfg_.train.steps;
  s.world = comm_.world();
  s.backend = be_.name();
  s.model = cfg_.model.source;
  s.seq_len = cfg_.train.seq_len;
  s.micro_batch = cfg_.train.micro_batch;
  s.grad_accum = cfg_.train.grad_accum;
  s.first_loss = r.losses.front();
  s.final_loss = r.losses.back();
  s.tokens_per_s = r.tokens_per_s;
  s.tokens_per_s_per_rank = r.tokens_per_s / comm_.world();
  s.flops_per_token = flops_per_token_;
  s.tflops_per_rank = r.tflops_per_rank;
  s.mfu = r.mfu;
  s.peak_tflops = peak_tflops_;
  s.peak_memory_bytes = r.peak_memory_bytes;
  s.first_step_after_start_s = first_step_after_start_;
  if (comm_.world() > 1) {
    s.comm_bytes_per_step = r.comm_bytes_per_step;
    s.comm_inter_node_bytes_per_step = r.comm_inter_node_bytes_per_step;
    s.comm_blocked_s_per_step = r.comm_blocked_s_per_step;
  }
  return s;
}

std::string Trainer::checkpoint_dir() const {
  if (!cfg_.run.checkpoint_dir.empty()) return cfg_.run.checkpoint_dir;
  return cfg_.run.out_dir.empty() ? std::string() : cfg_.run.out_dir + "/checkpoints";
}

int Trainer::resume() {
  const std::string& how = cfg_.run.resume;
  if (how == "none") return 0;
  std::string path;
  if (how == "auto") {
    // Rank 0 picks; the others take the same step (they may not see the same files yet).
    int step = 0;
    std::string error;
    if (comm_.rank() == 0 && !checkpoint_dir().empty()) {
      try {
        std::vector<std::string> passed_over;
        const auto latest = find_latest_checkpoint(checkpoint_dir(), &passed_over);
        for (const std::string& p : passed_over)
          log_warn("run.resume=auto: passing over " + p + ": it has no manifest.json (an incomplete or damaged "
                   "checkpoint); " + (latest ? "continuing from " + *latest : std::string("no complete checkpoint is older")));
        if (latest) step = read_checkpoint(*latest, false).step + 1;
      } catch (const Error& e) {
        error = e.what();
        step = -1;
      }
    }
    step = static_cast<int>(comm_.all_reduce_sum(comm_.rank() == 0 ? step : 0));
    if (step < 0) fail_data(error.empty() ? "run.resume=auto: rank 0 could not read the newest checkpoint" : error);
    if (step == 0) return 0;
    path = checkpoint_step_dir(checkpoint_dir(), step - 1);
  } else {
    path = how;
  }
  check_resume_settings(path);
  const double t0 = now_seconds();
  const CheckpointManifest m = load_checkpoint(path, cfg_.model, *fsdp_, comm_, shard_);
  load_s_ = now_seconds() - t0;
  ST_CHECK(m.step <= cfg_.train.steps, "run.resume: ", path, " is at step ", m.step, ", past train.steps = ",
           cfg_.train.steps);
  tokens_seen_ = static_cast<int64_t>(m.tokens_seen);
  resumed_from_ = path;
  restore_fp8_scaling(m, path);
  return m.step;
}

void Trainer::restore_fp8_scaling(const CheckpointManifest& m, const std::string& path) {
  const Fp8Options o = Fp8Options::from(cfg_.train);
  if (!o.on) return;  // a bf16 run leaves a saved state alone
  std::string why = "the checkpoint holds none (saved without FP8)";
  if (!m.fp8_scaling.is_null())
    why = model_->restore_fp8_scaling(
        fp8_scaling_from_json(m.fp8_scaling, (std::filesystem::path(path) / "manifest.json").string() + ": fp8_scaling"));
  if (why.empty() || !o.delayed_on() || comm_.rank() != 0) return;
  log_info("fp8: the delayed scaling's amax history is not restored from " + path + ": " + why + "; step " +
           std::to_string(m.step + 1) + " scales from its current amax, as a fresh start does");
}

void Trainer::check_resume_settings(const std::string& path) {
  std::string why;
  int code = 0;  // the refusal's exit code on rank 0, 0 when none
  if (comm_.rank() == 0) {
    std::optional<std::string> saved;
    try {
      saved = read_checkpoint(path, /*verify_hashes=*/false).run_config;
    } catch (const Error&) {
      // A checkpoint that cannot be read: load_checkpoint says what is wrong with it.
    }
    try {
      if (saved)
        if (const std::string warning = check_resume_config(*saved, path, cfg_); !warning.empty()) log_warn(warning);
    } catch (const Error& e) {
      why = e.what();
      code = exit_code(e.kind());
    }
  }
  code = static_cast<int>(comm_.all_reduce_sum(code));
  if (code == kExitData) fail_data(why.empty() ? "rank 0 could not compare the settings of " + path : why);
  if (code != 0)
    fail_config(why.empty() ? "rank 0 refused to resume from " + path + " under other settings (its message says which)"
                            : why);
}

void Trainer::export_model(const std::string& dir, DType dtype) {
  std::vector<std::vector<float>> units;
  for (int u = 0; u < layout_->num_units(); ++u) units.push_back(fsdp_->gather_unit(u));  // collective
  if (comm_.rank() != 0) return;
  ExportOptions o;
  o.dtype = dtype;
  // A model from a config.json keeps that file's other keys (token ids, ...).
  o.config_from = !cfg_.model_options.config.empty() ? cfg_.model_options.config : cfg_.model_options.init_from;
  export_hf_model(dir, *layout_, units, o);
}

}  // namespace st

#include "train/trainer.h"

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <ctime>
#include <functional>
#include <mutex>
#include <thread>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/log.h"
#include "core/nvtx.h"
#include "fabric/transport_report.h"
#include "io/hf_checkpoint.h"
#include "io/checkpoint.h"
#include "core/files.h"
#include "train/checkpointing.h"
#include "train/flops.h"
#include "metrics/tb_events.h"

namespace st {
namespace {

// SIGTERM (what Kubernetes and a spot interruption send) or SIGINT: the first asks
// the run to stop at the next step boundary; a second one stops it at once.
volatile std::sig_atomic_t g_stop_signal = 0;
volatile std::sig_atomic_t g_stop_at_s = 0;  // CLOCK_MONOTONIC seconds of the first signal

void on_stop_signal(int sig) {
  if (g_stop_signal != 0) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  g_stop_at_s = static_cast<std::sig_atomic_t>(ts.tv_sec);
  g_stop_signal = sig;
}

double monotonic_s() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// run.term_grace_s: once the ranks stop for a signal, the save must be complete
// within the grace period counted from the signal (Kubernetes kills the pod at its
// terminationGracePeriodSeconds). Past it this exits the process with 128 + the
// signal, after `on_expiry` (the summary); the unfinished step-N.tmp is never chosen
// by resume=auto, so the last complete checkpoint stays the one to resume from.
class GraceWatchdog {
 public:
  GraceWatchdog(double deadline_s, int sig, std::function<void()> on_expiry)
      : thread_([this, deadline_s, sig, on_expiry = std::move(on_expiry)] {
          std::unique_lock<std::mutex> lock(mu_);
          while (!done_) {
            const double left = deadline_s - monotonic_s();
            if (left <= 0) {
              on_expiry();
              std::fflush(nullptr);
              std::_Exit(128 + sig);
            }
            cv_.wait_for(lock, std::chrono::duration<double>(left));
          }
        }) {}
  ~GraceWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// Installs the handlers for the run's duration.
struct StopSignals {
  using Handler = void (*)(int);
  Handler term, intr;
  StopSignals() {
    g_stop_signal = 0;
    term = std::signal(SIGTERM, on_stop_signal);
    intr = std::signal(SIGINT, on_stop_signal);
  }
  ~StopSignals() {
    std::signal(SIGTERM, term);
    std::signal(SIGINT, intr);
  }
};

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

}  // namespace

Trainer::Trainer(const RunConfig& cfg, Backend& backend, ProcessGroups& groups,
                 std::shared_ptr<const FabricReport> fabric)
    : cfg_(cfg),
      prof_(cfg.run.profile ? std::make_unique<ProfilingBackend>(backend) : nullptr),
      be_(prof_ ? static_cast<Backend&>(*prof_) : backend),
      comm_(*groups.world), shard_(*groups.shard), replicate_(groups.replicate.get()),
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
                                        head_chunk, parse_recompute(cfg.train.recompute));
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
  return line;
}

size_t Trainer::estimated_peak_bytes() const {
  const FsdpMemory mem = fsdp_->memory();
  return mem.master_bytes + mem.grad_bytes + mem.optimizer_bytes + gathered_estimate().total() +
         model_->activation_bytes() + be_.workspace_bytes();
}

GatheredMemory Trainer::gathered_estimate() const {
  if (fsdp_->in_place()) {
    GatheredMemory none;
    none.where = "nothing (one rank: the model reads the shards in place)";
    return none;
  }
  const size_t cdt = dtype_size(be_.device() == Device::CPU ? DType::F32 : DType::BF16);
  return plan_->gathered_peak(cdt, cfg_.dist.reshard_after_forward);
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
  const OptimOptions& o = cfg_.optim;
  std::snprintf(buf, sizeof buf,
                "optim: AdamW lr %.3g (warmup %d, cosine to %.3g at step %d), betas (%.3g, %.3g), wd %.3g, clip %.3g",
                o.lr, o.warmup_steps, o.lr * o.min_lr_ratio, cfg_.train.steps, o.beta1, o.beta2, o.weight_decay,
                o.grad_clip);
  log_info(buf);
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
  row(be_.device() == Device::CPU ? "weights (fp32 master shard)" : "weights (fp32 master shard + its bf16 copy)",
      mem.master_bytes);
  row("gradients (fp32 shard)", mem.grad_bytes);
  row("optimizer state (fp32 AdamW m and v)", mem.optimizer_bytes);
  log_info("  gathered at the peak: " + gathered.where);
  if (gathered.weights) row("  unit weights (computing + prefetched)", gathered.weights);
  if (gathered.held_tied_embedding) row("  tied embedding (held from forward to backward)", gathered.held_tied_embedding);
  if (gathered.grads) row("  unit gradients (fp32, accumulating)", gathered.grads);
  if (gathered.in_flight) row("  reduction in flight (fp32 input + shard)", gathered.in_flight);
  {
    const double tokens = static_cast<double>(cfg_.train.micro_batch) * cfg_.train.seq_len;
    std::snprintf(buf, sizeof buf, "activations and scratch (one micro-batch, %.2f MiB per token%s)",
                  static_cast<double>(model_->activation_bytes()) / tokens / (1 << 20),
                  cfg_.train.recompute == "none" ? "" : (", recompute " + cfg_.train.recompute).c_str());
    row(buf, model_->activation_bytes());
  }
  row("workspace", be_.workspace_bytes());
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
  double loss_sum = 0;
  const float scale = static_cast<float>(1.0 / total_valid);
  for (size_t micro = 0; micro < batches_.size(); ++micro) {
    // HSDP: gradients are summed across replicas once per step, in the last backward.
    fsdp_->set_replica_sync(micro + 1 == batches_.size());
    const Batch& b = batches_[micro];
    ST_NVTX_RANGE("micro-batch", static_cast<int>(micro));
    loss_sum += model_->forward_backward(*fsdp_, b.inputs.data(), b.targets.data(), scale, cfg_.data.ignore_index).sum;
  }
  const double loss = comm_.all_reduce_sum(loss_sum) / total_valid;
  ST_CHECK(std::isfinite(loss), "step ", s + 1, ": the loss is not finite (", loss,
           "); lower optim.lr or check the data");

  const double norm = fsdp_->grad_norm();
  AdamWParams p;
  p.lr = static_cast<float>(schedule_.at(s));
  p.beta1 = static_cast<float>(cfg_.optim.beta1);
  p.beta2 = static_cast<float>(cfg_.optim.beta2);
  p.eps = static_cast<float>(cfg_.optim.eps);
  p.weight_decay = static_cast<float>(cfg_.optim.weight_decay);
  p.step = s + 1;
  const double clip = cfg_.optim.grad_clip;
  p.grad_scale = clip > 0 && norm > clip ? static_cast<float>(clip / norm) : 1.0f;
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
  return m;
}

TrainResult Trainer::run(bool verbose) {
  const bool rank0 = comm_.rank() == 0;
  const bool out = verbose && rank0;
  // Before anything is written: an expectation nothing can check is an error.
  ST_CHECK(cfg_.fabric.expect_transport.empty() || fabric_, "fabric.expect_transport=", cfg_.fabric.expect_transport,
           " checks NCCL's transport, but this run has no NCCL communicator (",
           be_.device() == Device::CPU ? "the CPU backend uses Gloo" : "a world of 1 not started by a launcher",
           "); drop it, or run on GPUs under `shardtrain launch`");
  // Where to continue from: rank 0 decides, every rank loads (collectively).
  const int start = resume();
  // A fresh start must not write over a run that stopped half way and left nothing
  // to continue from (its metrics would be lost in silence).
  {
    std::string why;
    if (rank0 && start == 0 && cfg_.run.resume == "auto" && !cfg_.run.out_dir.empty() &&
        std::filesystem::exists(cfg_.run.out_dir + "/metrics.jsonl")) {
      bool finished = false;
      try {
        std::ifstream in(cfg_.run.out_dir + "/summary.json");
        finished = in && !nlohmann::json::parse(in).value("interrupted", false);
      } catch (const std::exception&) {
      }
      if (!finished)
        why = "run.out_dir '" + cfg_.run.out_dir + "' holds an unfinished run (metrics.jsonl, no finished "
              "summary.json) and no checkpoint to continue from; pass --run.resume=none to start afresh over it, or "
              "choose another run.out_dir";
    }
    if (comm_.all_reduce_sum(why.empty() ? 0.0 : 1.0) > 0)
      fail(why.empty() ? "rank 0 refused to start: run.out_dir holds an unfinished run" : why);
  }
  std::unique_ptr<MetricsLog> metrics;
  if (rank0 && !cfg_.run.out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(cfg_.run.out_dir, ec);
    ST_CHECK(!ec, "run.out_dir: cannot create '", cfg_.run.out_dir, "': ", ec.message());
    write_text_atomic(cfg_.run.out_dir + "/config.toml", run_config_toml(cfg_));
    metrics = std::make_unique<MetricsLog>(cfg_.run.out_dir + "/metrics.jsonl", /*append=*/start > 0);
  }
  // TensorBoard: a new events file per run; a fresh start drops the old ones, as it
  // truncates metrics.jsonl, and a resumed run's START record supersedes the steps
  // after its checkpoint (docs/operations.md).
  std::unique_ptr<TbEventWriter> tb;
  if (metrics && cfg_.run.tensorboard && start < cfg_.train.steps) {
    if (start == 0) remove_tb_event_files(cfg_.run.out_dir + "/tb");
    tb = std::make_unique<TbEventWriter>(cfg_.run.out_dir + "/tb");
    tb->write_start(start + 1);
  }
  EtaEstimator eta;
  // Refuse an export target that would fail only after the whole run.
  if (rank0 && !cfg_.run.export_dir.empty()) check_export_dir(cfg_.run.export_dir, false);
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
  if (metrics && fabric_) metrics->write(nlohmann::json{{"transport_report", to_json(*fabric_)}});
  if (!cfg_.fabric.expect_transport.empty()) require_expected_transport(*fabric_, cfg_.fabric.expect_transport);
  ProgressBar bar(out ? cfg_.run.progress : "off");

  TrainResult r;
  t_start_ = now_seconds();
  double timed_tokens = 0, timed_s = 0;
  const int first = start;
  StopSignals signals;
  int stopped_by = 0;
  CheckpointWriter writer;
  if (prof_ && cfg_.run.profile_warmup == 0) prof_->open_window(), profile_ms_ = 0;
  for (int s = start; s < cfg_.train.steps; ++s) {
    StepMetrics m = step(s);
    m.eta_s = eta.update(m.step, m.total_steps, m.step_s);
    if (s == first) first_step_after_start_ = seconds_since_process_start();
    r.losses.push_back(m.loss);
    r.grad_norms.push_back(m.grad_norm);
    if (s > first) timed_tokens += m.tokens_per_s * m.step_s, timed_s += m.step_s;  // the first step warms up
    if (metrics) metrics->write_step(m);
    if (tb) tb->write_scalars(m.step, step_scalars(m));
    if (prof_) profile_step(s, first, m, out);
    test_fault(comm_.rank(), m.step);
    // The ranks agree at every step boundary whether any of them was told to stop.
    const bool stop = comm_.all_reduce_sum(g_stop_signal != 0 ? 1.0 : 0.0) > 0;
    std::unique_ptr<GraceWatchdog> watchdog;
    if (stop) {
      stopped_by = g_stop_signal != 0 ? static_cast<int>(g_stop_signal) : SIGTERM;
      // Counted from this rank's signal (or from now, where another rank got it).
      const double since = g_stop_signal != 0 ? static_cast<double>(g_stop_at_s) : monotonic_s();
      const int done = m.step;
      watchdog = std::make_unique<GraceWatchdog>(since + cfg_.run.term_grace_s, stopped_by, [this, out, done,
                                                                                                 stopped_by] {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%g", cfg_.run.term_grace_s);
        std::fprintf(stderr,
                     "shardtrain: error: run.term_grace_s = %s s passed since signal %d before the checkpoint of "
                     "step %d was complete; exiting without it (resume=auto takes the last complete checkpoint)\n",
                     buf, stopped_by, done);
        if (out) {
          try {
            write_text_atomic(cfg_.run.out_dir + "/summary.json",
                              nlohmann::json{{"interrupted", true},
                                             {"signal", stopped_by},
                                             {"steps_done", done},
                                             {"steps", cfg_.train.steps},
                                             {"checkpoint", ""},
                                             {"checkpoint_incomplete", "term_grace_s passed"}}
                                      .dump(1) + "\n");
          } catch (const std::exception&) {
          }
        }
      });
    }
    const size_t step1_peak = s == first ? be_.peak_allocated_bytes() : 0;
    if (s == first) be_.reset_peak_allocated();  // the first step's transient set-up is not the steady state
    const int every = cfg_.run.checkpoint_every;
    const bool due = every > 0 && (m.step % every == 0 || m.step == cfg_.train.steps);
    // A checkpoint still being written: committed once every writer is done.
    auto committed = [&](const std::string& dir) {
      if (!out || dir.empty()) return;
      bar.clear();
      char buf[96];
      std::snprintf(buf, sizeof buf, " (%.2f s after its copy, written while training went on)",
                    now_seconds() - ckpt_began_);
      log_info("checkpoint: " + dir + buf);
    };
    if (writer.pending()) committed(writer.poll(comm_, /*wait=*/false));
    if (!checkpoint_dir().empty() && (due || (stop && every > 0))) {
      CheckpointSave w;
      w.dir = checkpoint_dir();
      w.step = m.step;
      w.tokens_seen = static_cast<uint64_t>(tokens_seen_);
      w.seed = cfg_.train.seed;
      w.run_config = run_config_toml(cfg_);
      w.keep_last = cfg_.run.keep_last;
      if (writer.pending()) committed(writer.poll(comm_, /*wait=*/true));  // one save at a time
      const double t0 = now_seconds();
      writer.begin(w, cfg_.model, *fsdp_, comm_, shard_, replicate_);
      ckpt_began_ = now_seconds();
      if (out) {
        bar.clear();
        char buf[96];
        std::snprintf(buf, sizeof buf, " started: shards copied to host memory in %.2f s", ckpt_began_ - t0);
        log_info("checkpoint of step " + std::to_string(m.step) + buf);
      }
      // The last one (or one asked for by a signal) is waited for.
      if (stop || m.step == cfg_.train.steps) committed(writer.poll(comm_, /*wait=*/true));
    }
    if (out) {
      if (s == first || m.step % cfg_.train.log_every == 0 || m.step == cfg_.train.steps || stop) {
        bar.clear();
        log_info(format_step_line(m));
      }
      if (s == first) {
        log_info(memory_check_line(step1_peak));
        if (first_step_after_start_ > 0) {
          char buf[128];
          std::snprintf(buf, sizeof buf, "first step done %.2f s after the process started (set-up %.2f s, step %.2f s)",
                        first_step_after_start_, first_step_after_start_ - m.step_s, m.step_s);
          log_info(buf);
        }
      }
      bar.update(m);
    }
    if (stop) break;  // every rank, at the same step
  }
  if (writer.pending()) {  // e.g. a run whose last step was not a checkpoint step
    const std::string dir = writer.poll(comm_, /*wait=*/true);
    if (out && !dir.empty()) log_info("checkpoint: " + dir);
  }
  if (stopped_by) {
    bar.clear();
    const int done = r.losses.empty() ? start : start + static_cast<int>(r.losses.size());
    if (metrics) {
      write_text_atomic(cfg_.run.out_dir + "/summary.json",
                        nlohmann::json{{"interrupted", true},
                                       {"signal", stopped_by},
                                       {"steps_done", done},
                                       {"steps", cfg_.train.steps},
                                       {"checkpoint", cfg_.run.checkpoint_every > 0 ? checkpoint_dir() : ""},
                                       {"last_loss", r.losses.empty() ? 0.0 : r.losses.back()}}
                                .dump(1) + "\n");
    }
    throw Interrupted("interrupted by signal " + std::to_string(stopped_by) + " after step " + std::to_string(done) +
                          (cfg_.run.checkpoint_every > 0 && !checkpoint_dir().empty()
                               ? "; checkpoint saved, rerun the same command to continue (run.resume=auto)"
                               : "; no checkpoint (run.checkpoint_every is 0)"),
                      stopped_by);
  }
  bar.clear();
  if (r.losses.empty()) {  // resumed from the last step: nothing left to do
    if (out) log_info("done: all " + std::to_string(cfg_.train.steps) + " steps were done already (" + resumed_from_ + ")");
    return r;
  }
  r.tokens_per_s = timed_s > 0 ? timed_tokens / timed_s : 0;
  r.tflops_per_rank = r.tokens_per_s * flops_per_token_ / comm_.world() / 1e12;
  r.mfu = peak_tflops_ > 0 ? r.tflops_per_rank / peak_tflops_ : 0;
  r.peak_memory_bytes = be_.peak_allocated_bytes();
  if (out) {
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
  if (metrics) {
    write_text_atomic(cfg_.run.out_dir + "/summary.json",
        nlohmann::json{{"steps", cfg_.train.steps},
                          {"world", comm_.world()},
                          {"backend", be_.name()},
                          {"model", cfg_.model.source},
                          {"seq_len", cfg_.train.seq_len},
                          {"micro_batch", cfg_.train.micro_batch},
                          {"grad_accum", cfg_.train.grad_accum},
                          {"first_loss", r.losses.front()},
                          {"final_loss", r.losses.back()},
                          {"tokens_per_s", r.tokens_per_s},
                          {"tokens_per_s_per_rank", r.tokens_per_s / comm_.world()},
                          {"flops_per_token", flops_per_token_},
                          {"tflops_per_rank", r.tflops_per_rank},
                          {"mfu", r.mfu},
                          {"peak_tflops", peak_tflops_},
                          {"peak_memory_bytes", r.peak_memory_bytes},
                          {"first_step_after_start_s", first_step_after_start_}}
                .dump(1) + "\n");
  }
  if (!cfg_.run.export_dir.empty()) {
    export_model(cfg_.run.export_dir, parse_export_dtype(cfg_.run.export_dtype));
    if (out) log_info("exported: " + cfg_.run.export_dir + " (config.json + safetensors, " + cfg_.run.export_dtype + ")");
  }
  return r;
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
        if (auto latest = find_latest_checkpoint(checkpoint_dir())) step = read_checkpoint(*latest, false).step + 1;
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
  const double t0 = now_seconds();
  const CheckpointManifest m = load_checkpoint(path, cfg_.model, *fsdp_, comm_, shard_);
  load_s_ = now_seconds() - t0;
  ST_CHECK(m.step <= cfg_.train.steps, "run.resume: ", path, " is at step ", m.step, ", past train.steps = ",
           cfg_.train.steps);
  tokens_seen_ = static_cast<int64_t>(m.tokens_seen);
  resumed_from_ = path;
  return m.step;
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

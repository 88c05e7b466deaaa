// `shardtrain predict`: the step-time model (stepmodel/step_model.h) for a run
// configuration on a cluster described by a few numbers: nodes, ranks per node, the
// links between them, and the compute time of a step (given, or a GPU's peak times an
// MFU). Prints a table, or with --json one object whose field names stay stable
// (docs/scaleout.md lists them; the scale-out bench reads them).
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/validators.h"
#include "config/run_config.h"
#include "core/error.h"
#include "stepmodel/gpu_peaks.h"
#include "stepmodel/prediction_json.h"
#include "stepmodel/step_model.h"

namespace st {
namespace {

struct PredictArgs {
  std::string config;
  ConfigOverrides overrides;
  int nodes = 1, ranks_per_node = 1;
  Link intra, inter;
  double compute_s = -1;
  std::string gpu;
  double mfu = 0.45;
  std::string schedule;                        // "" = by train.device
  std::string gather_dtype, reduce_dtype;  // "": by train.device / dist.reduce_dtype
  bool json = false;
  double host_net_ns_per_byte = 0, host_cores_per_node = 0;
};

void print_table(const StepModelInput& in, const StepPrediction& p, const ComputeBasis& basis) {
  const double MB = 1e6;
  const double params = static_cast<double>(in.model.num_params());
  std::printf("predict: %s, %.4g%s parameters, %.3g GFLOP per token\n", in.model.source.c_str(),
              params >= 1e9 ? params / 1e9 : params / 1e6, params >= 1e9 ? "B" : "M",
              step_flops_per_token(in.model, in.seq_len) / 1e9);
  std::printf("  ranks:     %d node%s x %d = %d, ", in.nodes, in.nodes == 1 ? "" : "s", in.ranks_per_node, in.world());
  if (in.hsdp())
    std::printf("HSDP: shard groups of %d, %d replicas", in.shard_group(), in.replicas());
  else
    std::printf("full shard over %d", in.world());
  std::printf(" (%s)\n", in.reshard_after_forward ? "reshard after forward" : "no reshard after forward");
  std::printf("  batch:     %.0f tokens per rank per step (micro_batch %d x seq_len %d x grad_accum %d)\n",
              in.tokens_per_rank(), in.micro_batch, in.seq_len, in.grad_accum);
  std::printf("  wire:      parameters gathered in %s%s, gradients reduced in %s\n", wire_dtype_name(in.gather_dtype_bytes),
              in.fp8_gather_numel ? " (the MLP's FP8 weights as e4m3)" : "", wire_dtype_name(in.reduce_dtype_bytes));
  std::printf("  links:     intra-node %g Gbit/s, %g us; inter-node %g Gbit/s, %g us (one node's link, each way)\n",
              in.intra.gbps, in.intra.latency_us, in.inter.gbps, in.inter.latency_us);
  if (basis.source == "gpu" && basis.matmul_dtype == "fp8")
    std::printf("  compute:   %.4g s per step (%s: %g TFLOP/s dense bf16 x MFU %g; the FP8 layers' %.1f%% of the "
                "FLOPs %gx faster: x %.3f)\n",
                p.compute_s, basis.gpu.c_str(), basis.peak_tflops, basis.mfu, 100 * basis.fp8_share, kFp8LayerSpeedup,
                fp8_compute_factor(basis.fp8_share));
  else if (basis.source == "gpu")
    std::printf("  compute:   %.4g s per step (%s: %g TFLOP/s dense bf16 x MFU %g)\n", p.compute_s, basis.gpu.c_str(),
                basis.peak_tflops, basis.mfu);
  else
    std::printf("  compute:   %.4g s per step (given)\n", p.compute_s);
  std::printf("  schedule:  %s\n", schedule_name(in.schedule));
  if (in.host_net_s_per_byte > 0)
    std::printf("  host:      the network stack takes %.3g ns of CPU per byte, on %g cores per node: %.4g s per step\n",
                in.host_net_s_per_byte * 1e9,
                in.host_cores_per_node > 0 ? in.host_cores_per_node : static_cast<double>(in.ranks_per_node),
                p.host_net_s);
  std::printf("step             %10.4f s    %.4g steps/s\n", p.step_s, p.steps_per_s);
  std::printf("tokens/s         %10.1f per rank, %.1f cluster\n", p.tokens_per_s_per_rank, p.tokens_per_s_cluster);
  std::printf("communication    %10.4f s    inter-node link %.4f s, exposed %.4f s\n", p.comm_s, p.comm_inter_s,
              p.exposed_comm_s);
  const struct {
    const char* name;
    const WireBytes& bytes;
    double seconds;
  } kinds[] = {{"all_gather", p.all_gather, p.comm_s_all_gather},
               {"reduce_scatter", p.reduce_scatter, p.comm_s_reduce_scatter},
               {"all_reduce", p.all_reduce, p.comm_s_all_reduce}};
  std::printf("per rank per step  %10s %14s %14s\n", "seconds", "intra-node MB", "inter-node MB");
  for (const auto& k : kinds)
    std::printf("  %-16s %10.4f %14.3f %14.3f\n", k.name, k.seconds, k.bytes.intra / MB, k.bytes.inter / MB);
  std::printf("(bytes sent, as many received; mean over the ranks, but the busiest rank's where a gather's parts are unequal)\n");
  std::printf("one node's network link: %.3f MB each way per step; %d collectives per step\n",
              p.inter_node_bytes_per_node / MB, p.collectives_per_step);
}

int run_predict(const PredictArgs& a) {
  const RunConfig cfg = load_run_config(a.config, a.overrides);
  StepModelInput in = step_model_input(cfg, a.nodes, a.ranks_per_node);
  if (!a.gather_dtype.empty()) in.gather_dtype_bytes = a.gather_dtype == "bf16" ? 2 : 4;
  if (!a.reduce_dtype.empty()) in.reduce_dtype_bytes = a.reduce_dtype == "bf16" ? 2 : 4;
  in.intra = a.intra;
  in.inter = a.inter;
  in.host_net_s_per_byte = a.host_net_ns_per_byte * 1e-9;
  in.host_cores_per_node = a.host_cores_per_node;
  // NCCL overlaps through its streams; Gloo through its comm thread unless
  // dist.overlap = false, when every collective runs inside its call.
  in.schedule = parse_schedule(!a.schedule.empty()                                   ? a.schedule
                               : cfg.train.device == "cuda" || cfg.dist.overlap ? "prefetch"
                                                                                  : "none");
  ComputeBasis basis;
  if (a.compute_s >= 0) {
    in.compute_s = a.compute_s;
  } else if (!a.gpu.empty()) {
    const GpuPeak* g = find_gpu_peak(a.gpu);
    if (!g) {
      std::string known;
      for (const GpuPeak& e : gpu_peaks()) known += (known.empty() ? "" : ", ") + e.name;
      fail_config("--gpu ", a.gpu, ": not in the table (", known, "); give --compute-s instead");
    }
    if (cfg.train.matmul_dtype == "fp8" && !g->has_fp8())
      fail_config("train.matmul_dtype = \"fp8\" with --gpu ", g->name, ": ", fp8_unsupported(*g),
                  "; the trainer would refuse it");
    basis = {"gpu", g->name, g->bf16_tflops, a.mfu, cfg.train.matmul_dtype,
             fp8_flop_share(in.model, in.seq_len, cfg.train)};
    in.compute_s = compute_seconds(in.model, in.seq_len, in.tokens_per_rank(), g->bf16_tflops, a.mfu) *
                   fp8_compute_factor(basis.fp8_share);
  } else {
    fail_config("predict: say how long a step computes: --compute-s SECONDS, or --gpu NAME (with --mfu)");
  }
  const StepPrediction p = predict_step(in);
  if (a.json)
    std::printf("%s\n", step_prediction_json(in, p, basis).dump(1).c_str());
  else
    print_table(in, p, basis);
  return 0;
}

constexpr const char* kPredictHelp =
    "Predict the step time of a run configuration on a cluster, from the step-time model\n"
    "(docs/scaleout.md): the bytes each collective of a step moves, ring collectives over the\n"
    "given links, and the overlap schedule. Takes the run config as train does (--config, then\n"
    "--section.key=value), plus the cluster: nodes, ranks per node, link rates and latencies,\n"
    "and the compute time of a step (--compute-s, or --gpu with --mfu).";

}  // namespace

Command add_predict_command(CLI::App& root) {
  auto a = std::make_shared<PredictArgs>();
  CLI::App* app = root.add_subcommand("predict", kPredictHelp);
  app->add_option("-c,--config", a->config, "TOML run config, e.g. configs/qwen2.5-1.5b.toml")
      ->check(CLI::ExistingFile);
  add_config_options(*app, a->overrides);
  app->add_option("--nodes", a->nodes, "nodes")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  app->add_option("--ranks-per-node", a->ranks_per_node, "ranks (GPUs, or CPU processes) per node")
      ->check(CLI::Range(1, 1 << 10))
      ->capture_default_str();
  app->add_option("--inter-gbps", a->inter.gbps,
                  "payload Gbit/s one node's network link achieves each way (needed with more than one node)")
      ->check(finite_in(0, 1e6));
  app->add_option("--inter-latency-us", a->inter.latency_us, "latency of a ring step between nodes (us)")
      ->check(finite_in(0, 1e7))
      ->capture_default_str();
  app->add_option("--intra-gbps", a->intra.gbps,
                  "payload Gbit/s each rank achieves to the next one of its node in a ring (needed with more "
                  "than one rank per node)")
      ->check(finite_in(0, 1e6));
  app->add_option("--intra-latency-us", a->intra.latency_us, "latency of a ring step within a node (us)")
      ->check(finite_in(0, 1e7))
      ->capture_default_str();
  app->add_option("--host-net-ns-per-byte", a->host_net_ns_per_byte,
                  "CPU ranks: nanoseconds of CPU the hosts' network stack spends per byte between nodes (one "
                  "flow's sender and receiver together), taken from the cores that compute; 0 for GPUs")
      ->check(finite_in(0, 1e6))
      ->capture_default_str();
  app->add_option("--host-cores-per-node", a->host_cores_per_node,
                  "cores one node has for its ranks and its network stack (default: one per rank)")
      ->check(finite_in(0, 1e6));
  CLI::Option* compute = app->add_option("--compute-s", a->compute_s,
                                         "seconds one rank computes per step, without communication")
                             ->check(finite_in(0, 1e7));
  CLI::Option* gpu = app->add_option("--gpu", a->gpu, "compute from this GPU's dense bf16 peak: L4, A10G, L40S, A100, "
                                                      "H100, H200 (docs/scaleout.md); with train.matmul_dtype = "
                                                      "fp8 its FP8 layers' FLOPs run 1.423x faster (L4, L40S, H100, "
                                                      "H200 only)");
  compute->excludes(gpu);
  app->add_option("--mfu", a->mfu, "with --gpu: the share of the peak a step achieves")
      ->check(finite_in(0, 1, /*lo_open=*/true))
      ->capture_default_str();
  app->add_option("--schedule", a->schedule,
                  "none (step = compute + communication) | prefetch (overlapped); default: prefetch, or none "
                  "on the CPU with --dist.overlap=false")
      ->check(CLI::IsMember({"none", "prefetch"}));
  app->add_option("--gather-dtype", a->gather_dtype,
                  "parameters on the wire: bf16 | fp32; default: what train.device gathers in (cuda bf16, cpu fp32)")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  app->add_option("--reduce-dtype", a->reduce_dtype,
                  "gradients on the wire: fp32 | bf16; default: the run config's dist.reduce_dtype")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  app->add_flag("--json", a->json, "print one JSON object (docs/scaleout.md lists its fields)");
  return {app, [a] { return run_predict(*a); }};
}

}  // namespace st

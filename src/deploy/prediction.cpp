#include "deploy/prediction.h"

#include <cstdarg>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "stepmodel/gpu_peaks.h"

namespace st {
namespace {

// Shares of an instance's network bandwidth that NCCL collectives achieve between
// two nodes: published measurements (the scale-out review of 2026-12-03, section 3b;
// docs/scaleout.md).
constexpr double kEfaShare = 0.8;
constexpr const char* kEfaSource = "aws/aws-ofi-nccl#19, from NVIDIA/nccl#235: about 80 of 100 Gbit/s, two p3dn nodes";
constexpr double kTcpShare = 0.4;
// NVIDIA/nccl#209: at most 60% of 32 Gbit/s; #450: less than half of 100 Gbit/s;
// NVIDIA/nccl-tests#83: 1.7 GB/s where the VM measured 21-25 Gbit/s.
constexpr const char* kTcpSource = "NVIDIA/nccl#209, #450 and nccl-tests#83 measured 40-60%; the low end";
// Assumed, not measured: a ring step's latency is under 1% of a step that moves GBs.
constexpr double kEfaLatencyUs = 20, kTcpLatencyUs = 50, kIntraLatencyUs = 10;
// Within a node. PCIe parts (L4, A10G, L40S) pass through host memory: PCIe Gen4 x16
// is 256 Gbit/s each way, about 40% of it taken. NVLink parts (A100, H100, H200 on
// p4d/p5): 1000 Gbit/s, well under NVLink's 2400-3600 Gbit/s each way.
constexpr double kPcieGbps = 100, kNvlinkGbps = 1000;
// The review's middle of 40-50% for the recipe's L4s; not measured on them.
constexpr double kMfu = 0.45;

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

bool nvlink_gpu(const std::string& name) { return name == "A100" || name == "H100" || name == "H200"; }

PredictedRun predict_run(const ClusterSpec& spec, const ClusterPrediction& cp, int nodes, int shard_group,
                         const LinkAssumption& inter, int reduce_bytes) {
  PredictedRun r;
  r.in = step_model_input(spec.run, nodes, spec.pod_gpus);
  r.in.shard_group_size = shard_group;
  r.in.reduce_dtype_bytes = reduce_bytes;
  r.in.intra = {cp.intra.gbps, cp.intra.latency_us};
  r.in.inter = {inter.gbps, inter.latency_us};
  // NCCL overlaps (each communicator on a stream of its own); Gloo does not.
  r.in.schedule = spec.run.train.device == "cuda" ? OverlapSchedule::Prefetch : OverlapSchedule::None;
  r.in.compute_s = compute_seconds(r.in.model, r.in.seq_len, r.in.tokens_per_rank(), cp.compute.peak_tflops,
                                   cp.compute.mfu) *
                   fp8_compute_factor(cp.compute.fp8_share);
  r.p = predict_step(r.in);
  return r;
}

bool has_efa(const ClusterPrediction& cp) { return cp.efa.gbps > 0; }

// The published recipe's own shape, the one its 2.06x was measured on.
bool recipe_shape(const ClusterSpec& spec) {
  return spec.gpu.instance_type == "g6.12xlarge" && spec.gpu.count == 2 && spec.run.model.source == "qwen2.5-1.5b";
}

std::string row(const char* label, const PredictedRun& r) {
  return format("  %-12s %8.3f %8.3f %13.0f %17.0f %13.3f %18.2f\n", label, r.p.step_s, r.p.steps_per_s,
                r.p.tokens_per_s_per_rank, r.p.tokens_per_s_cluster, r.p.comm_inter_s,
                r.p.inter_node_bytes_per_node / 1e9);
}

std::string link_line(const LinkAssumption& l, const std::string& instance) {
  if (l.line_gbps > 0)
    return format("  assumed %s: %g Gbit/s each way (%g%% of the %s's %g Gbit/s: %s), %g us per ring step\n",
                  l.name.c_str(), l.gbps, 100 * l.gbps / l.line_gbps, instance.c_str(), l.line_gbps, l.source.c_str(),
                  l.latency_us);
  return format("  assumed %s: %g Gbit/s each way (%s), %g us per ring step\n", l.name.c_str(), l.gbps,
                l.source.c_str(), l.latency_us);
}

}  // namespace

ClusterPrediction predict_cluster(const ClusterSpec& spec) {
  ClusterPrediction cp;
  const InstanceFacts& f = *spec.gpu.facts;
  const GpuPeak* g = find_gpu_peak(f.gpu_model);
  if (!g) {
    cp.skipped = "no dense bf16 peak for " + (f.gpu_model.empty() ? std::string("a CPU instance") : f.gpu_model) +
                 " in the step model's GPU table (src/stepmodel/gpu_peaks.cpp)";
    return cp;
  }
  // FP8 on a GPU without it is a preflight refusal (preflight.cpp): no prediction is made.
  cp.compute = {"gpu", g->name, g->bf16_tflops, kMfu, spec.run.train.matmul_dtype,
                fp8_flop_share(spec.run.model, spec.run.train.seq_len, spec.run.train)};
  cp.gpu_source = g->source;
  if (spec.gpu.efa && f.efa_interfaces > 0)
    cp.efa = {"EFA", kEfaShare * f.network_gbps, f.network_gbps, kEfaLatencyUs, kEfaSource};
  cp.tcp = {"TCP sockets", kTcpShare * f.network_gbps, f.network_gbps, kTcpLatencyUs, kTcpSource};
  cp.intra = nvlink_gpu(g->name)
                 ? LinkAssumption{"intra-node", kNvlinkGbps, 0, kIntraLatencyUs, "NVLink, a share of it"}
                 : LinkAssumption{"intra-node", kPcieGbps, 0, kIntraLatencyUs,
                                  "PCIe Gen4 x16 through host memory, about 40% of its 256 Gbit/s"};
  const LinkAssumption& expected = has_efa(cp) ? cp.efa : cp.tcp;
  const int file_group = spec.run.dist.shard_group_size;
  cp.reduce_dtype_bytes = spec.run.dist.reduce_dtype == "bf16" ? 2 : 4;
  cp.expected_fp32 = predict_run(spec, cp, spec.gpu.count, file_group, expected, 4);
  cp.fallback_fp32 = predict_run(spec, cp, spec.gpu.count, file_group, cp.tcp, 4);
  cp.expected_bf16 = predict_run(spec, cp, spec.gpu.count, file_group, expected, 2);
  cp.fallback_bf16 = predict_run(spec, cp, spec.gpu.count, file_group, cp.tcp, 2);
  for (int nodes : {1, 2, 4, 8})
    cp.scaling.push_back({nodes, predict_run(spec, cp, nodes, 0, expected, cp.reduce_dtype_bytes),
                          predict_run(spec, cp, nodes, spec.pod_gpus, expected, cp.reduce_dtype_bytes)});
  return cp;
}

std::string prediction_text(const ClusterSpec& spec, const ClusterPrediction& cp) {
  std::string s = "predicted step (the step-time model, docs/scaleout.md; not a measurement):\n";
  if (!cp.skipped.empty()) return s + "  none: " + cp.skipped + "\n";
  const StepModelInput& in = cp.expected().in;
  const double params = static_cast<double>(in.model.num_params());
  s += format("  model %s: %.4gB parameters, %.3g GFLOP per token (6 x matmul parameters + 6 x layers x hidden x "
              "seq_len)\n",
              in.model.source.c_str(), params / 1e9, step_flops_per_token(in.model, in.seq_len) / 1e9);
  s += format("  batch: %.0f tokens per GPU per step (micro_batch %d x seq_len %d x grad_accum %d); %d GPUs: %d nodes "
              "x %d, %s\n",
              in.tokens_per_rank(), in.micro_batch, in.seq_len, in.grad_accum, in.world(), in.nodes, in.ranks_per_node,
              in.hsdp() ? format("HSDP, shard groups of %d", in.shard_group()).c_str() : "full shard");
  if (cp.compute.matmul_dtype == "fp8")
    s += format("  assumed GPU: %s at %g TFLOP/s dense bf16 (%s) x %g%% MFU, the FP8 layers' %.1f%% of the FLOPs "
                "%gx faster (train.matmul_dtype = \"fp8\"; calibrated on a measured H100 step, docs/scaleout.md): "
                "compute %.3f s per step\n",
                spec.gpu.facts->gpu_model.c_str(), cp.compute.peak_tflops, cp.gpu_source.c_str(), 100 * cp.compute.mfu,
                100 * cp.compute.fp8_share, kFp8LayerSpeedup, cp.expected().p.compute_s);
  else
    s += format("  assumed GPU: %s at %g TFLOP/s dense bf16 (%s) x %g%% MFU: compute %.3f s per step\n",
                spec.gpu.facts->gpu_model.c_str(), cp.compute.peak_tflops, cp.gpu_source.c_str(), 100 * cp.compute.mfu,
                cp.expected().p.compute_s);
  if (has_efa(cp)) s += link_line(cp.efa, spec.gpu.instance_type);
  s += link_line(cp.tcp, spec.gpu.instance_type);
  s += link_line(cp.intra, spec.gpu.instance_type);
  const bool bf16_reduce = cp.reduce_dtype_bytes == 2;
  const char* reduce = wire_dtype_name(cp.reduce_dtype_bytes);
  s += format("  on the wire: parameters all-gathered in %s%s, gradients reduce-scattered in %s (dist.reduce_dtype; "
              "src/fsdp/fsdp.cpp); schedule %s\n",
              wire_dtype_name(in.gather_dtype_bytes),
              in.fp8_gather_numel ? " (the MLP's FP8 weights as e4m3, dist.fp8_gather)" : "", reduce,
              schedule_name(in.schedule));
  s += format("  %-12s %8s %8s %13s %17s %13s %18s\n", "fabric", "step s", "steps/s", "tokens/s/GPU",
              "tokens/s cluster", "inter-node s", "GB/node each way");
  if (has_efa(cp)) s += row("EFA", cp.expected());
  s += row("TCP sockets", cp.fallback());
  if (has_efa(cp)) {
    s += format("  EFA / TCP: %.2fx in steps/s; the published recipe (2 x g6.12xlarge) measured %.2fx (%.4f vs %.4f "
                "steps/s)\n",
                cp.expected().p.steps_per_s / cp.fallback().p.steps_per_s, kRecipeEfaStepsPerS / kRecipeTcpStepsPerS,
                kRecipeEfaStepsPerS, kRecipeTcpStepsPerS);
    const PredictedRun& oe = bf16_reduce ? cp.expected_fp32 : cp.expected_bf16;
    const PredictedRun& of = bf16_reduce ? cp.fallback_fp32 : cp.fallback_bf16;
    s += format("  with %s gradients (dist.reduce_dtype = \"%s\"; not this run's): EFA %.3f s (%.3f steps/s), TCP %.3f "
                "s (%.3f steps/s), %.2fx; %.2f GB/node each way\n",
                wire_dtype_name(oe.in.reduce_dtype_bytes), wire_dtype_name(oe.in.reduce_dtype_bytes), oe.p.step_s,
                oe.p.steps_per_s, of.p.step_s, of.p.steps_per_s, oe.p.steps_per_s / of.p.steps_per_s,
                oe.p.inter_node_bytes_per_node / 1e9);
    if (recipe_shape(spec)) {
      // Both runs communication-bound: steps/s is the link's rate over the bytes, and
      // the ratio the two rates' ratio.
      const double measured = kRecipeEfaStepsPerS / kRecipeTcpStepsPerS;
      s += format("  the gap to %.2fx: both runs are bound by the link, so the ratio is the rates' (%g%% / %g%%); "
                  "%.2fx puts sockets at %.0f%% of the line if EFA is at %g%%\n",
                  measured, 100 * kEfaShare, 100 * kTcpShare, measured, 100 * kEfaShare / measured, 100 * kEfaShare);
      const double needed = cp.expected_fp32.p.inter_node_bytes_per_node * 8 * kRecipeEfaStepsPerS / 1e9;
      s += format("  the gap to %.4f steps/s over EFA: with fp32 gradients that would need %.1f Gbit/s through a %g "
                  "Gbit/s link; with bf16 gradients the model gives %.3f (%+.1f%%): the recipe's run moved less than "
                  "fp32 gradients do, or had more than %g Gbit/s (docs/scaleout.md)\n",
                  kRecipeEfaStepsPerS, needed, cp.efa.line_gbps, cp.expected_bf16.p.steps_per_s,
                  100 * (cp.expected_bf16.p.steps_per_s / kRecipeEfaStepsPerS - 1), cp.efa.line_gbps);
    }
  }
  s += format("  scaling over %s, %s gradients (HSDP: shard within a node, replicate across nodes):\n",
              has_efa(cp) ? "EFA" : "TCP sockets", reduce);
  s += format("  %-9s %-13s %8s %13s %17s %17s\n", "nodes", "strategy", "step s", "tokens/s/GPU", "tokens/s cluster",
              "GB/node each way");
  for (const ClusterPrediction::Scaling& r : cp.scaling)
    for (const auto& [name, run] : {std::pair<const char*, const PredictedRun&>{"full shard", r.full_shard},
                                    std::pair<const char*, const PredictedRun&>{"HSDP", r.hsdp}})
      s += format("  %-9s %-13s %8.3f %13.0f %17.0f %17.2f\n",
                  format("%d x %d", r.nodes, run.in.ranks_per_node).c_str(),
                  r.nodes == 1 && name[0] == 'H' ? "HSDP (= full)" : name, run.p.step_s, run.p.tokens_per_s_per_rank,
                  run.p.tokens_per_s_cluster, run.p.inter_node_bytes_per_node / 1e9);
  return s;
}

nlohmann::json prediction_json(const ClusterPrediction& cp) {
  if (!cp.skipped.empty()) return {{"skipped", cp.skipped}};
  auto link = [](const LinkAssumption& l) {
    return nlohmann::json{{"gbps", l.gbps}, {"line_gbps", l.line_gbps}, {"latency_us", l.latency_us},
                          {"source", l.source}};
  };
  auto brief = [](const PredictedRun& r) {
    return nlohmann::json{{"step_s", r.p.step_s},
                          {"tokens_per_s_per_rank", r.p.tokens_per_s_per_rank},
                          {"tokens_per_s_cluster", r.p.tokens_per_s_cluster},
                          {"inter_node_bytes_per_node", r.p.inter_node_bytes_per_node}};
  };
  nlohmann::json j = {{"gpu", cp.compute.gpu},
                      {"gpu_bf16_tflops", cp.compute.peak_tflops},
                      {"gpu_source", cp.gpu_source},
                      {"mfu", cp.compute.mfu},
                      {"matmul_dtype", cp.compute.matmul_dtype},
                      {"fp8_flop_share", cp.compute.fp8_share},
                      {"fp8_layer_speedup", kFp8LayerSpeedup},
                      {"expected_fabric", has_efa(cp) ? "efa" : "tcp"},
                      {"links", {{"tcp", link(cp.tcp)}, {"intra", link(cp.intra)}}},
                      {"tcp", step_prediction_json(cp.fallback().in, cp.fallback().p, cp.compute)},
                      {"reduce_dtype", wire_dtype_name(cp.reduce_dtype_bytes)},
                      {"tcp_fp32_reduce", step_prediction_json(cp.fallback_fp32.in, cp.fallback_fp32.p, cp.compute)},
                      {"tcp_bf16_reduce", step_prediction_json(cp.fallback_bf16.in, cp.fallback_bf16.p, cp.compute)},
                      {"recipe_measured",
                       {{"efa_steps_per_s", kRecipeEfaStepsPerS},
                        {"tcp_steps_per_s", kRecipeTcpStepsPerS},
                        {"efa_over_tcp", kRecipeEfaStepsPerS / kRecipeTcpStepsPerS}}}};
  if (has_efa(cp)) {
    j["links"]["efa"] = link(cp.efa);
    j["efa"] = step_prediction_json(cp.expected().in, cp.expected().p, cp.compute);
    j["efa_fp32_reduce"] = step_prediction_json(cp.expected_fp32.in, cp.expected_fp32.p, cp.compute);
    j["efa_bf16_reduce"] = step_prediction_json(cp.expected_bf16.in, cp.expected_bf16.p, cp.compute);
    j["efa_over_tcp"] = cp.expected().p.steps_per_s / cp.fallback().p.steps_per_s;
    j["efa_over_tcp_fp32_reduce"] = cp.expected_fp32.p.steps_per_s / cp.fallback_fp32.p.steps_per_s;
    j["efa_over_tcp_bf16_reduce"] = cp.expected_bf16.p.steps_per_s / cp.fallback_bf16.p.steps_per_s;
  }
  j["scaling"] = nlohmann::json::array();
  for (const ClusterPrediction::Scaling& r : cp.scaling)
    j["scaling"].push_back({{"nodes", r.nodes}, {"full_shard", brief(r.full_shard)}, {"hsdp", brief(r.hsdp)}});
  return j;
}

}  // namespace st

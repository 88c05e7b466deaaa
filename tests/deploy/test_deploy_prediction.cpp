// What `deploy plan` predicts for a cluster file: the recipe's numbers and the
// assumptions printed with them, a node group without EFA, a GPU the model has no
// peak for, and the prediction in --json and in prediction.txt.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "deploy/cluster_file.h"
#include "deploy/prediction.h"
#include "stepmodel/gpu_peaks.h"
#include "support/files.h"
#include "support/shell.h"
#include "support/temp_dir.h"

namespace st {
namespace {

namespace fs = std::filesystem;

const fs::path kRecipe = fs::path(SHARDTRAIN_SOURCE_DIR) / "configs/deploy/eks-g6-efa.toml";

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(DeployPrediction, TheRecipe) {
  const ClusterSpec spec = load_cluster_file(kRecipe.string());
  const ClusterPrediction cp = predict_cluster(spec);
  ASSERT_TRUE(cp.skipped.empty()) << cp.skipped;
  // 80% and 40% of the g6.12xlarge's 40 Gbit/s; the L4's 121 TFLOP/s at 45%.
  EXPECT_EQ(cp.efa.gbps, 32);
  EXPECT_EQ(cp.tcp.gbps, 16);
  EXPECT_EQ(cp.compute.peak_tflops, 121);
  EXPECT_NEAR(cp.expected().p.compute_s, 1.473, 0.001);
  // fp32 gradients (the code): 10.40 GB through each node's link, link-bound.
  EXPECT_EQ(cp.expected().in.reduce_dtype_bytes, 4);
  EXPECT_EQ(cp.expected().in.gather_dtype_bytes, 2);
  EXPECT_EQ(cp.expected().in.schedule, OverlapSchedule::Prefetch);
  EXPECT_NEAR(cp.expected().p.inter_node_bytes_per_node / 1e9, 10.40, 0.005);
  EXPECT_NEAR(cp.expected().p.step_s, 10.3976 / 4.0, 0.02);
  EXPECT_NEAR(cp.fallback().p.step_s, 10.3976 / 2.0, 0.04);
  EXPECT_NEAR(cp.expected().p.steps_per_s / cp.fallback().p.steps_per_s, 2.0, 0.02);
  // bf16 gradients: 7.70 GB, within 1% of the recipe's measured 0.5173 steps/s.
  EXPECT_NEAR(cp.expected_bf16.p.inter_node_bytes_per_node / 1e9, 7.70, 0.005);
  EXPECT_NEAR(cp.expected_bf16.p.steps_per_s / kRecipeEfaStepsPerS, 1, 0.01);
  // Scaling: 1, 2, 4, 8 nodes; HSDP crosses nodes with less at every count. It is faster
  // at 2 nodes; from 4 on, its all-reduces, which can only run once the backward has
  // begun (after 45% of the compute here), take longer than full shard's gathers,
  // which run from the step's start.
  ASSERT_EQ(cp.scaling.size(), 4u);
  EXPECT_EQ(cp.scaling[0].full_shard.p.inter_node_bytes_per_node, 0);
  EXPECT_DOUBLE_EQ(cp.scaling[0].hsdp.p.step_s, cp.scaling[0].full_shard.p.step_s);
  for (size_t i = 1; i < cp.scaling.size(); ++i) {
    const auto& r = cp.scaling[i];
    EXPECT_EQ(r.full_shard.in.world(), 4 * r.nodes);
    EXPECT_LT(r.hsdp.p.inter_node_bytes_per_node, r.full_shard.p.inter_node_bytes_per_node) << r.nodes;
    if (r.nodes == 2) EXPECT_LT(r.hsdp.p.step_s, r.full_shard.p.step_s);
    EXPECT_GT(r.hsdp.p.step_s, replica_start_share(r.hsdp.in) * r.hsdp.p.compute_s) << r.nodes;
    EXPECT_GT(r.full_shard.p.tokens_per_s_cluster, cp.scaling[i - 1].full_shard.p.tokens_per_s_cluster) << r.nodes;
  }
  const std::string text = prediction_text(spec, cp);
  for (const char* part :
       {"8192 tokens per GPU per step (micro_batch 4 x seq_len 2048 x grad_accum 1); 8 GPUs: 2 nodes x 4, full shard",
        "NVIDIA L4 at 121 TFLOP/s dense bf16", "x 45% MFU: compute 1.473 s",
        "assumed EFA: 32 Gbit/s each way (80% of the g6.12xlarge's 40 Gbit/s", "aws/aws-ofi-nccl#19",
        "assumed TCP sockets: 16 Gbit/s each way (40% of the g6.12xlarge's 40 Gbit/s", "NVIDIA/nccl#209",
        "gradients reduce-scattered in fp32 (dist.reduce_dtype", "EFA / TCP: 2.00x",
        "measured 2.06x (0.5173 vs 0.2513 steps/s)", "with bf16 gradients (dist.reduce_dtype = \"bf16\"; not this run's)",
        "would need 43.0 Gbit/s", "scaling over EFA, fp32 gradients", "8 x 4     HSDP"})
    EXPECT_TRUE(has(text, part)) << part << "\n" << text;
  const nlohmann::json j = prediction_json(cp);
  EXPECT_EQ(j["expected_fabric"], "efa");
  EXPECT_EQ(j["efa"]["reduce_dtype"], "fp32");
  EXPECT_EQ(j["reduce_dtype"], "fp32");
  EXPECT_EQ(j["efa_bf16_reduce"]["reduce_dtype"], "bf16");
  EXPECT_EQ(j["efa_fp32_reduce"]["reduce_dtype"], "fp32");
  EXPECT_DOUBLE_EQ(j["efa"]["step_s"].get<double>(), cp.expected().p.step_s);
  EXPECT_NEAR(j["efa_over_tcp"].get<double>(), 2.0, 0.02);
  EXPECT_NEAR(j["recipe_measured"]["efa_over_tcp"].get<double>(), 2.058, 0.001);
  EXPECT_EQ(j["scaling"].size(), 4u);
}

// A file that reduces in bf16 (dist.reduce_dtype): its own rows, the scaling table and
// the text say bf16; the other line is fp32's. The recipe's gap is still fp32 against
// bf16, whatever the file says.
TEST(DeployPrediction, FollowsTheFilesReduceDtype) {
  const ClusterSpec fp32 = load_cluster_file(kRecipe.string());
  ClusterSpec spec = fp32;
  spec.run.dist.reduce_dtype = "bf16";
  const ClusterPrediction a = predict_cluster(fp32), cp = predict_cluster(spec);
  ASSERT_TRUE(cp.skipped.empty()) << cp.skipped;
  EXPECT_EQ(cp.reduce_dtype_bytes, 2);
  EXPECT_EQ(cp.expected().in.reduce_dtype_bytes, 2);
  EXPECT_EQ(cp.fallback().in.reduce_dtype_bytes, 2);
  EXPECT_NEAR(cp.expected().p.inter_node_bytes_per_node / 1e9, 7.70, 0.005);
  EXPECT_DOUBLE_EQ(cp.expected().p.step_s, a.expected_bf16.p.step_s);
  EXPECT_DOUBLE_EQ(cp.expected_fp32.p.step_s, a.expected().p.step_s);
  for (const ClusterPrediction::Scaling& r : cp.scaling) {
    EXPECT_EQ(r.full_shard.in.reduce_dtype_bytes, 2) << r.nodes;
    EXPECT_EQ(r.hsdp.in.reduce_dtype_bytes, 2) << r.nodes;
  }
  EXPECT_LT(cp.scaling[1].full_shard.p.step_s, a.scaling[1].full_shard.p.step_s);
  const std::string text = prediction_text(spec, cp);
  for (const char* part : {"gradients reduce-scattered in bf16 (dist.reduce_dtype",
                           "with fp32 gradients (dist.reduce_dtype = \"fp32\"; not this run's)",
                           "with fp32 gradients that would need 43.0 Gbit/s", "scaling over EFA, bf16 gradients"})
    EXPECT_TRUE(has(text, part)) << part << "\n" << text;
  EXPECT_FALSE(has(text, "reduce-scattered in fp32")) << text;
  const nlohmann::json j = prediction_json(cp);
  EXPECT_EQ(j["reduce_dtype"], "bf16");
  EXPECT_EQ(j["efa"]["reduce_dtype"], "bf16");
  EXPECT_DOUBLE_EQ(j["efa_over_tcp"].get<double>(), j["efa_over_tcp_bf16_reduce"].get<double>());
}

TEST(DeployPrediction, WithoutEfaOnlyTcp) {
  ClusterSpec spec = load_cluster_file(kRecipe.string());
  spec.gpu.efa = false;
  const ClusterPrediction cp = predict_cluster(spec);
  EXPECT_EQ(cp.efa.gbps, 0);
  EXPECT_DOUBLE_EQ(cp.expected().p.step_s, cp.fallback().p.step_s);
  const std::string text = prediction_text(spec, cp);
  EXPECT_FALSE(has(text, "assumed EFA")) << text;
  EXPECT_FALSE(has(text, "EFA / TCP")) << text;
  EXPECT_TRUE(has(text, "scaling over TCP sockets")) << text;
  const nlohmann::json j = prediction_json(cp);
  EXPECT_EQ(j["expected_fabric"], "tcp");
  EXPECT_FALSE(j.contains("efa"));
}

// FP8 on the recipe's L4s: the compute of a step shrinks by the FP8 layers' share, and
// the wire by the MLP's weights gathered as one-byte codes (dist.fp8_gather): over EFA
// the link bounds the step, so that is what shortens it. Without the codes the wire is
// bf16's and the step stays where it was.
TEST(DeployPrediction, Fp8ShortensTheComputeAndTheGathers) {
  const ClusterSpec bf16 = load_cluster_file(kRecipe.string());
  ClusterSpec spec = bf16;
  spec.run.train.matmul_dtype = "fp8";
  const ClusterPrediction a = predict_cluster(bf16), cp = predict_cluster(spec);
  ASSERT_TRUE(cp.skipped.empty()) << cp.skipped;
  EXPECT_NEAR(cp.compute.fp8_share, 0.7085, 0.0001);
  EXPECT_NEAR(cp.expected().p.compute_s, a.expected().p.compute_s * fp8_compute_factor(cp.compute.fp8_share), 1e-9);
  EXPECT_NEAR(cp.expected().p.compute_s, 1.163, 0.001);
  // Each block's gather (twice a step, forward and backward) through the ring of 8: in
  // bf16 the busiest rank sends 7 slices of 5,849,728 elements; with the codes every part
  // but the smallest: the block's 5,510,144 elements before the MLP in bf16 and its
  // 41,287,680 MLP elements as bytes, less one rank's slice of codes (the first rank's
  // part, the largest, holds all the bf16 and 339,584 codes); and the FP8 weights'
  // scales (2 floats a block) and delayed scaling's amax (8) are all-reduced.
  const double slice = 5849728, head = 5510144, mlp = 3.0 * 1536 * 8960;
  EXPECT_DOUBLE_EQ(a.expected().p.inter_node_bytes_per_node - cp.expected().p.inter_node_bytes_per_node,
                   28 * 2 * (7 * 2 * slice - (2 * head + mlp - slice)) - 2 * 7 / 8.0 * 28 * (2 + 8) * 4);
  EXPECT_NEAR(cp.expected().p.step_s / a.expected().p.step_s,
              cp.expected().p.inter_node_bytes_per_node / a.expected().p.inter_node_bytes_per_node, 0.01);  // link-bound
  ClusterSpec cast = spec;
  cast.run.dist.fp8_gather = false;
  const ClusterPrediction c = predict_cluster(cast);
  // bf16's bytes, and delayed scaling's amax all-reduce (8 floats a block over the ring of 8)
  EXPECT_EQ(c.expected().p.inter_node_bytes_per_node - a.expected().p.inter_node_bytes_per_node, 2 * 7 / 8.0 * 28 * 8 * 4);
  EXPECT_NEAR(c.expected().p.step_s, a.expected().p.step_s, 0.01);  // link-bound either way
  EXPECT_LT(cp.scaling[0].full_shard.p.step_s, a.scaling[0].full_shard.p.step_s);  // one node: compute-bound
  const std::string text = prediction_text(spec, cp);
  EXPECT_TRUE(has(text, "x 45% MFU, the FP8 layers' 70.9% of the FLOPs 1.423x faster (train.matmul_dtype = \"fp8\"; "
                        "calibrated on a measured H100 step, docs/scaleout.md): compute 1.163 s per step"))
      << text;
  const nlohmann::json j = prediction_json(cp);
  EXPECT_EQ(j["matmul_dtype"], "fp8");
  EXPECT_NEAR(j["fp8_flop_share"].get<double>(), 0.7085, 0.0001);
  EXPECT_EQ(j["efa"]["matmul_dtype"], "fp8");
  EXPECT_EQ(prediction_json(a)["matmul_dtype"], "bf16");
}

TEST(DeployPrediction, SaysWhyWhenTheGpuIsUnknown) {
  ClusterSpec spec = load_cluster_file(kRecipe.string());
  spec.gpu.facts = find_instance("m7i.xlarge");
  const ClusterPrediction cp = predict_cluster(spec);
  EXPECT_TRUE(has(cp.skipped, "no dense bf16 peak for a CPU instance")) << cp.skipped;
  EXPECT_TRUE(has(prediction_text(spec, cp), "  none: no dense bf16 peak")) << prediction_text(spec, cp);
  EXPECT_TRUE(prediction_json(cp).contains("skipped"));
}

TEST(DeployPrediction, PlanPrintsItWritesItAndPutsItInTheJson) {
  using testing::run_shell;
  const fs::path out = testing::temp_dir("prediction") / "out";
  const std::string cmd = std::string(SHARDTRAIN_BINARY) + " deploy plan --cluster " + kRecipe.string() + " --out " +
                          out.string();
  auto r = run_shell(cmd);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string written = testing::read_file(out / "prediction.txt");
  EXPECT_TRUE(has(written, "predicted step (the step-time model")) << written;
  EXPECT_TRUE(has(r.out, "\n" + written)) << r.out;  // the same section, at the end of the plan
  r = run_shell(cmd + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["prediction"]["efa"]["step_s"].get<double>(), 0);
  EXPECT_GT(j["prediction"]["tcp"]["step_s"].get<double>(), j["prediction"]["efa"]["step_s"].get<double>());
}

}  // namespace
}  // namespace st

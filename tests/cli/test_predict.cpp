// `shardtrain predict` end to end: the run config options as train takes them, the
// cluster options, the JSON a bench reads, the table, and refusals with exit 2.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "stepmodel/gpu_peaks.h"
#include "support/shell.h"

namespace st {
namespace {

using testing::run_shell;

const std::string kBin = SHARDTRAIN_BINARY;
const std::string kRecipe = std::string(SHARDTRAIN_SOURCE_DIR) + "/configs/qwen2.5-1.5b.toml";
// The scale-out review's emulated run: 2 nodes x 1 CPU rank.
const std::string kEmulated =
    " --model.layers=4 --model.hidden_size=256 --model.intermediate_size=768 --model.heads=4 --model.kv_heads=2"
    " --train.seq_len=64 --train.micro_batch=2 --data.source=random --nodes 2";

nlohmann::json predict_json(const std::string& args) {
  const auto r = run_shell(kBin + " predict --json" + args);
  EXPECT_EQ(r.code, 0) << r.out;
  return r.code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
}

TEST(PredictCli, TheEmulatedRunOnTheCpu) {
  // The CPU defaults: fp32 on the wire, overlapped by Gloo's comm thread.
  EXPECT_EQ(predict_json(kEmulated + " --inter-gbps 1 --compute-s 0.4")["schedule"], "prefetch");
  // Without the comm thread nothing overlaps.
  const auto j = predict_json(kEmulated + " --inter-gbps 1 --compute-s 0.4 --dist.overlap=false");
  EXPECT_EQ(j["gather_dtype"], "fp32");
  EXPECT_EQ(j["reduce_dtype"], "fp32");
  EXPECT_EQ(j["schedule"], "none");
  EXPECT_EQ(j["compute_source"], "given");
  EXPECT_EQ(j["world"], 2);
  EXPECT_EQ(j["params"], 3215616);
  EXPECT_EQ(j["tokens_per_rank"], 128);
  EXPECT_NEAR(j["inter_node_bytes_per_node"].get<double>(), 19162136, 1e-6);
  EXPECT_NEAR(j["step_s"].get<double>(), 0.4 + 19162136 * 8 / 1e9, 1e-9);
  EXPECT_DOUBLE_EQ(j["exposed_comm_s"].get<double>(), j["comm_s"].get<double>());
  EXPECT_EQ(j["bytes_per_rank"]["all_gather"]["intra"], 0);
  EXPECT_NEAR(j["bytes_per_rank"]["all_gather"]["inter"].get<double>(), 12730880, 1e-6);
  // HSDP over 2 x 2 with shard groups of a node: only the all-reduce crosses.
  const auto h = predict_json(kEmulated + " --ranks-per-node 2 --dist.shard_group_size=2 --inter-gbps 1 "
                                          "--intra-gbps 10 --compute-s 0.4 --schedule prefetch");
  EXPECT_EQ(h["strategy"], "hsdp");
  EXPECT_EQ(h["replicas"], 2);
  EXPECT_EQ(h["schedule"], "prefetch");
  EXPECT_EQ(h["bytes_per_rank"]["reduce_scatter"]["inter"], 0);
  EXPECT_GT(h["bytes_per_rank"]["all_reduce"]["inter"].get<double>(), 0);
}

TEST(PredictCli, TheRecipeFromItsConfigAndAGpu) {
  const std::string cluster = " --config " + kRecipe + " --nodes 2 --ranks-per-node 4 --gpu L4 --mfu 0.45 "
                              "--inter-gbps 32 --intra-gbps 100";
  const auto j = predict_json(cluster);
  EXPECT_EQ(j["gather_dtype"], "bf16");  // train.device = cuda
  EXPECT_EQ(j["schedule"], "prefetch");
  EXPECT_EQ(j["gpu"], "L4");
  EXPECT_EQ(j["gpu_bf16_tflops"], 121);
  EXPECT_NEAR(j["compute_s"].get<double>(), 1.473, 0.001);
  EXPECT_NEAR(j["inter_node_bytes_per_node"].get<double>() / 1e9, 10.40, 0.005);
  const auto bf16 = predict_json(cluster + " --reduce-dtype bf16");
  EXPECT_NEAR(bf16["inter_node_bytes_per_node"].get<double>() / 1e9, 7.70, 0.005);
  EXPECT_NEAR(bf16["steps_per_s"].get<double>(), 0.5173, 0.01);  // the recipe's EFA figure
  // The run config's dist.reduce_dtype is the default; --reduce-dtype wins over it.
  const auto from_config = predict_json(cluster + " --dist.reduce_dtype=bf16");
  EXPECT_EQ(from_config["reduce_dtype"], "bf16");
  EXPECT_EQ(from_config["inter_node_bytes_per_node"], bf16["inter_node_bytes_per_node"]);
  EXPECT_EQ(predict_json(cluster + " --dist.reduce_dtype=bf16 --reduce-dtype fp32")["inter_node_bytes_per_node"],
            j["inter_node_bytes_per_node"]);
  // A run config key on the command line, as train takes it.
  const auto half = predict_json(cluster + " --train.micro_batch=2");
  EXPECT_EQ(half["tokens_per_rank"], 4096);
}

// FP8: the FP8 layers' share of the FLOPs runs kFp8LayerSpeedup faster; a GPU without
// FP8 tensor cores is refused, as the trainer would refuse it.
TEST(PredictCli, Fp8ShortensTheComputeOnGpusThatHaveIt) {
  const std::string cluster = " --config " + kRecipe + " --nodes 2 --ranks-per-node 4 --mfu 0.45 "
                              "--inter-gbps 32 --intra-gbps 100 --gpu ";
  const auto bf16 = predict_json(cluster + "H100");
  const auto fp8 = predict_json(cluster + "H100 --train.matmul_dtype=fp8");
  EXPECT_EQ(bf16["matmul_dtype"], "bf16");
  EXPECT_EQ(bf16["fp8_flop_share"], 0);
  EXPECT_EQ(fp8["matmul_dtype"], "fp8");
  EXPECT_NEAR(fp8["fp8_flop_share"].get<double>(), 0.7085, 0.0001);  // the MLP's, by default
  EXPECT_EQ(fp8["fp8_layer_speedup"], kFp8LayerSpeedup);
  EXPECT_NEAR(fp8["compute_s"].get<double>() / bf16["compute_s"].get<double>(), 1 / 1.2671, 0.0005);
  // The bytes on the wire: the MLP's weights gathered as one-byte codes (dist.fp8_gather)
  // instead of bf16. Twice a step per block, the busiest rank of the ring of 8 sends 7
  // slices of 5,849,728 bf16 elements without them, and with them every part but the
  // smallest (a slice of codes): 5,510,144 elements before the MLP in bf16 and
  // 3 x 1536 x 8960 codes; the FP8 weights' scales and delayed scaling's amax (2 + 8
  // floats a block) are all-reduced. Without the gather the same as bf16.
  const double saved = bf16["inter_node_bytes_per_node"].get<double>() - fp8["inter_node_bytes_per_node"].get<double>();
  const double slice = 5849728, head = 5510144, mlp = 3.0 * 1536 * 8960;
  EXPECT_DOUBLE_EQ(saved, 28 * 2 * (7 * 2 * slice - (2 * head + mlp - slice)) - 2 * 7 / 8.0 * 28 * (2 + 8) * 4);
  EXPECT_EQ(fp8["fp8_gather_numel_per_block"], 3 * 1536 * 8960);
  // (beside delayed scaling's amax all-reduce, 8 floats a block: 1,568 bytes here)
  EXPECT_EQ(predict_json(cluster + "H100 --train.matmul_dtype=fp8 --dist.fp8_gather=false")["inter_node_bytes_per_node"]
                    .get<double>() - bf16["inter_node_bytes_per_node"].get<double>(),
            2 * 7 / 8.0 * 28 * 8 * 4);
  // Given seconds are taken as they are.
  EXPECT_EQ(predict_json(kEmulated + " --inter-gbps 1 --compute-s 0.4 --train.matmul_dtype=fp8")["compute_s"], 0.4);
  const auto table = run_shell(kBin + " predict" + cluster + "L4 --train.matmul_dtype=fp8");
  ASSERT_EQ(table.code, 0) << table.out;
  EXPECT_NE(table.out.find("the FP8 layers' 70.9% of the FLOPs 1.423x faster: x 0.789"), std::string::npos)
      << table.out;
  for (const char* gpu : {"A100", "A10G"}) {
    const auto r = run_shell(kBin + " predict" + cluster + gpu + " --train.matmul_dtype=fp8");
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find(std::string("train.matmul_dtype = \"fp8\" with --gpu ") + gpu + ": the " + gpu +
                         " has compute capability 8."),
              std::string::npos)
        << r.out;
  }
}

TEST(PredictCli, PrintsATable) {
  const auto r = run_shell(kBin + " predict" + kEmulated + " --inter-gbps 0.2 --compute-s 0.4 --dist.overlap=false");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* part : {"2 nodes x 1 = 2, full shard over 2", "gradients reduced in fp32", "schedule:  none",
                           "all_gather", "reduce_scatter", "one node's network link: 19.162 MB each way"})
    EXPECT_NE(r.out.find(part), std::string::npos) << part << "\n" << r.out;
}

TEST(PredictCli, RefusesWithUsageErrors) {
  struct Case {
    std::string args, says;
  };
  const std::vector<Case> cases = {
      {kEmulated + " --inter-gbps 1", "--compute-s SECONDS, or --gpu NAME"},
      {kEmulated + " --inter-gbps 1 --gpu T4", "--gpu T4: not in the table (L4, A10G, L40S, A100, H100, H200)"},
      {kEmulated + " --compute-s 1", "crosses nodes: an inter-node bandwidth is needed"},
      {kEmulated + " --ranks-per-node 2 --inter-gbps 1 --compute-s 1", "an intra-node bandwidth is needed"},
      {kEmulated + " --dist.shard_group_size=3 --inter-gbps 1 --compute-s 1", "does not divide the world of 2"},
      {kEmulated + " --inter-gbps 1 --compute-s 1 --gpu L4", "excludes"},
      {kEmulated + " --inter-gbps 1 --compute-s 1 --schedule max", "--schedule"},
      {kEmulated + " --inter-gbps nan --compute-s 1", "finite"},
  };
  for (const Case& c : cases) {
    const auto r = run_shell(kBin + " predict" + c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.says << "\n" << r.out;
  }
}

}  // namespace
}  // namespace st

// What `deploy plan` predicts for a cluster file, from the step-time model
// (stepmodel/step_model.h): the step time and tokens/s of the file's run on its GPU
// nodes over the expected fabric (EFA where the node group has it) and over the TCP
// fallback, their ratio beside the recipe's measured one, the same with the other
// gradient dtype (dist.reduce_dtype fp32 or bf16), a scaling table over 1, 2, 4 and 8 nodes, and HSDP against full shard.
// Every assumption (link rates as shares of the instance's network bandwidth, the
// GPU's peak and MFU, latencies) is a named constant with its source, printed with
// the numbers; docs/scaleout.md explains them and the gap to the recipe.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "deploy/cluster_file.h"
#include "stepmodel/prediction_json.h"
#include "stepmodel/step_model.h"

namespace st {

// A link as the prediction assumes it: a share of a line rate, and a latency.
struct LinkAssumption {
  std::string name;       // "EFA", "TCP sockets", "intra-node"
  double gbps = 0;        // what collectives achieve, each way
  double line_gbps = 0;   // the rate it is a share of (0: none: an assumed rate)
  double latency_us = 0;
  std::string source;     // where the share comes from
};

struct PredictedRun {
  StepModelInput in;
  StepPrediction p;
};

struct ClusterPrediction {
  std::string skipped;                 // non-empty: why there is no prediction (the GPU is not in the table)
  ComputeBasis compute;                // the GPU's peak and the MFU assumed
  std::string gpu_source;              // where the peak comes from
  LinkAssumption efa, tcp, intra;      // efa.gbps == 0: the node group has no EFA
  int reduce_dtype_bytes = 4;          // the file's dist.reduce_dtype: 4 (fp32) or 2 (bf16)
  PredictedRun expected_fp32, fallback_fp32;  // over EFA (or TCP without EFA), and over TCP; gradients reduced in fp32
  PredictedRun expected_bf16, fallback_bf16;  // the same with gradients reduced in bf16
  // The file's run (its dist.reduce_dtype) over EFA (or TCP without EFA), and over TCP.
  const PredictedRun& expected() const { return reduce_dtype_bytes == 2 ? expected_bf16 : expected_fp32; }
  const PredictedRun& fallback() const { return reduce_dtype_bytes == 2 ? fallback_bf16 : fallback_fp32; }
  struct Scaling {
    int nodes = 0;
    PredictedRun full_shard, hsdp;     // hsdp: shard groups of one node, replicated across nodes
  };
  std::vector<Scaling> scaling;        // 1, 2, 4, 8 nodes over the expected fabric, the file's reduce dtype
};

// The recipe's measured steps/s (EFA, TCP) that the ratio is printed beside.
inline constexpr double kRecipeEfaStepsPerS = 0.5173, kRecipeTcpStepsPerS = 0.2513;

ClusterPrediction predict_cluster(const ClusterSpec& spec);

// The section `deploy plan` prints (and writes to prediction.txt), lines ending "\n".
std::string prediction_text(const ClusterSpec& spec, const ClusterPrediction& cp);
nlohmann::json prediction_json(const ClusterPrediction& cp);

}  // namespace st

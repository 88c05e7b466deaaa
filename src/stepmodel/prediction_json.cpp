#include "stepmodel/prediction_json.h"

#include <nlohmann/json.hpp>

#include "stepmodel/gpu_peaks.h"

namespace st {

const char* wire_dtype_name(int bytes) { return bytes == 2 ? "bf16" : "fp32"; }

nlohmann::json step_prediction_json(const StepModelInput& in, const StepPrediction& p, const ComputeBasis& basis) {
  auto bytes = [](const WireBytes& b) { return nlohmann::json{{"intra", b.intra}, {"inter", b.inter}}; };
  return {
      {"model", in.model.source},
      {"params", in.model.num_params()},
      {"flops_per_token", step_flops_per_token(in.model, in.seq_len)},
      {"nodes", in.nodes},
      {"ranks_per_node", in.ranks_per_node},
      {"world", in.world()},
      {"strategy", in.hsdp() ? "hsdp" : "full_shard"},
      {"shard_group_size", in.shard_group()},
      {"replicas", in.replicas()},
      {"micro_batch", in.micro_batch},
      {"seq_len", in.seq_len},
      {"grad_accum", in.grad_accum},
      {"tokens_per_rank", in.tokens_per_rank()},
      {"gather_dtype", wire_dtype_name(in.gather_dtype_bytes)},
      {"fp8_gather_numel_per_block", in.fp8_gather_numel},
      {"reduce_dtype", wire_dtype_name(in.reduce_dtype_bytes)},
      {"reshard_after_forward", in.reshard_after_forward},
      {"schedule", schedule_name(in.schedule)},
      {"intra_gbps", in.intra.gbps},
      {"intra_latency_us", in.intra.latency_us},
      {"inter_gbps", in.inter.gbps},
      {"inter_latency_us", in.inter.latency_us},
      {"compute_source", basis.source},
      {"gpu", basis.gpu},
      {"gpu_bf16_tflops", basis.peak_tflops},
      {"mfu", basis.mfu},
      {"matmul_dtype", basis.matmul_dtype},
      {"fp8_flop_share", basis.fp8_share},
      {"fp8_layer_speedup", kFp8LayerSpeedup},
      {"host_net_ns_per_byte", in.host_net_s_per_byte * 1e9},
      {"host_cores_per_node", in.host_cores_per_node > 0 ? in.host_cores_per_node : in.ranks_per_node},
      {"host_net_s", p.host_net_s},
      {"compute_s", p.compute_s},
      {"comm_s", p.comm_s},
      {"comm_inter_s", p.comm_inter_s},
      {"exposed_comm_s", p.exposed_comm_s},
      {"step_s", p.step_s},
      {"steps_per_s", p.steps_per_s},
      {"tokens_per_s_per_rank", p.tokens_per_s_per_rank},
      {"tokens_per_s_cluster", p.tokens_per_s_cluster},
      {"bytes_per_rank",
       {{"all_gather", bytes(p.all_gather)}, {"reduce_scatter", bytes(p.reduce_scatter)},
        {"all_reduce", bytes(p.all_reduce)}}},
      {"comm_s_by_kind",
       {{"all_gather", p.comm_s_all_gather}, {"reduce_scatter", p.comm_s_reduce_scatter},
        {"all_reduce", p.comm_s_all_reduce}}},
      {"inter_node_bytes_per_node", p.inter_node_bytes_per_node},
      {"collectives_per_step", p.collectives_per_step},
  };
}

}  // namespace st

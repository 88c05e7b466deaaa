// The graph-building half of cuDNN fused attention (attention_cudnn.h), shared with
// its plan cache and execution in attention_cudnn.cpp: the descriptors one graph owns,
// the cached plan, and the builders of the forward and backward graphs. Building
// failures throw BuildFailure, which the cache turns into `false` and why_not().
#pragma once
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace st::cuda::sdpa {

// "what: CUDNN_STATUS_... (code): message; cuDNN last error: ..."
std::string status_text(cudnnStatus_t s, const std::string& what);

// A plan that cannot be built: caught by the plan cache and turned into `false`.
struct BuildFailure {
  std::string what;
};

// Owns every descriptor of one graph and its plan, destroyed together.
class Descs {
 public:
  Descs() = default;
  Descs(const Descs&) = delete;
  Descs& operator=(const Descs&) = delete;
  ~Descs();

  // Each throws BuildFailure naming the call, the descriptor's kind and its label.
  cudnnBackendDescriptor_t create(cudnnBackendDescriptorType_t t, std::string label);
  const std::string& label(cudnnBackendDescriptor_t d) { return labels_[d]; }
  void set(cudnnBackendDescriptor_t d, const char* attr_name, cudnnBackendAttributeName_t attr,
           cudnnBackendAttributeType_t type, int64_t n, const void* value);
  void finalize(cudnnBackendDescriptor_t d);

 private:
  std::vector<std::pair<cudnnBackendDescriptor_t, std::string>> owned_;
  std::unordered_map<cudnnBackendDescriptor_t, std::string> labels_;
};

#define ST_SET(descs, d, attr, type, n, value) (descs).set((d), #attr, (attr), (type), (n), (value))

// Tensor uids of the non-virtual tensors (the variant pack's keys).
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf,  // forward and backward
  kdO, kdQ, kdK, kdV, kOne, kSoftmaxSum, kdQAccum  // backward only
};

// One cached graph + plan for one (direction, shape, determinism).
struct Plan {
  cudnnHandle_t handle = nullptr;  // the handle it was built with, and runs with
  Descs descs;
  cudnnBackendDescriptor_t plan = nullptr;
  bool ok = false;
  std::string failure;  // when !ok
  std::string info;     // engine, notes, workspace
  int64_t cudnn_workspace = 0;
  // Backward's own fp32 workspace tensors, placed after cuDNN's part of the buffer.
  size_t softmax_sum_offset = 0, dq_accum_offset = 0, dq_accum_bytes = 0;
  size_t total_workspace = 0;
};

// The operation graph of one direction and shape, its descriptors owned by p.descs
// (forward: O and stats; backward: dQ, dK, dV, with a dQ_accum tensor unless `det`).
cudnnBackendDescriptor_t forward_graph(Plan& p, int B, int T, int H, int KV, int hd);
cudnnBackendDescriptor_t backward_graph(Plan& p, int B, int T, int H, int KV, int hd, bool det);

// Heuristics -> the first engine config whose plan finalizes (and that is not
// marked non-deterministic when `det`): p.plan, p.cudnn_workspace and p.info.
void choose_plan(Plan& p, cudnnBackendDescriptor_t graph, bool det);

}  // namespace st::cuda::sdpa

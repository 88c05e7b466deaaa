// cuDNN fused flash attention: building the graphs and choosing their plans
// (attention_cudnn_graph.h); the cache and the execution are in attention_cudnn.cpp.
//
// The graphs are the ones cuDNN documents as its "fused flash attention" patterns (and
// that cudnn-frontend's sdpa / sdpa_backward nodes lower to on cuDNN < 9.21, where the
// causal mask is still a composite of pointwise ops):
//
// forward   S  = matmul(Q, Kᵀ) · scale                  (Kᵀ: K's view with dims/strides of
//           S  = select(row >= col, S, -inf)             its last two axes swapped)
//           m  = max_row(S); E = exp(S - m); l = Σ_row E
//           stats = m + log(l)            -> lse (fp32, B H T 1)
//           P  = E / l (bf16);  O = matmul(P, V)
// backward  D  = Σ_d (dO ⊙ O) · 1        -> fp32 workspace tensor (non-virtual)
//           P  = exp(select(row >= col, matmul(Q, Kᵀ) · scale - stats, -inf))
//           dV = Σ_group matmul(reshape(P)ᵀ, dO)
//           dS = (matmul(dO, Vᵀ) - D) ⊙ P · scale
//           dK = Σ_group matmul(reshape(dS)ᵀ, Q)
//           dQ = matmul(dS, reshape(Kᵀ))   (deterministic: straight into dQ, the engine
//                keeps dP in its workspace; otherwise into an fp32 workspace tensor
//                dQ_accum by atomics, then identity -> dQ)
// "Σ_group" is a reduction from H to KV heads (GQA); with H == KV the matmul writes
// dK / dV directly.
#include "backend/cuda/attention_cudnn_graph.h"

#include <array>
#include <sstream>
#include <string>
#include <vector>

namespace st::cuda::sdpa {
namespace {

// The handle attributes of the operation graph and the execution plan are marked
// deprecated in cuDNN 9 but are still how a graph is tied to a handle (cudnn-frontend
// sets them too); name them once with the warning silenced.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
constexpr cudnnBackendAttributeName_t kOpGraphHandle = CUDNN_ATTR_OPERATIONGRAPH_HANDLE;
constexpr cudnnBackendAttributeName_t kPlanHandle = CUDNN_ATTR_EXECUTION_PLAN_HANDLE;
#pragma GCC diagnostic pop

const char* desc_kind(cudnnBackendDescriptorType_t t) {
  switch (t) {
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: return "POINTWISE";
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR: return "ENGINE";
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: return "ENGINECFG";
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: return "ENGINEHEUR";
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: return "EXECUTION_PLAN";
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: return "OPERATION_POINTWISE";
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: return "OPERATIONGRAPH";
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: return "VARIANT_PACK";
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: return "TENSOR";
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR: return "MATMUL";
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: return "OPERATION_MATMUL";
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR: return "REDUCTION";
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: return "OPERATION_REDUCTION";
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: return "OPERATION_RESHAPE";
    default: return "descriptor";
  }
}

std::string last_error_string() {
  char buf[4096];
  buf[0] = 0;
  cudnnGetLastErrorString(buf, sizeof buf);
  return buf;
}

void build_check(cudnnStatus_t s, const std::string& what) {
  if (s != CUDNN_STATUS_SUCCESS) throw BuildFailure{status_text(s, what)};
}

using Dims = std::array<int64_t, 4>;

// Builds one operation graph: tensors, operations, in the order they are added.
class GraphBuilder {
 public:
  explicit GraphBuilder(Descs& d) : d_(d) {}

  cudnnBackendDescriptor_t tensor(const char* name, int64_t uid, cudnnDataType_t dt, Dims dim, Dims stride,
                                  bool is_virtual, bool by_value = false) {
    auto t = d_.create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, std::string(name) + " uid " + std::to_string(uid));
    const int64_t align = 16;
    const bool virt = is_virtual, byval = by_value;
    ST_SET(d_, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    ST_SET(d_, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim.data());
    ST_SET(d_, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride.data());
    ST_SET(d_, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    ST_SET(d_, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    ST_SET(d_, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    if (by_value) ST_SET(d_, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byval);
    d_.finalize(t);
    return t;
  }
  // A virtual tensor with a fresh uid.
  cudnnBackendDescriptor_t virt(const char* name, cudnnDataType_t dt, Dims dim, Dims stride) {
    return tensor(name, next_virtual_uid_++, dt, dim, stride, true);
  }
  // A scalar passed by value (host float in the variant pack).
  cudnnBackendDescriptor_t scalar(const char* name, int64_t uid) {
    return tensor(name, uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  // y = mode(x, b, t); b and t may be null. axis >= 0 for GEN_INDEX.
  void pointwise(const char* name, cudnnPointwiseMode_t mode, cudnnDataType_t prec, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                 int64_t axis = -1) {
    auto pw = d_.create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, name);
    ST_SET(d_, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    ST_SET(d_, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) ST_SET(d_, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    d_.finalize(pw);
    auto op = d_.create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, name);
    ST_SET(d_, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
    ST_SET(d_, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b) ST_SET(d_, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    if (t) ST_SET(d_, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
    ST_SET(d_, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    d_.finalize(op);
    ops_.push_back(op);
  }
  void unary(const char* name, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    pointwise(name, mode, CUDNN_DATA_FLOAT, x, nullptr, nullptr, y);
  }
  void binary(const char* name, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
              cudnnBackendDescriptor_t y) {
    pointwise(name, mode, CUDNN_DATA_FLOAT, x, b, nullptr, y);
  }

  // c = a · b (batched over the first two axes; b's head axis may be smaller: GQA).
  void matmul(const char* name, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    auto mm = d_.create(CUDNN_BACKEND_MATMUL_DESCRIPTOR, name);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    ST_SET(d_, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    d_.finalize(mm);
    auto op = d_.create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, name);
    ST_SET(d_, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    ST_SET(d_, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    ST_SET(d_, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    ST_SET(d_, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm);
    d_.finalize(op);
    ops_.push_back(op);
  }

  // y = reduce(x) over the axes where y is smaller (a row for (…, 1), a head group).
  void reduction(const char* name, cudnnReduceTensorOp_t red, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t y) {
    auto rd = d_.create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, name);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    ST_SET(d_, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &red);
    ST_SET(d_, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    d_.finalize(rd);
    auto op = d_.create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, name);
    ST_SET(d_, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    ST_SET(d_, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    ST_SET(d_, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd);
    d_.finalize(op);
    ops_.push_back(op);
  }

  // y = x viewed with other dims/strides (a transpose here).
  void reshape(const char* name, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    auto op = d_.create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, name);
    ST_SET(d_, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    ST_SET(d_, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    d_.finalize(op);
    ops_.push_back(op);
  }

  // S = select(row >= col, S, neg_inf): the top-left-aligned causal mask.
  cudnnBackendDescriptor_t causal_mask(cudnnBackendDescriptor_t s, cudnnBackendDescriptor_t neg_inf, Dims dim,
                                       Dims stride) {
    auto row = virt("row_index", CUDNN_DATA_INT32, dim, stride);
    auto col = virt("col_index", CUDNN_DATA_INT32, dim, stride);
    auto keep = virt("row_ge_col", CUDNN_DATA_BOOLEAN, dim, stride);
    auto out = virt("masked_scores", CUDNN_DATA_FLOAT, dim, stride);
    pointwise("gen_row_index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s, nullptr, nullptr, row, 2);
    pointwise("gen_col_index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s, nullptr, nullptr, col, 3);
    pointwise("row_ge_col", CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, nullptr, keep);
    pointwise("causal_select", CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, neg_inf, keep, out);
    return out;
  }

  cudnnBackendDescriptor_t finalize_graph(cudnnHandle_t handle) {
    auto g = d_.create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "sdpa graph");
    d_.set(g, "CUDNN_ATTR_OPERATIONGRAPH_HANDLE", kOpGraphHandle, CUDNN_TYPE_HANDLE, 1, &handle);
    ST_SET(d_, g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops_.size()), ops_.data());
    d_.finalize(g);
    return g;
  }

 private:
  Descs& d_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_uid_ = 1000;
};

const char* numerical_note_name(int n) {
  switch (n) {
    case CUDNN_NUMERICAL_NOTE_TENSOR_CORE: return "TENSOR_CORE";
    case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS: return "DOWN_CONVERT_INPUTS";
    case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION: return "REDUCED_PRECISION_REDUCTION";
    case CUDNN_NUMERICAL_NOTE_FFT: return "FFT";
    case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC: return "NONDETERMINISTIC";
    case CUDNN_NUMERICAL_NOTE_STRICT_NAN_PROP: return "STRICT_NAN_PROP";
    default: return "WINOGRAD*";
  }
}
const char* behavior_note_name(int n) {
  switch (n) {
    case CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION: return "RUNTIME_COMPILATION";
    case CUDNN_BEHAVIOR_NOTE_REQUIRES_FILTER_INT8x32_REORDER: return "REQUIRES_FILTER_INT8x32_REORDER";
    case CUDNN_BEHAVIOR_NOTE_REQUIRES_BIAS_INT8x32_REORDER: return "REQUIRES_BIAS_INT8x32_REORDER";
    case CUDNN_BEHAVIOR_NOTE_SUPPORTS_CUDA_GRAPH_NATIVE_API: return "SUPPORTS_CUDA_GRAPH_NATIVE_API";
    case CUDNN_BEHAVIOR_NOTE_CUBLASLT_DEPENDENCY: return "CUBLASLT_DEPENDENCY";
    default: return "?";
  }
}

}  // namespace

// "what: CUDNN_STATUS_... (code): message; cuDNN last error: ..."
std::string status_text(cudnnStatus_t s, const std::string& what) {
  std::ostringstream os;
  os << what << ": " << cudnnGetErrorString(s) << " (" << int(s) << ")";
  const std::string last = last_error_string();
  if (!last.empty()) os << "; cuDNN says: " << last;
  return os.str();
}

Descs::~Descs() {
  for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) cudnnBackendDestroyDescriptor(it->first);
}

cudnnBackendDescriptor_t Descs::create(cudnnBackendDescriptorType_t t, std::string label) {
  cudnnBackendDescriptor_t d = nullptr;
  build_check(cudnnBackendCreateDescriptor(t, &d), std::string("cudnnBackendCreateDescriptor(") + desc_kind(t) +
                                                       ") for " + label);
  owned_.emplace_back(d, std::string(desc_kind(t)) + " '" + label + "'");
  labels_[d] = owned_.back().second;
  return d;
}

void Descs::set(cudnnBackendDescriptor_t d, const char* attr_name, cudnnBackendAttributeName_t attr,
                cudnnBackendAttributeType_t type, int64_t n, const void* value) {
  build_check(cudnnBackendSetAttribute(d, attr, type, n, value),
              std::string("cudnnBackendSetAttribute(") + attr_name + ") on " + label(d));
}

void Descs::finalize(cudnnBackendDescriptor_t d) {
  build_check(cudnnBackendFinalize(d), "cudnnBackendFinalize of " + label(d));
}

void choose_plan(Plan& p, cudnnBackendDescriptor_t graph, bool det) {
  Descs& d = p.descs;
  std::string tried;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    const char* mode_name = mode == CUDNN_HEUR_MODE_A ? "HEUR_MODE_A" : "HEUR_MODE_FALLBACK";
    auto heur = d.create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, mode_name);
    ST_SET(d, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    ST_SET(d, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    const cudnnStatus_t fs = cudnnBackendFinalize(heur);
    if (fs != CUDNN_STATUS_SUCCESS) {
      tried += "; " + status_text(fs, std::string("cudnnBackendFinalize of ENGINEHEUR ") + mode_name);
      continue;
    }
    int64_t count = 0;
    build_check(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                         &count, nullptr),
                std::string("cudnnBackendGetAttribute(CUDNN_ATTR_ENGINEHEUR_RESULTS count) ") + mode_name);
    if (count <= 0) {
      tried += std::string("; ") + mode_name + ": no engine configs";
      continue;
    }
    std::vector<cudnnBackendDescriptor_t> cfgs;
    for (int64_t i = 0; i < count; i++)
      cfgs.push_back(d.create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, std::string(mode_name) + " cfg " +
                                                                      std::to_string(i)));
    int64_t got = 0;
    build_check(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                         count, &got, cfgs.data()),
                std::string("cudnnBackendGetAttribute(CUDNN_ATTR_ENGINEHEUR_RESULTS) ") + mode_name);
    for (int64_t i = 0; i < got; i++) {
      // The engine behind the config: index and notes.
      auto engine = d.create(CUDNN_BACKEND_ENGINE_DESCRIPTOR, std::string(mode_name) + " engine " +
                                                                  std::to_string(i));
      int64_t n = 0, index = -1;
      std::string notes;
      bool nondeterministic = false;
      if (cudnnBackendGetAttribute(cfgs[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                   &engine) == CUDNN_STATUS_SUCCESS) {
        cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index);
        cudnnBackendNumericalNote_t num[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
        if (cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                     CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, num) == CUDNN_STATUS_SUCCESS)
          for (int64_t k = 0; k < n && k < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; k++) {
            notes += std::string(notes.empty() ? "" : ",") + numerical_note_name(num[k]);
            nondeterministic |= num[k] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
          }
        cudnnBackendBehaviorNote_t beh[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
        if (cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                     CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &n, beh) == CUDNN_STATUS_SUCCESS)
          for (int64_t k = 0; k < n && k < CUDNN_BEHAVIOR_NOTE_TYPE_COUNT; k++)
            notes += std::string(notes.empty() ? "" : ",") + behavior_note_name(beh[k]);
      }
      const std::string name = std::string(mode_name) + " #" + std::to_string(i) + " engine " +
                               std::to_string(index) + " [" + notes + "]";
      if (det && nondeterministic) {
        tried += "; " + name + ": skipped, non-deterministic";
        continue;
      }
      auto plan = d.create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, name);
      d.set(plan, "CUDNN_ATTR_EXECUTION_PLAN_HANDLE", kPlanHandle, CUDNN_TYPE_HANDLE, 1, &p.handle);
      ST_SET(d, plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
      const cudnnStatus_t ps = cudnnBackendFinalize(plan);
      if (ps != CUDNN_STATUS_SUCCESS) {
        tried += "; " + status_text(ps, "cudnnBackendFinalize of EXECUTION_PLAN " + name);
        continue;
      }
      int64_t ws = 0;
      build_check(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                           &n, &ws),
                  "cudnnBackendGetAttribute(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) of " + name);
      p.plan = plan;
      p.cudnn_workspace = ws;
      std::ostringstream info;
      info << name << ", cuDNN workspace " << ws << " B";
      p.info = info.str();
      return;
    }
  }
  throw BuildFailure{"no engine: the heuristics offered no config whose execution plan finalizes" + tried};
}

cudnnBackendDescriptor_t forward_graph(Plan& p, int B, int T, int H, int KV, int hd) {
  GraphBuilder g(p.descs);
  const int64_t W = int64_t(H + 2 * KV) * hd, b = B, t = T, h = H, kv = KV, d = hd;
  const Dims q_dim{b, h, t, d}, q_stride{t * W, d, W, 1};
  const Dims kt_dim{b, kv, d, t}, kt_stride{t * W, d, 1, W};  // Kᵀ: K with its last two axes swapped
  const Dims v_dim{b, kv, t, d}, v_stride{t * W, d, W, 1};
  const Dims o_dim{b, h, t, d}, o_stride{t * h * d, d, h * d, 1};
  const Dims s_dim{b, h, t, t}, s_stride{h * t * t, t * t, t, 1};
  const Dims r_dim{b, h, t, 1}, r_stride{h * t, t, 1, 1};

  auto Q = g.tensor("Q", kQ, CUDNN_DATA_BFLOAT16, q_dim, q_stride, false);
  auto Kt = g.tensor("K^T", kK, CUDNN_DATA_BFLOAT16, kt_dim, kt_stride, false);
  auto V = g.tensor("V", kV, CUDNN_DATA_BFLOAT16, v_dim, v_stride, false);
  auto O = g.tensor("O", kO, CUDNN_DATA_BFLOAT16, o_dim, o_stride, false);
  auto stats = g.tensor("stats", kStats, CUDNN_DATA_FLOAT, r_dim, r_stride, false);
  auto scale = g.scalar("attn_scale", kScale);
  auto neg_inf = g.scalar("neg_inf", kNegInf);

  auto S = g.virt("S", CUDNN_DATA_FLOAT, s_dim, s_stride);
  g.matmul("bmm1 Q.K^T", Q, Kt, S);
  auto S_scaled = g.virt("S_scaled", CUDNN_DATA_FLOAT, s_dim, s_stride);
  g.binary("attn_scale", CUDNN_POINTWISE_MUL, S, scale, S_scaled);
  auto S_masked = g.causal_mask(S_scaled, neg_inf, s_dim, s_stride);
  // softmax with stats = max + log(sum exp(S - max))
  auto mx = g.virt("row_max", CUDNN_DATA_FLOAT, r_dim, r_stride);
  g.reduction("softmax max", CUDNN_REDUCE_TENSOR_MAX, S_masked, mx);
  auto sub = g.virt("S_minus_max", CUDNN_DATA_FLOAT, s_dim, s_stride);
  g.binary("softmax sub", CUDNN_POINTWISE_SUB, S_masked, mx, sub);
  auto ex = g.virt("exp", CUDNN_DATA_FLOAT, s_dim, s_stride);
  g.unary("softmax exp", CUDNN_POINTWISE_EXP, sub, ex);
  auto sum = g.virt("row_sum", CUDNN_DATA_FLOAT, r_dim, r_stride);
  g.reduction("softmax sum", CUDNN_REDUCE_TENSOR_ADD, ex, sum);
  auto lg = g.virt("log_sum", CUDNN_DATA_FLOAT, r_dim, r_stride);
  g.unary("softmax log", CUDNN_POINTWISE_LOG, sum, lg);
  g.binary("softmax stats", CUDNN_POINTWISE_ADD, mx, lg, stats);
  auto P = g.virt("P", CUDNN_DATA_BFLOAT16, s_dim, s_stride);  // bmm2's A operand in the i/o type
  g.binary("softmax div", CUDNN_POINTWISE_DIV, ex, sum, P);
  g.matmul("bmm2 P.V", P, V, O);
  return g.finalize_graph(p.handle);
}

cudnnBackendDescriptor_t backward_graph(Plan& p, int B, int T, int H, int KV, int hd, bool det) {
  GraphBuilder g(p.descs);
  const int64_t W = int64_t(H + 2 * KV) * hd, b = B, t = T, h = H, kv = KV, d = hd;
  const Dims q_dim{b, h, t, d}, q_stride{t * W, d, W, 1};
  const Dims kt_dim{b, kv, d, t}, kt_stride{t * W, d, 1, W};  // Kᵀ and Vᵀ
  const Dims k_dim{b, kv, t, d}, k_stride{t * W, d, W, 1};    // K, dK, dV
  const Dims o_dim{b, h, t, d}, o_stride{t * h * d, d, h * d, 1};
  const Dims s_dim{b, h, t, t}, s_stride{h * t * t, t * t, t, 1};
  const Dims st_dim{b, h, t, t}, st_stride{h * t * t, t * t, 1, t};  // a score matrix transposed
  const Dims r_dim{b, h, t, 1}, r_stride{h * t, t, 1, 1};
  const Dims full_dim{b, h, t, d}, full_stride{h * t * d, t * d, d, 1};  // per-query-head dK/dV, dQ_accum

  auto Q = g.tensor("Q", kQ, CUDNN_DATA_BFLOAT16, q_dim, q_stride, false);
  auto Kt = g.tensor("K^T", kK, CUDNN_DATA_BFLOAT16, kt_dim, kt_stride, false);
  auto Vt = g.tensor("V^T", kV, CUDNN_DATA_BFLOAT16, kt_dim, kt_stride, false);
  auto O = g.tensor("O", kO, CUDNN_DATA_BFLOAT16, o_dim, o_stride, false);
  auto dO = g.tensor("dO", kdO, CUDNN_DATA_BFLOAT16, o_dim, o_stride, false);
  auto stats = g.tensor("stats", kStats, CUDNN_DATA_FLOAT, r_dim, r_stride, false);
  auto dQ = g.tensor("dQ", kdQ, CUDNN_DATA_BFLOAT16, q_dim, q_stride, false);
  auto dK = g.tensor("dK", kdK, CUDNN_DATA_BFLOAT16, k_dim, k_stride, false);
  auto dV = g.tensor("dV", kdV, CUDNN_DATA_BFLOAT16, k_dim, k_stride, false);
  auto scale = g.scalar("attn_scale", kScale);
  auto neg_inf = g.scalar("neg_inf", kNegInf);
  auto one = g.scalar("one", kOne);
  auto softmax_sum = g.tensor("softmax_sum (dO.O)", kSoftmaxSum, CUDNN_DATA_FLOAT, r_dim, r_stride, false);

  // D = rowsum(dO * O), kept in memory (the engine computes it in a pre-pass).
  auto dOO = g.virt("dO*O", CUDNN_DATA_FLOAT, o_dim, o_stride);
  g.binary("mul dO O", CUDNN_POINTWISE_MUL, dO, O, dOO);
  auto dot = g.virt("rowsum dO*O", CUDNN_DATA_FLOAT, r_dim, r_stride);
  g.reduction("reduce dO*O", CUDNN_REDUCE_TENSOR_ADD, dOO, dot);
  g.binary("softmax_sum = dot * 1", CUDNN_POINTWISE_MUL, dot, one, softmax_sum);

  // P = exp(mask(scale * Q.Kᵀ - stats))
  auto S = g.virt("S", CUDNN_DATA_FLOAT, s_dim, s_stride);
  g.matmul("matmul Q.K^T", Q, Kt, S);
  auto S_scaled = g.virt("S_scaled", CUDNN_DATA_FLOAT, s_dim, s_stride);
  g.binary("mul S attn_scale", CUDNN_POINTWISE_MUL, S, scale, S_scaled);
  auto S_centered = g.virt("S_minus_stats", CUDNN_DATA_FLOAT, s_dim, s_stride);
  g.binary("sub S stats", CUDNN_POINTWISE_SUB, S_scaled, stats, S_centered);
  auto S_masked = g.causal_mask(S_centered, neg_inf, s_dim, s_stride);
  auto P = g.virt("P", CUDNN_DATA_FLOAT, s_dim, s_stride);
  g.unary("exp S", CUDNN_POINTWISE_EXP, S_masked, P);

  // dV = Σ_group Pᵀ.dO
  auto Pt = g.virt("P^T", CUDNN_DATA_BFLOAT16, st_dim, st_stride);
  g.reshape("reshape P", P, Pt);
  if (H == KV) {
    g.matmul("matmul P^T.dO", Pt, dO, dV);
  } else {
    auto dV_full = g.virt("dV_fullhead", CUDNN_DATA_BFLOAT16, full_dim, full_stride);
    g.matmul("matmul P^T.dO", Pt, dO, dV_full);
    g.reduction("reduce dV heads", CUDNN_REDUCE_TENSOR_ADD, dV_full, dV);
  }

  // dS = (dO.Vᵀ - D) * P * scale
  auto dP = g.virt("dP", CUDNN_DATA_FLOAT, s_dim, s_stride);
  g.matmul("matmul dO.V^T", dO, Vt, dP);
  auto dP_centered = g.virt("dP_minus_D", CUDNN_DATA_FLOAT, s_dim, s_stride);
  g.binary("sub dP softmax_sum", CUDNN_POINTWISE_SUB, dP, softmax_sum, dP_centered);
  auto dS_unscaled = g.virt("dS_unscaled", CUDNN_DATA_FLOAT, s_dim, s_stride);
  g.binary("mul dP P", CUDNN_POINTWISE_MUL, dP_centered, P, dS_unscaled);
  auto dS = g.virt("dS", CUDNN_DATA_FLOAT, s_dim, s_stride);
  g.binary("mul dS attn_scale", CUDNN_POINTWISE_MUL, dS_unscaled, scale, dS);

  // dK = Σ_group dSᵀ.Q
  auto dSt = g.virt("dS^T", CUDNN_DATA_BFLOAT16, st_dim, st_stride);
  g.reshape("reshape dS", dS, dSt);
  if (H == KV) {
    g.matmul("matmul dS^T.Q", dSt, Q, dK);
  } else {
    auto dK_full = g.virt("dK_fullhead", CUDNN_DATA_BFLOAT16, full_dim, full_stride);
    g.matmul("matmul dS^T.Q", dSt, Q, dK_full);
    g.reduction("reduce dK heads", CUDNN_REDUCE_TENSOR_ADD, dK_full, dK);
  }

  // dQ = dS.K
  auto K = g.virt("K", CUDNN_DATA_BFLOAT16, k_dim, k_stride);
  g.reshape("reshape K^T", Kt, K);
  if (det) {
    g.matmul("matmul dS.K", dS, K, dQ);
  } else {
    auto dQ_accum = g.tensor("dQ_accum", kdQAccum, CUDNN_DATA_FLOAT, full_dim, full_stride, false);
    g.matmul("matmul dS.K", dS, K, dQ_accum);
    g.unary("identity dQ", CUDNN_POINTWISE_IDENTITY, dQ_accum, dQ);
    p.dq_accum_bytes = size_t(b) * h * t * d * sizeof(float);
  }
  return g.finalize_graph(p.handle);
}

}  // namespace st::cuda::sdpa

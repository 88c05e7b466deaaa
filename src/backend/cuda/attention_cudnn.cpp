// cuDNN fused flash attention through the backend graph API; see attention_cudnn.h.
// This half holds the plan cache (plans built on the calling thread, or ahead on
// prepare()'s threads), the workspace and the execution; the graphs and the choice of
// their plans are attention_cudnn_graph.cpp's.
#include "backend/cuda/attention_cudnn.h"

#include <cudnn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cuda/attention_cudnn_graph.h"
#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace st::cuda {

using namespace sdpa;

namespace {

bool verbose() {
  static const bool v = [] {
    const char* e = std::getenv("SHARDTRAIN_CUDNN_VERBOSE");
    return e && *e && std::string(e) != "0";
  }();
  return v;
}

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace

struct CudnnAttention::Impl {
  using Key = std::tuple<int, int, int, int, int, int, int>;
  cudaStream_t stream = nullptr;
  cudnnHandle_t handle = nullptr;  // for plans built on the calling thread
  std::string init_failure;
  bool deterministic = true;
  std::string why_not, plan_info;
  // Each plan is built once: on the calling thread at its first use, or on a thread of
  // its own by prepare() (with a handle of its own: a cuDNN handle is not to be used by
  // two threads at once). A use of a plan still being built waits for it.
  std::mutex mu;
  std::map<Key, std::shared_future<Plan*>> plans;
  std::vector<std::unique_ptr<Plan>> built;      // owned; guarded by mu
  std::vector<cudnnHandle_t> thread_handles;     // prepare()'s; guarded by mu
  void* workspace = nullptr;
  size_t workspace_size = 0;

  ~Impl() {
    for (auto& [key, f] : plans) f.wait();  // no build thread outlives the object
    if (workspace) (void)cudaFreeAsync(workspace, stream);
    built.clear();  // descriptors before the handles
    for (cudnnHandle_t h : thread_handles) cudnnDestroy(h);
    if (handle) cudnnDestroy(handle);
  }

  // The calling thread's handle, created at its first use (so that an object whose
  // plans are all built ahead never creates it on the calling thread).
  cudnnHandle_t main_handle() {
    if (handle || !init_failure.empty()) return handle;
    cudnnStatus_t s = cudnnCreate(&handle);
    if (s != CUDNN_STATUS_SUCCESS) {
      handle = nullptr;
      init_failure = status_text(s, "cudnnCreate");
      return nullptr;
    }
    s = cudnnSetStream(handle, stream);
    if (s != CUDNN_STATUS_SUCCESS) {
      init_failure = status_text(s, "cudnnSetStream");
      cudnnDestroy(handle);
      handle = nullptr;
    }
    return handle;
  }

  static Key key_of(bool bwd, bool det, int B, int T, int H, int KV, int hd) {
    return std::make_tuple(int(bwd), int(bwd && det), B, T, H, KV, hd);
  }

  void* ensure_workspace(size_t bytes) {
    if (bytes <= workspace_size) return workspace;
    if (workspace) ST_CUDA(cudaFreeAsync(workspace, stream));
    workspace = nullptr, workspace_size = 0;
    ST_CUDA(cudaMallocAsync(&workspace, bytes, stream));
    workspace_size = bytes;
    return workspace;
  }

  Plan& get(bool bwd, int B, int T, int H, int KV, int hd) {
    const Key key = key_of(bwd, deterministic, B, T, H, KV, hd);
    std::shared_future<Plan*> f;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = plans.find(key);
      if (it == plans.end()) {
        std::promise<Plan*> ready;
        auto p = std::make_unique<Plan>();
        p->handle = main_handle();
        build(*p, bwd, bwd && deterministic, B, T, H, KV, hd);
        ready.set_value(p.get());
        built.push_back(std::move(p));
        it = plans.emplace(key, ready.get_future().share()).first;
      }
      f = it->second;
    }
    return *f.get();
  }

  // Starts building the plans of this shape (forward, and backward with the current
  // determinism) on threads of their own, each with its own handle on the same stream.
  void prepare(int B, int T, int H, int KV, int hd) {
    int device = 0;
    ST_CUDA(cudaGetDevice(&device));
    std::lock_guard<std::mutex> lock(mu);
    for (bool bwd : {false, true}) {
      const bool det = bwd && deterministic;
      const Key key = key_of(bwd, det, B, T, H, KV, hd);
      if (plans.count(key)) continue;
      auto p = std::make_unique<Plan>();
      Plan* raw = p.get();
      built.push_back(std::move(p));
      plans.emplace(key, std::async(std::launch::async, [this, raw, device, bwd, det, B, T, H, KV, hd] {
                           cudaSetDevice(device);
                           cudnnHandle_t h = nullptr;
                           cudnnStatus_t s = cudnnCreate(&h);
                           if (s == CUDNN_STATUS_SUCCESS) s = cudnnSetStream(h, stream);
                           if (h) {
                             std::lock_guard<std::mutex> lock(mu);
                             thread_handles.push_back(h);
                           }
                           if (s != CUDNN_STATUS_SUCCESS) {
                             raw->failure = status_text(s, "cudnnCreate/cudnnSetStream for a plan built ahead");
                             return raw;
                           }
                           raw->handle = h;
                           build(*raw, bwd, det, B, T, H, KV, hd);
                           return raw;
                         }).share());
    }
  }

  // Builds p's graph and plan with p.handle; failures go into p.failure.
  void build(Plan& p, bool bwd, bool det, int B, int T, int H, int KV, int hd) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      if (!p.handle) throw BuildFailure{"cuDNN unavailable: " + init_failure};
      cudnnBackendDescriptor_t graph = bwd ? backward_graph(p, B, T, H, KV, hd, det) : forward_graph(p, B, T, H, KV, hd);
      choose_plan(p, graph, det);
      p.ok = true;
    } catch (const BuildFailure& f) {
      p.ok = false;
      p.failure = f.what;
    }
    std::ostringstream shape;
    shape << (bwd ? (det ? "backward (deterministic)" : "backward (dQ atomics)") : "forward") << " B=" << B
          << " T=" << T << " H=" << H << " KV=" << KV << " hd=" << hd;
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (p.ok) {
      p.info = "cuDNN " + std::to_string(cudnnGetVersion()) + " sdpa " + shape.str() + ": " + p.info;
      if (verbose()) std::fprintf(stderr, "[cudnn attention] plan %s (built in %.0f ms)\n", p.info.c_str(), ms);
    } else {
      p.failure = "cuDNN " + std::to_string(cudnnGetVersion()) + " sdpa " + shape.str() + ": " + p.failure;
      // Once per shape: a fallback the log should show.
      std::fprintf(stderr, "[cudnn attention] no plan: %s\n", p.failure.c_str());
    }
  }
};

CudnnAttention::CudnnAttention(cudaStream_t stream) : impl_(std::make_unique<Impl>()) { impl_->stream = stream; }

void CudnnAttention::prepare(int B, int T, int H, int KV, int hd) {
  if (B < 1 || T < 1 || H < 1 || KV < 1 || hd < 1 || H % KV != 0 || hd % 8 != 0 || hd > 256) return;
  impl_->prepare(B, T, H, KV, hd);
}

CudnnAttention::~CudnnAttention() = default;

std::string CudnnAttention::why_not() const { return impl_->why_not; }
std::string CudnnAttention::plan_info() const { return impl_->plan_info; }
void CudnnAttention::set_deterministic(bool on) { impl_->deterministic = on; }
bool CudnnAttention::deterministic() const { return impl_->deterministic; }
size_t CudnnAttention::workspace_bytes() const { return impl_->workspace_size; }
size_t CudnnAttention::version() { return cudnnGetVersion(); }

namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Arguments the graphs cannot take, or "" when they are fine.
std::string check_args(const void* const* ptrs, size_t n, int B, int T, int H, int KV, int hd) {
  std::ostringstream os;
  if (B < 1 || T < 1 || H < 1 || KV < 1 || hd < 1 || H % KV != 0)
    os << "bad shape B=" << B << " T=" << T << " H=" << H << " KV=" << KV << " hd=" << hd;
  else if (hd % 8 != 0 || hd > 256)
    os << "head dim " << hd << " unsupported (needs a multiple of 8, at most 256)";
  else
    for (size_t i = 0; i < n; i++)
      if (!aligned16(ptrs[i])) {
        os << "pointer argument " << i << " is not 16-byte aligned";
        break;
      }
  return os.str();
}

void execute(cudnnHandle_t handle, Plan& p, std::vector<int64_t>& uids, std::vector<void*>& ptrs, void* ws) {
  Descs d;
  auto fail = [&](cudnnStatus_t s, const std::string& what) { st::fail("cuDNN attention: ", status_text(s, what)); };
  cudnnBackendDescriptor_t vp = nullptr;
  try {
    vp = d.create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack");
    ST_SET(d, vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data());
    ST_SET(d, vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(ptrs.size()), ptrs.data());
    ST_SET(d, vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    d.finalize(vp);
  } catch (const BuildFailure& f) {
    st::fail("cuDNN attention: ", f.what);
  }
  const cudnnStatus_t s = cudnnBackendExecute(handle, p.plan, vp);
  if (s != CUDNN_STATUS_SUCCESS) fail(s, "cudnnBackendExecute of " + p.info);
}

}  // namespace

bool CudnnAttention::forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T, int H, int KV,
                             int hd) {
  Impl& m = *impl_;
  const void* args[] = {out, lse, qkv, qkv + size_t(H) * hd, qkv + size_t(H + KV) * hd};
  m.why_not = check_args(args, 5, B, T, H, KV, hd);
  if (!m.why_not.empty()) return false;
  Plan& p = m.get(false, B, T, H, KV, hd);
  if (!p.ok) return m.why_not = p.failure, false;

  p.total_workspace = round_up(size_t(p.cudnn_workspace), 256);
  void* ws = m.ensure_workspace(std::max<size_t>(p.total_workspace, 256));
  float scale = float(1.0 / std::sqrt(double(hd))), neg_inf = -INFINITY;
  auto* base = const_cast<__nv_bfloat16*>(qkv);
  std::vector<int64_t> uids{kQ, kK, kV, kO, kStats, kScale, kNegInf};
  std::vector<void*> ptrs{base, base + size_t(H) * hd, base + size_t(H + KV) * hd, out, lse, &scale, &neg_inf};
  execute(p.handle, p, uids, ptrs, ws);
  m.plan_info = p.info;
  return true;
}

bool CudnnAttention::backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* out,
                              const float* lse, const __nv_bfloat16* qkv, int B, int T, int H, int KV, int hd) {
  Impl& m = *impl_;
  const void* args[] = {dqkv, dout, out, lse, qkv, qkv + size_t(H) * hd, qkv + size_t(H + KV) * hd,
                        dqkv + size_t(H) * hd, dqkv + size_t(H + KV) * hd};
  m.why_not = check_args(args, 9, B, T, H, KV, hd);
  if (!m.why_not.empty()) return false;
  Plan& p = m.get(true, B, T, H, KV, hd);
  if (!p.ok) return m.why_not = p.failure, false;

  // [cuDNN's workspace | softmax_sum (B H T fp32) | dQ_accum (B H T hd fp32, non-deterministic only)]
  p.softmax_sum_offset = round_up(size_t(p.cudnn_workspace), 256);
  p.dq_accum_offset = round_up(p.softmax_sum_offset + size_t(B) * H * T * sizeof(float), 256);
  p.total_workspace = round_up(p.dq_accum_offset + p.dq_accum_bytes, 256);
  char* ws = static_cast<char*>(m.ensure_workspace(p.total_workspace));
  // cuDNN >= 9.6 zeroes dQ_accum itself (cudnn-frontend stopped doing it then).
  if (p.dq_accum_bytes && cudnnGetVersion() < 90600)
    ST_CUDA(cudaMemsetAsync(ws + p.dq_accum_offset, 0, p.dq_accum_bytes, m.stream));

  float scale = float(1.0 / std::sqrt(double(hd))), neg_inf = -INFINITY, one = 1.0f;
  auto* base = const_cast<__nv_bfloat16*>(qkv);
  std::vector<int64_t> uids{kQ, kK, kV, kO, kdO, kStats, kdQ, kdK, kdV, kScale, kNegInf, kOne, kSoftmaxSum};
  std::vector<void*> ptrs{base,
                          base + size_t(H) * hd,
                          base + size_t(H + KV) * hd,
                          const_cast<__nv_bfloat16*>(out),
                          const_cast<__nv_bfloat16*>(dout),
                          const_cast<float*>(lse),
                          dqkv,
                          dqkv + size_t(H) * hd,
                          dqkv + size_t(H + KV) * hd,
                          &scale,
                          &neg_inf,
                          &one,
                          ws + p.softmax_sum_offset};
  if (p.dq_accum_bytes) uids.push_back(kdQAccum), ptrs.push_back(ws + p.dq_accum_offset);
  execute(p.handle, p, uids, ptrs, ws);
  m.plan_info = p.info;
  return true;
}

}  // namespace st::cuda

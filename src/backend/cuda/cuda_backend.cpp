// The CUDA backend: dtype dispatch, memory ops, and the state the kernels share (one
// stream, the cuBLASLt wrapper, small pinned read-back buffers), behind the checked
// fronts of backend.cpp (its OpRules below; the id check on the device).
// The kernels live in the .cu files of this directory (cuda_kernels.h).
//
// Dtypes: activations and weights are BF16 (or all F32 for tests); parameter
// gradients, statistics (rstd, lse, losses) and AdamW state are F32; ids are I32.
// Everything is enqueued on one stream; upload, download, sum_squares and the id
// checks synchronise it, since they hand results to the host.
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/attention_cudnn.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/matmul.h"
#include "core/log.h"

namespace st {
namespace cuda {

int device_count(std::string* error) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: the probe must not poison later calls
    if (error) *error = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    return 0;
  }
  if (n == 0 && error) *error = "no devices";
  return n;
}

}  // namespace cuda

namespace {

using cuda::bf16;

// ---- dtype dispatch -------------------------------------------------------------------

// Calls fn(T{}) with T = bf16 or float for a BF16 / F32 dtype.
template <class Fn>
void dispatch(DType dt, Fn&& fn) {
  if (dt == DType::BF16)
    fn(bf16{});
  else
    fn(float{});
}

// ---- the backend --------------------------------------------------------------------------

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    std::string why;
    const int count = cuda::device_count(&why);
    ST_CHECK(count > 0, "cuda backend: no CUDA device found (cudaGetDeviceCount: ", why, ")");
    ST_CHECK(device >= 0 && device < count, "cuda backend: device ", device, " does not exist (", count,
             " device(s))");
    ST_CUDA(cudaSetDevice(device));
    cudaDeviceProp prop{};
    ST_CUDA(cudaGetDeviceProperties(&prop, device));
    ST_CHECK(prop.major >= 8, "cuda backend: ", prop.name, " has compute capability ", prop.major, ".", prop.minor,
             "; bf16 tensor cores need 8.0 or newer");
    name_ = "cuda:" + std::to_string(device) + " (" + prop.name + ")";
    cc_ = prop.major * 10 + prop.minor;
    if (cc_ < 89)
      fp8_why_not_ = std::string(prop.name) + " has compute capability " + std::to_string(prop.major) + "." +
                     std::to_string(prop.minor) + ": FP8 tensor cores need 8.9 (Ada, e.g. L4) or 9.0 (Hopper)";
    ST_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // alloc/free go through the stream-ordered pool; keep freed memory cached in it
    // (the default threshold 0 hands it back to the driver at every synchronisation).
    cudaMemPool_t pool;
    ST_CUDA(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t keep = UINT64_MAX;
    ST_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    matmul_ = std::make_unique<cuda::Matmul>(stream_);
    ST_CUDA(cudaMalloc(&small_dev_, 64));
    ST_CUDA(cudaMalloc(&amax_dev_, 256));
    ST_CUDA(cudaMallocHost(&small_host_, 64));
    // A smaller GPU, for planning and benchmarks: SHARDTRAIN_GPU_MEMORY_CAP_GIB caps what
    // this backend's allocations may hold at once (e.g. 22 for an L4's usable memory).
    if (const char* cap = std::getenv("SHARDTRAIN_GPU_MEMORY_CAP_GIB"); cap && *cap) {
      char* end = nullptr;
      const double gib = std::strtod(cap, &end);
      ST_CHECK(end && *end == 0 && gib > 0, "SHARDTRAIN_GPU_MEMORY_CAP_GIB='", cap,
               "': a positive number of GiB expected");
      cap_bytes_ = static_cast<size_t>(gib * double(size_t(1) << 30));
    }
  }

  ~CudaBackend() override {
    // No throwing here: report nothing, release everything.
    (void)cudaSetDevice(device_);
    (void)cudaStreamSynchronize(stream_);
    cuda::scratch_release(norm_scratch_, stream_);
    cudnn_attention_.reset();  // frees its workspace on the stream
    (void)cudaStreamSynchronize(stream_);
    matmul_.reset();
    if (small_dev_) (void)cudaFree(small_dev_);
    if (amax_dev_) (void)cudaFree(amax_dev_);
    if (small_host_) (void)cudaFreeHost(small_host_);
    if (sums_dev_) (void)cudaFree(sums_dev_);
    if (sums_host_) (void)cudaFreeHost(sums_host_);
    for (cudaStream_t s : lane_streams_)
      if (s) (void)cudaStreamSynchronize(s), (void)cudaStreamDestroy(s);
    for (cudaEvent_t e : lane_events_)
      if (e) (void)cudaEventDestroy(e);
    if (stream_) (void)cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::CUDA; }
  std::string name() const override { return name_; }

  // cuBLASLt's workspace, and cuDNN attention's once its first call has sized it.
  size_t workspace_bytes() const override {
    return matmul_->workspace_bytes() + (cudnn_attention_ ? cudnn_attention_->workspace_bytes() : 0);
  }
  std::string fp8_unsupported_reason() const override { return fp8_why_not_; }
  size_t peak_allocated_bytes() const override {
    cudaMemPool_t pool;
    uint64_t high = 0;
    if (cudaDeviceGetDefaultMemPool(&pool, device_) == cudaSuccess)
      (void)cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high);
    // cuDNN's workspace comes from the pool (counted in `high`); cuBLASLt's does not.
    return static_cast<size_t>(high) + matmul_->workspace_bytes();
  }
  void reset_peak_allocated() override {
    cudaMemPool_t pool;
    uint64_t zero = 0;
    if (cudaDeviceGetDefaultMemPool(&pool, device_) == cudaSuccess)
      (void)cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero);
  }
  size_t memory_available_bytes() const override {
    size_t free = 0, total = 0;
    use_device();
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
    if (cap_bytes_) {
      const size_t held = live_bytes_ + workspace_bytes();
      free = std::min(free, cap_bytes_ > held ? cap_bytes_ - held : size_t(1));
    }
    return free;
  }
  std::string memory_available_source() const override {
    return cap_bytes_ ? "the GPU memory cap (SHARDTRAIN_GPU_MEMORY_CAP_GIB)" : "free GPU memory (cudaMemGetInfo)";
  }

  // ---- memory -----------------------------------------------------------------------

  Tensor alloc(DType dtype, size_t numel) override {
    use_device();
    Tensor t{nullptr, dtype, numel};
    if (numel == 0) return t;
    if (cap_bytes_ && live_bytes_ + workspace_bytes() + t.bytes() > cap_bytes_)
      fail("cuda backend: out of GPU memory allocating ", t.bytes(), " bytes: ", live_bytes_ + workspace_bytes(),
           " bytes held of the ", cap_bytes_, " that SHARDTRAIN_GPU_MEMORY_CAP_GIB allows");
    const cudaError_t e = cudaMallocAsync(&t.data, t.bytes(), stream_);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      (void)cudaMemGetInfo(&free_b, &total_b);
      fail("cuda backend: out of GPU memory allocating ", t.bytes(), " bytes (", free_b, " of ", total_b,
           " bytes free)");
    }
    ST_CUDA(e);
    ST_CUDA(cudaMemsetAsync(t.data, 0, t.bytes(), stream_));
    live_bytes_ += t.bytes();
    return t;
  }
  void free(Tensor& t) override {
    forget_checked_ids(t);
    if (t.data) {
      use_device();
      ST_CUDA(cudaFreeAsync(t.data, stream_));  // stream-ordered: safe while kernels still read it
      live_bytes_ -= std::min(live_bytes_, t.bytes());
    }
    t.data = nullptr;
  }
  void zero(Tensor t) override {
    forget_checked_ids(t);
    if (t.empty()) return;
    use_device();
    ST_CUDA(cudaMemsetAsync(t.data, 0, t.bytes(), stream_));
  }
  void* alloc_host(size_t bytes) override {
    use_device();
    void* p = nullptr;
    if (cudaMallocHost(&p, bytes) != cudaSuccess) {
      cudaGetLastError();  // clear it: the caller falls back to pageable memory
      return nullptr;
    }
    return p;
  }
  void free_host(void* p) override {
    if (p) cudaFreeHost(p);
  }
  void synchronize() override {
    use_device();
    ST_CUDA(cudaStreamSynchronize(stream_));
  }
  void* native_stream() override { return stream_; }
  void prepare_attention(int B, int T, int H, int KV, int hd) override {
    if (!use_cudnn()) return;
    use_device();
    cudnn()->prepare(B, T, H, KV, hd);
  }

 protected:
  OpRules op_rules() const override {
    return {{DType::BF16, DType::F32}, "the CUDA backend computes on bf16 (or f32) activations", true,
            cuda::kMaxHeadDim, "the CUDA kernels'"};
  }

  // ---- memory, checked -------------------------------------------------------------------

  void do_fill(Tensor t, double value) override {
    forget_checked_ids(t);
    use_device();
    cuda::fill(t.data, t.dtype, t.numel, value, stream_);
  }
  void do_fill_normal(Tensor t, uint64_t key, uint64_t first, double stddev) override {
    use_device();
    cuda::fill_normal(t.data, t.dtype, t.numel, key, first, stddev, stream_);
  }
  void do_copy(Tensor dst, Tensor src) override {
    forget_checked_ids(dst);
    use_device();
    if (dst.dtype == src.dtype)
      ST_CUDA(cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDeviceToDevice, stream_));
    else
      cuda::convert(dst.data, dst.dtype, src.data, src.dtype, src.numel, stream_);
  }
  void do_upload(Tensor dst, const void* host) override {
    forget_checked_ids(dst);
    use_device();
    ST_CUDA(cudaMemcpyAsync(dst.data, host, dst.bytes(), cudaMemcpyHostToDevice, stream_));
    ST_CUDA(cudaStreamSynchronize(stream_));  // the caller may reuse `host` at once
  }
  void do_upload_ids(Tensor dst, const int32_t* host, int V, bool has_ignore, int ignore) override {
    do_upload(dst, host);  // forgets older checks of this memory
    checked_ids_.push_back({static_cast<const char*>(dst.data), dst.bytes(), V, has_ignore, ignore});
  }
  void do_download(void* host, Tensor src) override {
    use_device();
    ST_CUDA(cudaMemcpyAsync(host, src.data, src.bytes(), cudaMemcpyDeviceToHost, stream_));
    ST_CUDA(cudaStreamSynchronize(stream_));
  }
  void do_upload_async(Tensor dst, const void* host, Lane lane) override {
    forget_checked_ids(dst);
    use_device();
    ST_CUDA(cudaMemcpyAsync(dst.data, host, dst.bytes(), cudaMemcpyHostToDevice, lane_stream(lane)));
  }
  void do_download_async(void* host, Tensor src, Lane lane) override {
    use_device();
    ST_CUDA(cudaMemcpyAsync(host, src.data, src.bytes(), cudaMemcpyDeviceToHost, lane_stream(lane)));
  }
  void lane_wait(Lane waiting, Lane on) override {
    if (waiting == on) return;
    use_device();
    cudaEvent_t& ev = lane_events_[int(on)];
    if (!ev) ST_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    // A wait takes the event's latest record: one event per lane serves every wait.
    ST_CUDA(cudaEventRecord(ev, lane_stream(on)));
    ST_CUDA(cudaStreamWaitEvent(lane_stream(waiting), ev, 0));
  }

  // ---- element-wise -------------------------------------------------------------------

  void do_add(Tensor out, Tensor a, Tensor b, size_t n) override {
    use_device();
    dispatch(out.dtype, [&](auto tag) {
      using T = decltype(tag);
      cuda::add(out.as<T>(), a.as<T>(), b.as<T>(), n, stream_);
    });
  }
  void do_accumulate(Tensor acc, Tensor x, size_t n) override {
    use_device();
    dispatch(acc.dtype, [&](auto tag) {
      using T = decltype(tag);
      cuda::accumulate(acc.as<T>(), x.as<T>(), n, stream_);
    });
  }
  double do_sum_squares(Tensor x, size_t n) override {
    DType dt = act_dtype("sum_squares", "x", x);
    use_device();
    double* result = static_cast<double*>(small_dev_);
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      cuda::sum_squares(result, x.as<T>(), n, stream_);
    });
    ST_CUDA(cudaMemcpyAsync(small_host_, result, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    ST_CUDA(cudaStreamSynchronize(stream_));
    return *static_cast<double*>(small_host_);
  }

  double do_sum_squares_total(const std::vector<std::pair<Tensor, size_t>>& parts) override {
    if (parts.empty()) return 0.0;
    use_device();
    const size_t k = parts.size();
    if (sums_capacity_ < k) {
      if (sums_dev_) ST_CUDA(cudaFree(sums_dev_));
      if (sums_host_) ST_CUDA(cudaFreeHost(sums_host_));
      sums_dev_ = nullptr, sums_host_ = nullptr, sums_capacity_ = 0;
      ST_CUDA(cudaMalloc(&sums_dev_, k * sizeof(double)));
      ST_CUDA(cudaMallocHost(&sums_host_, k * sizeof(double)));
      sums_capacity_ = k;
    }
    for (size_t i = 0; i < k; ++i) {
      const auto& [x, n] = parts[i];
      if (n == 0) {
        ST_CUDA(cudaMemsetAsync(sums_dev_ + i, 0, sizeof(double), stream_));
        continue;
      }
      dispatch(act_dtype("sum_squares", "x", x), [&](auto tag) {
        using T = decltype(tag);
        cuda::sum_squares(sums_dev_ + i, x.as<T>(), n, stream_);
      });
    }
    ST_CUDA(cudaMemcpyAsync(sums_host_, sums_dev_, k * sizeof(double), cudaMemcpyDeviceToHost, stream_));
    ST_CUDA(cudaStreamSynchronize(stream_));
    double total = 0;
    for (size_t i = 0; i < k; ++i) total += sums_host_[i];  // in order, as part by part
    return total;
  }

  // ---- embedding ------------------------------------------------------------------------

  void do_embedding_forward(Tensor out, Tensor tokens, Tensor wte, int N, int C, int V) override {
    use_device();
    dispatch(wte.dtype, [&](auto tag) {
      using T = decltype(tag);
      cuda::embedding_forward(out.as<T>(), tokens.as<int32_t>(), wte.as<T>(), N, C, stream_);
    });
  }
  void do_embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int N, int C, int V) override {
    use_device();
    dispatch(dout.dtype, [&](auto tag) {
      using T = decltype(tag);
      cuda::embedding_backward(dwte.as<float>(), dout.as<T>(), tokens.as<int32_t>(), N, C, V, stream_);
    });
  }

  // ---- RMSNorm ----------------------------------------------------------------------------

  void do_rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, int N, int C, float eps) override {
    use_device();
    dispatch(inp.dtype, [&](auto tag) {
      using T = decltype(tag);
      cuda::rmsnorm_forward(out.as<T>(), rstd.as<float>(), inp.as<T>(), weight.as<T>(), N, C, eps, stream_);
    });
  }
  void do_rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd, int N,
                           int C) override {
    use_device();
    dispatch(inp.dtype, [&](auto tag) {
      using T = decltype(tag);
      cuda::rmsnorm_backward(dinp.as<T>(), dweight.as<float>(), dout.as<T>(), inp.as<T>(), weight.as<T>(),
                             rstd.as<float>(), N, C, norm_scratch_, stream_);
    });
  }
  void do_add_rmsnorm_forward(Tensor sum, Tensor out, Tensor rstd, Tensor a, Tensor b, Tensor weight, int N, int C,
                              float eps) override {
    use_device();
    dispatch(a.dtype, [&](auto tag) {
      using T = decltype(tag);
      cuda::add_rmsnorm_forward(sum.as<T>(), out.as<T>(), rstd.as<float>(), a.as<T>(), b.as<T>(), weight.as<T>(), N,
                                C, eps, stream_);
    });
  }

  // ---- linear -------------------------------------------------------------------------------

  void do_matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias, int N, int IC, int OC) override {
    use_device();
    matmul_->forward(out, inp, weight, bias, N, IC, OC);
  }
  void do_matmul_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight, int N,
                          int IC, int OC) override {
    use_device();
    // An empty dweight (a frozen weight) is skipped too, as on the CPU.
    if (!dinp.empty()) matmul_->backward_input(dinp, dout, weight, N, IC, OC);
    if (!dweight.empty()) matmul_->backward_weight(dweight, dout, inp, N, IC, OC);
    if (!dbias.empty()) dispatch(inp.dtype, [&](auto tag) {
        using T = decltype(tag);
        cuda::column_sums_add(dbias.as<float>(), dout.as<T>(), N, OC, stream_);
      });
  }

  // ---- FP8 ----------------------------------------------------------------------------------

  void do_fp8_quantize(Tensor q, Tensor qt, Tensor inv_scale, Tensor x, int rows, int cols, bool reuse_scale,
                       Tensor amax) override {
    use_device();
    ST_CHECK(fp8_why_not_.empty(), "fp8_quantize: ", fp8_why_not_);
    const Fp8Format f = (q.empty() ? qt.dtype : q.dtype) == DType::F8E4M3 ? Fp8Format::E4M3 : Fp8Format::E5M2;
    auto* qp = q.empty() ? nullptr : q.as<uint8_t>();
    auto* qtp = qt.empty() ? nullptr : qt.as<uint8_t>();
    dispatch(x.dtype, [&](auto tag) {
      using T = decltype(tag);
      cuda::fp8_quantize(qp, qtp, inv_scale.as<float>(), x.as<T>(), rows, cols, f, reuse_scale ? nullptr : amax_dev_,
                         amax.empty() ? nullptr : amax.as<unsigned>(), stream_);
    });
  }
  void do_swiglu_backward_fp8(Tensor q, Tensor qt, Tensor inv_scale, Tensor amax, Tensor dout, Tensor gu, int N,
                              int F) override {
    use_device();
    ST_CHECK(fp8_why_not_.empty(), "swiglu_backward_fp8: ", fp8_why_not_);
    const Fp8Format f = (q.empty() ? qt.dtype : q.dtype) == DType::F8E4M3 ? Fp8Format::E4M3 : Fp8Format::E5M2;
    bool fused = false;
    dispatch(gu.dtype, [&](auto tag) {
      using T = decltype(tag);
      fused = cuda::swiglu_backward_fp8(q.empty() ? nullptr : q.as<uint8_t>(), qt.empty() ? nullptr : qt.as<uint8_t>(),
                                        inv_scale.as<float>(), amax.empty() ? nullptr : amax.as<unsigned>(),
                                        dout.as<T>(), gu.as<T>(), N, F, f, stream_);
    });
    if (!fused) Backend::do_swiglu_backward_fp8(q, qt, inv_scale, amax, dout, gu, N, F);
  }
  void do_swiglu_forward_fp8(Tensor q, Tensor qt, Tensor inv_scale, Tensor amax, Tensor gu, int N, int F) override {
    use_device();
    ST_CHECK(fp8_why_not_.empty(), "swiglu_forward_fp8: ", fp8_why_not_);
    const Fp8Format f = (q.empty() ? qt.dtype : q.dtype) == DType::F8E4M3 ? Fp8Format::E4M3 : Fp8Format::E5M2;
    bool fused = false;
    dispatch(gu.dtype, [&](auto tag) {
      using T = decltype(tag);
      fused = cuda::swiglu_forward_fp8(q.empty() ? nullptr : q.as<uint8_t>(), qt.empty() ? nullptr : qt.as<uint8_t>(),
                                       inv_scale.as<float>(), amax.empty() ? nullptr : amax.as<unsigned>(), gu.as<T>(),
                                       N, F, f, stream_);
    });
    if (!fused) Backend::do_swiglu_forward_fp8(q, qt, inv_scale, amax, gu, N, F);
  }
  void do_fp8_roll_scales(Tensor inv_scale, int stride, Tensor amax, Tensor history, int n, int len, int pos,
                          Fp8Format format) override {
    use_device();
    cuda::fp8_roll_scales(inv_scale.as<float>(), stride, amax.as<float>(), history.as<float>(), n, len, pos, format,
                          stream_);
  }
  void do_fp8_transpose(Tensor qt, Tensor q, int rows, int cols) override {
    use_device();
    cuda::fp8_transpose(qt.as<uint8_t>(), q.as<uint8_t>(), rows, cols, stream_);
  }
  void do_matmul_fp8(Tensor out, Tensor a, Tensor a_inv, Tensor b, Tensor b_inv, Tensor bias, int M, int K, int N,
                     bool accumulate, bool fast_accum) override {
    use_device();
    ST_CHECK(fp8_why_not_.empty(), "matmul_fp8: ", fp8_why_not_);
    matmul_->fp8(out, a, a_inv, b, b_inv, bias, M, K, N, accumulate, fast_accum);
  }

  // ---- RoPE and attention -----------------------------------------------------------------

  void do_rope(Tensor qkv, int B, int T, int H, int KV, int hd, float theta, int sign) override {
    use_device();
    dispatch(qkv.dtype, [&](auto tag) {
      using T_ = decltype(tag);
      cuda::rope(qkv.as<T_>(), B, T, H, KV, hd, theta, sign, stream_);
    });
  }

  void do_attention_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int H, int KV, int hd) override {
    const DType dt = qkv.dtype;
    use_device();
    if (dt == DType::BF16 && use_cudnn() &&
        cudnn_ok(cudnn()->forward(out.as<bf16>(), lse.as<float>(), qkv.as<bf16>(), B, T, H, KV, hd)))
      return;
    if (dt == DType::BF16 && use_fa2(false, hd, {out.data, qkv.data})) {
      cuda::attention_forward_fa2(out.as<bf16>(), lse.as<float>(), qkv.as<bf16>(), B, T, H, KV, hd, stream_);
      return;
    }
    dispatch(dt, [&](auto tag) {
      using T_ = decltype(tag);
      cuda::attention_forward(out.as<T_>(), lse.as<float>(), qkv.as<T_>(), B, T, H, KV, hd, stream_);
    });
  }
  void do_attention_backward(Tensor dqkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv, int B, int T, int H,
                             int KV, int hd) override {
    const DType dt = qkv.dtype;
    use_device();
    if (dt == DType::BF16 && use_cudnn() &&
        cudnn_ok(cudnn()->backward(dqkv.as<bf16>(), dout.as<bf16>(), out.as<bf16>(), lse.as<float>(),
                                   qkv.as<bf16>(), B, T, H, KV, hd)))
      return;
    if (dt == DType::BF16 && use_fa2(true, hd, {dqkv.data, dout.data, out.data, qkv.data})) {
      cuda::attention_backward_fa2(dqkv.as<bf16>(), dout.as<bf16>(), out.as<bf16>(), lse.as<float>(), qkv.as<bf16>(),
                                   B, T, H, KV, hd, stream_);
      return;
    }
    dispatch(dt, [&](auto tag) {
      using T_ = decltype(tag);
      cuda::attention_backward(dqkv.as<T_>(), dout.as<T_>(), out.as<T_>(), lse.as<float>(), qkv.as<T_>(), B, T, H,
                               KV, hd, stream_);
    });
  }

  // ---- SwiGLU -------------------------------------------------------------------------------

  void do_swiglu_forward(Tensor out, Tensor gu, int N, int F) override {
    use_device();
    dispatch(gu.dtype, [&](auto tag) {
      using T = decltype(tag);
      cuda::swiglu_forward(out.as<T>(), gu.as<T>(), N, F, stream_);
    });
  }
  void do_swiglu_backward(Tensor dgu, Tensor dout, Tensor gu, int N, int F) override {
    use_device();
    dispatch(gu.dtype, [&](auto tag) {
      using T = decltype(tag);
      cuda::swiglu_backward(dgu.as<T>(), dout.as<T>(), gu.as<T>(), N, F, stream_);
    });
  }

  // ---- cross-entropy ------------------------------------------------------------------------

  void do_cross_entropy(Tensor losses, Tensor logits, Tensor targets, int N, int V, int ignore_index,
                        float dloss_scale, bool grad) override {
    use_device();
    dispatch(logits.dtype, [&](auto tag) {
      using T = decltype(tag);
      cuda::cross_entropy(losses.as<float>(), logits.as<T>(), targets.as<int32_t>(), N, V, ignore_index,
                          dloss_scale, grad, stream_);
    });
  }

  // With dqt, the loss kernel writes only the e5m2 copy (not the gradient back into the
  // logits), and a byte transpose of it gives dqt: 2 bytes an element moved where a
  // second cast from the gradient would move 3, and the kernel's own store 2 fewer.
  void do_cross_entropy_fp8(Tensor losses, Tensor logits, Tensor dq, Tensor dqt, Tensor inv_scale, Tensor targets,
                            int N, int V, int ignore_index, float dloss_scale, uint64_t round_key) override {
    use_device();
    dispatch(logits.dtype, [&](auto tag) {
      using T = decltype(tag);
      cuda::cross_entropy(losses.as<float>(), logits.as<T>(), targets.as<int32_t>(), N, V, ignore_index,
                          dloss_scale, true, stream_, dq.as<uint8_t>(), dlogits_fp8_scale(dloss_scale),
                          inv_scale.as<float>(), dqt.empty(), round_key);
    });
    if (!dqt.empty()) cuda::fp8_transpose(dqt.as<uint8_t>(), dq.as<uint8_t>(), N, V, stream_);
  }

  // ---- AdamW --------------------------------------------------------------------------------

  void do_adamw(Tensor param, Tensor grad, Tensor m, Tensor v, size_t n, const AdamWParams& p) override {
    use_device();
    if (param.dtype == DType::F32 && m.dtype == DType::F32)
      cuda::adamw(param.as<float>(), grad.as<float>(), m.as<float>(), v.as<float>(), n, p, stream_);
    else
      adamw_mixed(param, grad, m, v, Tensor{}, n, p);
  }

  // Some of param, m and v in bf16 (copy: empty, or f32/bf16).
  void adamw_mixed(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor copy, size_t n, const AdamWParams& p) {
    const bool p16 = param.dtype == DType::BF16, s16 = m.dtype == DType::BF16, c16 = copy.dtype == DType::BF16;
    const float* g = grad.as<float>();
    auto go = [&](auto* pp, auto* mm, auto* vv) {
      if (!copy.empty() && c16) cuda::adamw_mixed(pp, g, mm, vv, copy.as<bf16>(), n, p, stream_);
      else cuda::adamw_mixed(pp, g, mm, vv, copy.empty() ? static_cast<float*>(nullptr) : copy.as<float>(), n, p,
                             stream_);
    };
    if (p16 && s16) go(param.as<bf16>(), m.as<bf16>(), v.as<bf16>());
    else if (p16) go(param.as<bf16>(), m.as<float>(), v.as<float>());
    else go(param.as<float>(), m.as<bf16>(), v.as<bf16>());
  }

  void do_adamw_copy(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor copy, size_t n,
                     const AdamWParams& p) override {
    // The fused kernel writes bf16 or f32 (the front checked the rest).
    ST_CHECK(copy.dtype == DType::BF16 || copy.dtype == DType::F32, "adamw_copy: copy is ", dtype_name(copy.dtype),
             "; bf16 or f32 expected");
    use_device();
    if (param.dtype != DType::F32 || m.dtype != DType::F32)
      adamw_mixed(param, grad, m, v, copy, n, p);
    else if (copy.dtype == DType::BF16)
      cuda::adamw_copy(param.as<float>(), grad.as<float>(), m.as<float>(), v.as<float>(), copy.as<bf16>(), n, p,
                       stream_);
    else
      cuda::adamw_copy(param.as<float>(), grad.as<float>(), m.as<float>(), v.as<float>(), copy.as<float>(), n, p,
                       stream_);
  }

 private:
  cudaStream_t lane_stream(Lane lane) {
    if (lane == Lane::Compute) return stream_;
    cudaStream_t& s = lane_streams_[int(lane)];
    if (!s) ST_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }

  // CUDA's current device is per host thread; make it ours before enqueuing.
  void use_device() const {
    int cur = -1;
    ST_CUDA(cudaGetDevice(&cur));
    if (cur != device_) ST_CUDA(cudaSetDevice(device_));
  }

  // BF16 attention takes cuDNN's fused attention first (attention_cudnn.cpp; the
  // deterministic backward), where cuDNN has an engine for the shape; then the
  // FlashAttention-2 kernels (attention_fa2*.cu) at hd 64 and 128 with 16-byte aligned
  // buffers; the legacy kernels (attention.cu) everything else.
  // SHARDTRAIN_ATTENTION picks one for comparisons: cudnn (an error where it cannot
  // run), fa2, legacy, fa2-fwd / fa2-bwd (FlashAttention-2 in that direction only, the
  // legacy kernels in the other); unset or auto: the order above. Read on every call,
  // so a test can switch it.
  static const char* attention_choice() {
    const char* e = std::getenv("SHARDTRAIN_ATTENTION");
    if (!e || !*e) return "auto";
    for (const char* ok : {"auto", "cudnn", "fa2", "legacy", "fa2-fwd", "fa2-bwd"})
      if (std::strcmp(e, ok) == 0) return ok;
    fail("SHARDTRAIN_ATTENTION=", e, ": expected auto, cudnn, fa2, legacy, fa2-fwd or fa2-bwd");
  }
  bool use_cudnn() {
    const char* c = attention_choice();
    return std::strcmp(c, "cudnn") == 0 || std::strcmp(c, "auto") == 0;
  }
  cuda::CudnnAttention* cudnn() {
    if (!cudnn_attention_) cudnn_attention_ = std::make_unique<cuda::CudnnAttention>(stream_);
    return cudnn_attention_.get();
  }
  // A cuDNN call that could not run (no engine for the shape or GPU): an error when
  // cuDNN was asked for; otherwise the fallback takes over, said once. The answer is
  // cached per shape, so asking again is cheap.
  bool cudnn_ok(bool ran) {
    // cuDNN sizes its workspace itself (from the same pool): under the cap it counts too.
    if (ran && cap_bytes_ && live_bytes_ + workspace_bytes() > cap_bytes_)
      fail("cuda backend: out of GPU memory: cuDNN attention's workspace of ", cudnn_attention_->workspace_bytes(),
           " bytes brings what is held to ", live_bytes_ + workspace_bytes(), " bytes, over the ", cap_bytes_,
           " that SHARDTRAIN_GPU_MEMORY_CAP_GIB allows");
    if (ran) return true;
    const std::string why = cudnn_attention_->why_not();
    if (std::strcmp(attention_choice(), "cudnn") == 0) fail("SHARDTRAIN_ATTENTION=cudnn: ", why);
    if (!cudnn_warned_) {
      log_warn("cuDNN fused attention unavailable, using the FlashAttention-2 kernels: " + why);
      cudnn_warned_ = true;
    }
    return false;
  }
  static bool use_fa2(bool backward, int hd, std::initializer_list<const void*> bufs) {
    if (hd != 64 && hd != 128) return false;
    for (const void* b : bufs)
      if (reinterpret_cast<uintptr_t>(b) % 16 != 0) return false;
    const char* e = attention_choice();
    if (std::strcmp(e, "legacy") == 0) return false;
    if (std::strcmp(e, "fa2-fwd") == 0) return !backward;
    if (std::strcmp(e, "fa2-bwd") == 0) return backward;
    return true;
  }

  // Ids outside [0, V) (other than `ignore`) are an error, reported with the first
  // offending row as the CPU backend does. Costs one synchronisation per call.
  // Id buffers upload_ids checked on the host, until something else writes them.
  struct CheckedIds {
    const char* begin;
    size_t bytes;
    int V;
    bool has_ignore;
    int ignore;
  };
  std::vector<CheckedIds> checked_ids_;
  void forget_checked_ids(Tensor t) {
    if (checked_ids_.empty() || !t.data) return;
    const char* b = static_cast<const char*>(t.data);
    const char* e = b + t.bytes();
    std::erase_if(checked_ids_, [&](const CheckedIds& c) { return c.begin < e && b < c.begin + c.bytes; });
  }
  bool ids_checked(Tensor ids, int N, int V, bool has_ignore, int ignore) const {
    const char* b = static_cast<const char*>(ids.data);
    const char* e = b + size_t(N) * sizeof(int32_t);
    for (const CheckedIds& c : checked_ids_)
      if (c.begin <= b && e <= c.begin + c.bytes && c.V <= V && (!c.has_ignore || (has_ignore && c.ignore == ignore)))
        return true;
    return false;
  }

  void check_ids(const char* op, const char* what, Tensor ids, int N, int V, bool has_ignore, int ignore) override {
    if (ids_checked(ids, N, V, has_ignore, ignore)) return;  // checked on the host at upload
    use_device();
    int* first_bad = static_cast<int*>(small_dev_);
    ST_CUDA(cudaMemsetAsync(first_bad, 0x7f, sizeof(int), stream_));  // 0x7f7f7f7f: above any row
    cuda::find_bad_id(first_bad, ids.as<int32_t>(), N, V, has_ignore, ignore, stream_);
    int* host = static_cast<int*>(small_host_);
    ST_CUDA(cudaMemcpyAsync(host, first_bad, sizeof(int), cudaMemcpyDeviceToHost, stream_));
    ST_CUDA(cudaStreamSynchronize(stream_));
    const int row = host[0];
    if (row >= N) return;
    ST_CUDA(cudaMemcpyAsync(host + 1, ids.as<int32_t>() + row, sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
    ST_CUDA(cudaStreamSynchronize(stream_));
    fail(op, ": ", what, " ", host[1], " at row ", row, " is outside [0, V=", V, ")");
  }

  int device_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::Matmul> matmul_;
  std::unique_ptr<cuda::CudnnAttention> cudnn_attention_;  // created at the first BF16 attention
  bool cudnn_warned_ = false;
  int cc_ = 0;                  // compute capability, major * 10 + minor
  std::string fp8_why_not_;     // fp8_unsupported_reason()
  size_t cap_bytes_ = 0;        // SHARDTRAIN_GPU_MEMORY_CAP_GIB (0: none)
  cudaStream_t lane_streams_[3] = {};  // Lane::ToDevice, Lane::ToHost (made at first use)
  cudaEvent_t lane_events_[3] = {};    // lane_wait's marks, one per lane waited on
  size_t live_bytes_ = 0;       // what alloc() holds now
  unsigned* amax_dev_ = nullptr;  // fp8_quantize's amax word
  void* small_dev_ = nullptr;   // 64 bytes: sum_squares result, first bad id row
  double* sums_dev_ = nullptr;   // sum_squares_total: one result per part
  double* sums_host_ = nullptr;
  size_t sums_capacity_ = 0;
  void* small_host_ = nullptr;  // 64 bytes pinned: their read-back
  cuda::DeviceScratch norm_scratch_;  // rmsnorm_backward's dweight partials, grown on demand
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device_index) {
  return std::make_unique<CudaBackend>(device_index);
}

}  // namespace st

// A built-in op profiler: ProfilingBackend wraps the real backend, forwards every
// call to it, and while its window is open times each op and counts what it did.
// Calls are checked once, by its own fronts under the inner backend's rules, and
// reach the inner backend's do_<op> (backend.h).
//
//   auto prof = std::make_unique<ProfilingBackend>(*real);   // before the model and Fsdp
//   ... build everything on *prof, train N warm-up steps ...
//   prof->open_window();
//   for M steps: { step(); prof->mark_step(); }
//   prof->close_window();                                     // resolves the timings
//   std::cout << prof->report(step_ms, c.tflops, c.gbps).table();
//
// Timing. On CUDA each op gets a pair of cudaEvents recorded on the inner backend's
// stream (native_stream()), from a pool reused from window to window; the elapsed
// times are read once, when the window closes, so the window adds no host syncs.
// On the CPU the (synchronous) call is timed with std::chrono::steady_clock.
// With the window closed every call is forwarded and nothing else happens.
//
// Keys. An op is keyed by its name plus a short shape tag where shapes differ in
// meaning: "matmul_forward 16384x1536->2048" (N x IC -> OC), "matmul_backward
// 16384x1536->2048" (" dW only" when dinp is empty), "attention_forward
// B4 T4096 H12/2 hd128", "copy f32->bf16", "cross_entropy (no grad)". Other ops by
// name alone.
//
// Work per call. matmul: forward 2·N·IC·OC FLOPs; backward 2·N·IC·OC for dweight plus
// the same again when dinp is not empty. Causal attention: forward 2·2·B·H·T·T·hd/2,
// backward 2.5x that. Every other op: the bytes it reads plus the bytes it writes,
// from the element counts of the call and the tensors' dtypes.
//
// Ops are recorded from the thread that runs them; the window's bookkeeping is not
// meant to be shared between threads (the trainer runs its ops on one thread).
#pragma once
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"

namespace st {

// Dense bf16 tensor-core TFLOP/s and memory GB/s of a GPU, found by whole-word
// matches on its CUDA device name (as train/flops.cpp's peak_bf16_tflops does):
// H100 (SXM) 989 / 3350, H200 989 / 4800, A100 80GB 312 / 2039, L4 121 / 300.
// 0 = unknown (then a report prints no percentage).
struct DeviceCeilings {
  double tflops = 0;
  double gbps = 0;
};
DeviceCeilings device_ceilings(const std::string& device_name);

// One line of a report. An op row has either a FLOP count (matmul, attention:
// tflops set) or a byte count (the rest: gbps set); percent_of_peak is achieved /
// ceiling · 100, negative where there is no ceiling to compare with (ceiling 0, or
// the "other" row).
struct ProfileRow {
  std::string op;
  double calls_per_step = 0;  // 0 on the "other" row (null in the json)
  double ms_per_step = 0;
  double share_of_step = 0;   // of the step time (see ProfileReport::denominator_ms)
  double flops_per_call = 0;  // mean; 0 for byte-counted ops
  double bytes_per_call = 0;  // mean; 0 for FLOP-counted ops
  double tflops = 0;          // achieved, FLOP-counted ops
  double gbps = 0;            // achieved, byte-counted ops
  double percent_of_peak = -1;
  bool is_other = false;      // the final "other (communication, host, gaps)" row
};

struct ProfileReport {
  int steps = 0;                 // mark_step() calls in the window
  std::string device;            // the inner backend's name()
  double step_ms = 0;            // per step, as passed to report()
  double ops_ms_per_step = 0;    // the op rows' sum
  // What the shares are of: step_ms, or the ops' sum where that is larger (a step
  // time passed in that is too short, or none) so that the shares still sum to 1.
  double denominator_ms = 0;
  double peak_tflops = 0, peak_gbps = 0;
  // The ops by ms_per_step descending, then the "other (communication, host, gaps)"
  // row: denominator_ms minus the ops' sum, never negative.
  std::vector<ProfileRow> rows;

  // Aligned text columns under a header line naming the window's steps and step time.
  std::string table() const;
  nlohmann::json json() const;
};

// Times a call on the inner backend's device; profiler.cpp has the CPU and CUDA ones.
class OpTimer;

class ProfilingBackend : public Backend {
 public:
  explicit ProfilingBackend(Backend& inner);
  ~ProfilingBackend() override;
  ProfilingBackend(const ProfilingBackend&) = delete;
  ProfilingBackend& operator=(const ProfilingBackend&) = delete;

  Backend& inner() { return inner_; }

  // ---- the window ----------------------------------------------------------------
  // Starts recording; clears what an earlier window recorded.
  void open_window();
  // Stops recording and resolves the timings (on CUDA: waits for the last timed op).
  void close_window();
  // Counts one step inside the window (no-op outside it).
  void mark_step();
  bool window_open() const { return open_; }
  int steps() const { return steps_; }
  // Host wall time from open_window() to the last mark_step(), per step; 0 before a
  // step is marked. On CUDA it is the host's view: true step time only where each
  // step waits for the device (e.g. reads its loss back).
  double measured_step_ms() const;
  // The window's ops per step against a step time and ceilings (0 = unknown).
  // Call after close_window().
  ProfileReport report(double step_ms, double peak_tflops, double peak_gbps) const;

  // ---- Backend, forwarded --------------------------------------------------------
  Device device() const override { return inner_.device(); }
  std::string name() const override { return inner_.name(); }

  Tensor alloc(DType dtype, size_t numel) override { return inner_.alloc(dtype, numel); }
  void free(Tensor& t) override { inner_.free(t); }
  void zero(Tensor t) override;
  void* alloc_host(size_t bytes) override { return inner_.alloc_host(bytes); }
  void free_host(void* p) override { inner_.free_host(p); }
  void synchronize() override { inner_.synchronize(); }
  void* native_stream() override { return inner_.native_stream(); }

  size_t workspace_bytes() const override { return inner_.workspace_bytes(); }
  size_t peak_allocated_bytes() const override { return inner_.peak_allocated_bytes(); }
  size_t memory_available_bytes() const override { return inner_.memory_available_bytes(); }
  std::string memory_available_source() const override { return inner_.memory_available_source(); }
  std::string fp8_unsupported_reason() const override { return inner_.fp8_unsupported_reason(); }
  void reset_peak_allocated() override { inner_.reset_peak_allocated(); }

  void prepare_attention(int B, int T, int H, int KV, int hd) override { inner_.prepare_attention(B, T, H, KV, hd); }

 protected:
  // The fronts (backend.h) check each call once, by the inner backend's rules; the
  // checked call goes to the inner backend's do_<op>, timed while the window is open.
  OpRules op_rules() const override { return inner_.op_rules(); }
  void check_ids(const char* op, const char* what, Tensor ids, int N, int V, bool has_ignore, int ignore) override {
    inner_.check_ids(op, what, ids, N, V, has_ignore, ignore);
  }

  void do_fill(Tensor t, double value) override;
  void do_fill_normal(Tensor t, uint64_t key, uint64_t first, double stddev) override;
  void do_copy(Tensor dst, Tensor src) override;
  void do_upload(Tensor dst, const void* host) override;
  void do_upload_ids(Tensor dst, const int32_t* host, int V, bool has_ignore, int ignore) override;
  void do_download(void* host, Tensor src) override;
  // The lanes pass through untimed (copies beside the compute are not the compute's).
  void do_upload_async(Tensor dst, const void* host, Lane lane) override;
  void do_download_async(void* host, Tensor src, Lane lane) override;
  void lane_wait(Lane waiting, Lane on) override { inner_.lane_wait(waiting, on); }

  void do_add(Tensor out, Tensor a, Tensor b, size_t n) override;
  void do_accumulate(Tensor acc, Tensor x, size_t n) override;
  double do_sum_squares(Tensor x, size_t n) override;
  double do_sum_squares_total(const std::vector<std::pair<Tensor, size_t>>& parts) override;

  void do_embedding_forward(Tensor out, Tensor tokens, Tensor wte, int N, int C, int V) override;
  void do_embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int N, int C, int V) override;

  void do_rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, int N, int C, float eps) override;
  void do_rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd, int N,
                           int C) override;
  void do_add_rmsnorm_forward(Tensor sum, Tensor out, Tensor rstd, Tensor a, Tensor b, Tensor weight, int N, int C,
                              float eps) override;

  void do_matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias, int N, int IC, int OC) override;
  void do_matmul_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight, int N,
                          int IC, int OC) override;

  void do_fp8_quantize(Tensor q, Tensor qt, Tensor inv_scale, Tensor x, int rows, int cols, bool reuse_scale,
                       Tensor amax) override;
  void do_fp8_roll_scales(Tensor inv_scale, int stride, Tensor amax, Tensor history, int n, int len, int pos,
                          Fp8Format format) override {
    inner_.do_fp8_roll_scales(inv_scale, stride, amax, history, n, len, pos, format);
  }
  void do_matmul_fp8(Tensor out, Tensor a, Tensor a_inv, Tensor b, Tensor b_inv, Tensor bias, int M, int K, int N,
                     bool accumulate, bool fast_accum) override;
  void do_fp8_transpose(Tensor qt, Tensor q, int rows, int cols) override;

  void do_rope(Tensor qkv, int B, int T, int H, int KV, int hd, float theta, int sign) override;

  void do_attention_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int H, int KV, int hd) override;
  void do_attention_backward(Tensor dqkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv, int B, int T, int H,
                             int KV, int hd) override;

  void do_swiglu_forward(Tensor out, Tensor gu, int N, int F) override;
  void do_swiglu_backward(Tensor dgu, Tensor dout, Tensor gu, int N, int F) override;
  void do_swiglu_backward_fp8(Tensor q, Tensor qt, Tensor inv_scale, Tensor amax, Tensor dout, Tensor gu, int N,
                              int F) override;
  void do_swiglu_forward_fp8(Tensor q, Tensor qt, Tensor inv_scale, Tensor amax, Tensor gu, int N, int F) override;

  void do_cross_entropy(Tensor losses, Tensor logits, Tensor targets, int N, int V, int ignore_index,
                        float dloss_scale, bool grad) override;
  void do_cross_entropy_fp8(Tensor losses, Tensor logits, Tensor dq, Tensor dqt, Tensor inv_scale, Tensor targets,
                            int N, int V, int ignore_index, float dloss_scale, uint64_t round_key) override;

  void do_adamw(Tensor param, Tensor grad, Tensor m, Tensor v, size_t n, const AdamWParams& p) override;
  void do_adamw_copy(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor copy, size_t n,
                     const AdamWParams& p) override;

 private:
  struct Stat {
    std::string key;
    bool counts_flops = false;  // else bytes
    long long calls = 0;
    double flops = 0, bytes = 0, ms = 0;
  };
  struct Pending {
    size_t stat;  // index into stats_
    size_t slot;  // the timer's measurement
  };

  // Times `call` (window open only) and books it under `key`.
  template <class Call>
  void timed(std::string key, bool counts_flops, double amount, Call&& call);

  Backend& inner_;
  std::unique_ptr<OpTimer> timer_;
  bool open_ = false;
  int steps_ = 0;
  std::chrono::steady_clock::time_point opened_at_, last_step_at_;
  std::vector<Stat> stats_;
  std::unordered_map<std::string, size_t> index_;
  std::vector<Pending> pending_;
};

}  // namespace st

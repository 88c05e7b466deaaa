// The op profiler (profiler.h): its timers, its report, and the ops it times on the
// way to the inner backend.
#include "backend/profiler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <regex>
#include <utility>

#include "core/error.h"

#ifdef SHARDTRAIN_HAVE_CUDA
#include "backend/cuda/cuda_check.h"
#endif

namespace st {

// ---- timers -----------------------------------------------------------------------

// One measurement per timed call: start() before it, stop() after it. The times are
// read only after finish(), which waits for every stopped measurement; reset() makes
// the slots reusable for the next window.
class OpTimer {
 public:
  virtual ~OpTimer() = default;
  virtual size_t start() = 0;
  virtual void stop(size_t slot) = 0;
  virtual void finish() = 0;
  virtual double elapsed_ms(size_t slot) const = 0;
  virtual void reset() = 0;
};

namespace {

// CPU ops run synchronously on the calling thread: the wall time around the call.
class HostTimer final : public OpTimer {
 public:
  size_t start() override {
    const size_t slot = ms_.size();
    ms_.push_back(0);
    t0_ = std::chrono::steady_clock::now();  // last, so the bookkeeping is not timed
    return slot;
  }
  void stop(size_t slot) override {
    ms_[slot] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
  }
  void finish() override {}
  double elapsed_ms(size_t slot) const override { return ms_[slot]; }
  void reset() override { ms_.clear(); }

 private:
  std::chrono::steady_clock::time_point t0_;
  std::vector<double> ms_;
};

#ifdef SHARDTRAIN_HAVE_CUDA
// A pair of events per call, recorded on the backend's stream; the pool grows to the
// largest window seen and is reused. Nothing waits until finish().
class CudaEventTimer final : public OpTimer {
 public:
  explicit CudaEventTimer(void* stream) : stream_(static_cast<cudaStream_t>(stream)) {
    ST_CHECK(stream_ != nullptr, "profiler: the CUDA backend has no stream to time on");
    ST_CUDA(cudaGetDevice(&device_));  // the backend's: its constructor made it current
  }
  ~CudaEventTimer() override {
    for (auto& [a, b] : pool_) {
      (void)cudaEventDestroy(a);
      (void)cudaEventDestroy(b);
    }
  }
  size_t start() override {
    if (used_ == pool_.size()) grow();
    ST_CUDA(cudaEventRecord(pool_[used_].first, stream_));
    return used_++;
  }
  void stop(size_t slot) override {
    ST_CUDA(cudaEventRecord(pool_[slot].second, stream_));
    last_stopped_ = slot;
    any_stopped_ = true;
  }
  void finish() override {
    // One stream: once the last stop event has happened, every earlier one has.
    if (any_stopped_) ST_CUDA(cudaEventSynchronize(pool_[last_stopped_].second));
  }
  double elapsed_ms(size_t slot) const override {
    float ms = 0;
    ST_CUDA(cudaEventElapsedTime(&ms, pool_[slot].first, pool_[slot].second));
    return ms;
  }
  void reset() override {
    used_ = 0;
    any_stopped_ = false;
  }

 private:
  void grow() {
    int cur = -1;
    ST_CUDA(cudaGetDevice(&cur));
    if (cur != device_) ST_CUDA(cudaSetDevice(device_));
    cudaEvent_t a = nullptr, b = nullptr;
    ST_CUDA(cudaEventCreate(&a));
    if (cudaError_t e = cudaEventCreate(&b); e != cudaSuccess) {
      (void)cudaEventDestroy(a);
      ST_CUDA(e);
    }
    pool_.emplace_back(a, b);
  }

  cudaStream_t stream_;
  int device_ = 0;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> pool_;
  size_t used_ = 0, last_stopped_ = 0;
  bool any_stopped_ = false;
};
#endif

std::unique_ptr<OpTimer> make_timer(Backend& inner) {
  if (inner.device() == Device::CUDA) {
#ifdef SHARDTRAIN_HAVE_CUDA
    return std::make_unique<CudaEventTimer>(inner.native_stream());
#else
    fail("profiler: a CUDA backend in a build without CUDA");
#endif
  }
  return std::make_unique<HostTimer>();
}

// ---- what an op does ----------------------------------------------------------------

double es(const Tensor& t) { return static_cast<double>(dtype_size(t.dtype)); }

std::string matmul_tag(int N, int IC, int OC) {
  return std::to_string(N) + "x" + std::to_string(IC) + "->" + std::to_string(OC);
}

std::string attention_tag(int B, int T, int H, int KV, int hd) {
  return "B" + std::to_string(B) + " T" + std::to_string(T) + " H" + std::to_string(H) + " KV" + std::to_string(KV) +
         " hd" + std::to_string(hd);
}

// Causal attention forward: QKᵀ and PV over the lower triangle, 2 FLOPs per MAC.
double attention_forward_flops(int B, int T, int H, int hd) {
  return 2.0 * 2.0 * B * H * static_cast<double>(T) * T * hd / 2.0;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// 3 significant digits below 100, whole numbers above.
std::string sig3(double v) { return v >= 100 ? fmt("%.0f", v) : fmt("%.3g", v); }

std::string calls_text(double c) {
  return std::abs(c - std::round(c)) < 1e-9 ? fmt("%.0f", c) : fmt("%.2f", c);
}

}  // namespace

// ---- ceilings -----------------------------------------------------------------------

DeviceCeilings device_ceilings(const std::string& name) {
  // Whole words only ("L4" must not match "L40S"); the more specific names first.
  static const struct {
    const char* pattern;
    double tflops, gbps;
  } table[] = {
      {"\\bH200\\b", 989, 4800},
      {"\\bGH200\\b", 989, 4000},
      {"\\bH100\\b.*\\bPCIe\\b", 756, 2000},
      {"\\b(H100|H800)\\b", 989, 3350},  // SXM
      {"\\b(A100|A800)\\b.*\\b40GB\\b", 312, 1555},
      {"\\b(A100|A800)\\b", 312, 2039},  // 80GB SXM
      {"\\bL4\\b", 121, 300},
  };
  for (const auto& e : table)
    if (std::regex_search(name, std::regex(e.pattern, std::regex::icase))) return {e.tflops, e.gbps};
  return {};
}

// ---- the window ---------------------------------------------------------------------

ProfilingBackend::ProfilingBackend(Backend& inner) : inner_(inner), timer_(make_timer(inner)) {}

ProfilingBackend::~ProfilingBackend() = default;

void ProfilingBackend::open_window() {
  stats_.clear();
  index_.clear();
  pending_.clear();
  timer_->reset();
  steps_ = 0;
  open_ = true;
  opened_at_ = last_step_at_ = std::chrono::steady_clock::now();
}

void ProfilingBackend::close_window() {
  if (!open_) return;
  open_ = false;
  timer_->finish();
  for (const Pending& p : pending_) stats_[p.stat].ms += timer_->elapsed_ms(p.slot);
  pending_.clear();
  timer_->reset();
}

void ProfilingBackend::mark_step() {
  if (!open_) return;
  ++steps_;
  last_step_at_ = std::chrono::steady_clock::now();
}

double ProfilingBackend::measured_step_ms() const {
  if (steps_ == 0) return 0;
  return std::chrono::duration<double, std::milli>(last_step_at_ - opened_at_).count() / steps_;
}

template <class Call>
void ProfilingBackend::timed(std::string key, bool counts_flops, double amount, Call&& call) {
  const size_t slot = timer_->start();
  call();
  timer_->stop(slot);
  // Booked only once the call returned: a throwing op leaves no half measurement.
  auto [it, fresh] = index_.try_emplace(std::move(key), stats_.size());
  if (fresh) {
    Stat s;
    s.key = it->first;
    s.counts_flops = counts_flops;
    stats_.push_back(std::move(s));
  }
  Stat& s = stats_[it->second];
  ++s.calls;
  (counts_flops ? s.flops : s.bytes) += amount;
  pending_.push_back({it->second, slot});
}

// ---- the report ---------------------------------------------------------------------

ProfileReport ProfilingBackend::report(double step_ms, double peak_tflops, double peak_gbps) const {
  ST_CHECK(!open_, "profiler: report() while the window is open (close_window() first)");
  ProfileReport r;
  r.steps = steps_;
  r.device = inner_.name();
  r.step_ms = step_ms;
  r.peak_tflops = peak_tflops;
  r.peak_gbps = peak_gbps;
  const double steps = std::max(steps_, 1);
  for (const Stat& s : stats_) {
    ProfileRow row;
    row.op = s.key;
    row.calls_per_step = s.calls / steps;
    row.ms_per_step = s.ms / steps;
    const double seconds = s.ms * 1e-3;
    if (s.counts_flops) {
      row.flops_per_call = s.calls ? s.flops / s.calls : 0;
      row.tflops = seconds > 0 ? s.flops / seconds / 1e12 : 0;
      if (peak_tflops > 0) row.percent_of_peak = 100 * row.tflops / peak_tflops;
    } else {
      row.bytes_per_call = s.calls ? s.bytes / s.calls : 0;
      row.gbps = seconds > 0 ? s.bytes / seconds / 1e9 : 0;
      if (peak_gbps > 0) row.percent_of_peak = 100 * row.gbps / peak_gbps;
    }
    r.ops_ms_per_step += row.ms_per_step;
    r.rows.push_back(std::move(row));
  }
  std::sort(r.rows.begin(), r.rows.end(), [](const ProfileRow& a, const ProfileRow& b) {
    return a.ms_per_step != b.ms_per_step ? a.ms_per_step > b.ms_per_step : a.op < b.op;
  });
  r.denominator_ms = std::max(step_ms, r.ops_ms_per_step);
  ProfileRow other;
  other.op = "other (communication, host, gaps)";
  other.is_other = true;
  other.ms_per_step = std::max(0.0, r.denominator_ms - r.ops_ms_per_step);
  r.rows.push_back(std::move(other));
  if (r.denominator_ms > 0)
    for (auto& row : r.rows) row.share_of_step = row.ms_per_step / r.denominator_ms;
  return r;
}

std::string ProfileReport::table() const {
  std::string out = "op profile on " + device + ": " + std::to_string(steps) + " step" + (steps == 1 ? "" : "s") +
                    " in the window, step " + fmt("%.3f", step_ms) + " ms, ops " + fmt("%.3f", ops_ms_per_step) +
                    " ms";
  if (denominator_ms > step_ms)
    out += " (the ops take longer than the step time given: shares are of the ops' sum)";
  out += "; ceilings ";
  out += peak_tflops > 0 ? sig3(peak_tflops) + " TFLOP/s" : std::string("unknown TFLOP/s");
  out += ", ";
  out += peak_gbps > 0 ? sig3(peak_gbps) + " GB/s" : std::string("unknown GB/s");
  out += "\n";

  std::vector<std::vector<std::string>> cells = {{"op", "calls/step", "ms/step", "share", "achieved", "% of peak"}};
  for (const auto& r : rows) {
    std::string achieved = "-", pct = "-";
    if (!r.is_other) {
      achieved = r.flops_per_call > 0 ? sig3(r.tflops) + " TFLOP/s" : sig3(r.gbps) + " GB/s";
      if (r.percent_of_peak >= 0) pct = fmt("%.1f%%", r.percent_of_peak);
    }
    cells.push_back({r.op, r.is_other ? "-" : calls_text(r.calls_per_step), fmt("%.3f", r.ms_per_step),
                     fmt("%.1f%%", 100 * r.share_of_step), achieved, pct});
  }
  std::vector<size_t> width(cells[0].size(), 0);
  for (const auto& line : cells)
    for (size_t c = 0; c < line.size(); ++c) width[c] = std::max(width[c], line[c].size());
  for (const auto& line : cells) {
    std::string text;
    for (size_t c = 0; c < line.size(); ++c) {
      const std::string pad(width[c] - line[c].size(), ' ');
      text += c == 0 ? line[c] + pad : "  " + pad + line[c];  // the op left, numbers right
    }
    while (!text.empty() && text.back() == ' ') text.pop_back();
    out += text + "\n";
  }
  return out;
}

nlohmann::json ProfileReport::json() const {
  auto or_null = [](bool has, double v) { return has ? nlohmann::json(v) : nlohmann::json(nullptr); };
  nlohmann::json rs = nlohmann::json::array();
  for (const auto& r : rows) {
    const bool flops = !r.is_other && r.flops_per_call > 0, bytes = !r.is_other && !flops;
    rs.push_back({{"op", r.op},
                  {"calls_per_step", or_null(!r.is_other, r.calls_per_step)},
                  {"ms_per_step", r.ms_per_step},
                  {"share_of_step", r.share_of_step},
                  {"flops_per_call", or_null(flops, r.flops_per_call)},
                  {"bytes_per_call", or_null(bytes, r.bytes_per_call)},
                  {"tflops", or_null(flops, r.tflops)},
                  {"gbps", or_null(bytes, r.gbps)},
                  {"percent_of_peak", or_null(r.percent_of_peak >= 0, r.percent_of_peak)},
                  {"other", r.is_other}});
  }
  return {{"steps", steps},
          {"device", device},
          {"step_ms", step_ms},
          {"ops_ms_per_step", ops_ms_per_step},
          {"denominator_ms", denominator_ms},
          {"peak_tflops", peak_tflops},
          {"peak_gbps", peak_gbps},
          {"rows", rs}};
}

// ---- the ops, forwarded ---------------------------------------------------------------
// Each one: with the window closed, the call and nothing else; open, the key, the
// FLOPs or the bytes read + written, and the timed call.

void ProfilingBackend::zero(Tensor t) {
  if (!open_) return inner_.zero(t);
  timed("zero", false, t.numel * es(t), [&] { inner_.zero(t); });
}

void ProfilingBackend::do_fill(Tensor t, double value) {
  if (!open_) return inner_.do_fill(t, value);
  timed("fill", false, t.numel * es(t), [&] { inner_.do_fill(t, value); });
}

void ProfilingBackend::do_copy(Tensor dst, Tensor src) {
  if (!open_) return inner_.do_copy(dst, src);
  const std::string key = "copy " + std::string(dtype_name(src.dtype)) + "->" + std::string(dtype_name(dst.dtype));
  timed(key, false, dst.numel * (es(dst) + es(src)), [&] { inner_.do_copy(dst, src); });
}

void ProfilingBackend::do_upload(Tensor dst, const void* host) {
  if (!open_) return inner_.do_upload(dst, host);
  timed("upload", false, dst.numel * es(dst), [&] { inner_.do_upload(dst, host); });
}

void ProfilingBackend::do_download(void* host, Tensor src) {
  if (!open_) return inner_.do_download(host, src);
  timed("download", false, src.numel * es(src), [&] { inner_.do_download(host, src); });
}

void ProfilingBackend::do_add(Tensor out, Tensor a, Tensor b, size_t n) {
  if (!open_) return inner_.do_add(out, a, b, n);
  timed("add", false, n * (es(a) + es(b) + es(out)), [&] { inner_.do_add(out, a, b, n); });
}

void ProfilingBackend::do_accumulate(Tensor acc, Tensor x, size_t n) {
  if (!open_) return inner_.do_accumulate(acc, x, n);
  timed("accumulate", false, n * (2 * es(acc) + es(x)), [&] { inner_.do_accumulate(acc, x, n); });
}

double ProfilingBackend::do_sum_squares(Tensor x, size_t n) {
  if (!open_) return inner_.do_sum_squares(x, n);
  double result = 0;
  timed("sum_squares", false, n * es(x), [&] { result = inner_.do_sum_squares(x, n); });
  return result;
}

void ProfilingBackend::do_embedding_forward(Tensor out, Tensor tokens, Tensor wte, int N, int C, int V) {
  if (!open_) return inner_.do_embedding_forward(out, tokens, wte, N, C, V);
  const double nc = static_cast<double>(N) * C;
  timed("embedding_forward", false, N * es(tokens) + nc * (es(wte) + es(out)),
        [&] { inner_.do_embedding_forward(out, tokens, wte, N, C, V); });
}

void ProfilingBackend::do_embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int N, int C, int V) {
  if (!open_) return inner_.do_embedding_backward(dwte, dout, tokens, N, C, V);
  const double nc = static_cast<double>(N) * C;
  timed("embedding_backward", false, N * es(tokens) + nc * (es(dout) + 2 * es(dwte)),
        [&] { inner_.do_embedding_backward(dwte, dout, tokens, N, C, V); });
}

void ProfilingBackend::do_rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, int N, int C,
                                          float eps) {
  if (!open_) return inner_.do_rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
  const double nc = static_cast<double>(N) * C;
  timed("rmsnorm_forward", false, nc * (es(inp) + es(out)) + C * es(weight) + N * es(rstd),
        [&] { inner_.do_rmsnorm_forward(out, rstd, inp, weight, N, C, eps); });
}

void ProfilingBackend::do_rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight,
                                           Tensor rstd, int N, int C) {
  if (!open_) return inner_.do_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
  const double nc = static_cast<double>(N) * C;
  // dinp and dweight are read and written (+=).
  timed("rmsnorm_backward", false,
        nc * (es(dout) + es(inp) + 2 * es(dinp)) + C * (es(weight) + 2 * es(dweight)) + N * es(rstd),
        [&] { inner_.do_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C); });
}

void ProfilingBackend::do_add_rmsnorm_forward(Tensor sum, Tensor out, Tensor rstd, Tensor a, Tensor b, Tensor weight,
                                              int N, int C, float eps) {
  if (!open_) return inner_.do_add_rmsnorm_forward(sum, out, rstd, a, b, weight, N, C, eps);
  const double nc = static_cast<double>(N) * C;
  timed("add_rmsnorm_forward", false, nc * (es(a) + es(b) + es(sum) + es(out)) + C * es(weight) + N * es(rstd),
        [&] { inner_.do_add_rmsnorm_forward(sum, out, rstd, a, b, weight, N, C, eps); });
}

void ProfilingBackend::do_matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias, int N, int IC, int OC) {
  if (!open_) return inner_.do_matmul_forward(out, inp, weight, bias, N, IC, OC);
  timed("matmul_forward " + matmul_tag(N, IC, OC), true, 2.0 * N * IC * OC,
        [&] { inner_.do_matmul_forward(out, inp, weight, bias, N, IC, OC); });
}

void ProfilingBackend::do_matmul_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                                          Tensor weight, int N, int IC, int OC) {
  if (!open_) return inner_.do_matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
  const double gemm = 2.0 * N * IC * OC;
  const bool with_dinp = !dinp.empty();
  timed("matmul_backward " + matmul_tag(N, IC, OC) + (with_dinp ? "" : " dW only"), true,
        with_dinp ? 2 * gemm : gemm,
        [&] { inner_.do_matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC); });
}

// FP8 rows of their own: each quantization (keyed by format and by which layouts it
// writes: "+T" both, "T" the transpose alone) and each FP8 GEMM shape.
void ProfilingBackend::do_fp8_quantize(Tensor q, Tensor qt, Tensor inv_scale, Tensor x, int rows, int cols,
                                       bool reuse_scale, Tensor amax) {
  if (!open_) return inner_.do_fp8_quantize(q, qt, inv_scale, x, rows, cols, reuse_scale, amax);
  const DType qd = q.empty() ? qt.dtype : q.dtype;
  const double n = static_cast<double>(rows) * cols;
  const char* layouts = q.empty() ? " T" : qt.empty() ? "" : " +T";
  // x is read twice (its amax, then the cast), once with a given scale (reused, or
  // delayed: the amax recorded in the same pass); each layout is written once.
  timed(std::string("fp8_quantize ") + (qd == DType::F8E4M3 ? "e4m3" : "e5m2") + layouts +
            (reuse_scale ? (amax.empty() ? " (scale reused)" : " (delayed scale)") : ""),
        false, n * ((reuse_scale ? 1 : 2) * es(x) + (q.empty() ? 0 : 1) + (qt.empty() ? 0 : 1)),
        [&] { inner_.do_fp8_quantize(q, qt, inv_scale, x, rows, cols, reuse_scale, amax); });
}

void ProfilingBackend::do_fp8_transpose(Tensor qt, Tensor q, int rows, int cols) {
  if (!open_) return inner_.do_fp8_transpose(qt, q, rows, cols);
  timed("fp8_transpose", false, 2.0 * rows * cols, [&] { inner_.do_fp8_transpose(qt, q, rows, cols); });
}

void ProfilingBackend::do_matmul_fp8(Tensor out, Tensor a, Tensor a_inv, Tensor b, Tensor b_inv, Tensor bias, int M,
                                     int K, int N, bool accumulate, bool fast_accum) {
  if (!open_) return inner_.do_matmul_fp8(out, a, a_inv, b, b_inv, bias, M, K, N, accumulate, fast_accum);
  timed("matmul_fp8 " + matmul_tag(M, K, N) + (accumulate ? " +=" : "") + (fast_accum ? " fast" : ""), true,
        2.0 * M * K * N, [&] { inner_.do_matmul_fp8(out, a, a_inv, b, b_inv, bias, M, K, N, accumulate, fast_accum); });
}

void ProfilingBackend::do_rope(Tensor qkv, int B, int T, int H, int KV, int hd, float theta, int sign) {
  if (!open_) return inner_.do_rope(qkv, B, T, H, KV, hd, theta, sign);
  // In place on the q and k columns: each read and written once.
  timed(sign > 0 ? "rope_forward" : "rope_backward", false, 2.0 * B * T * (H + KV) * hd * es(qkv),
        [&] { inner_.do_rope(qkv, B, T, H, KV, hd, theta, sign); });
}

void ProfilingBackend::do_attention_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int H, int KV,
                                            int hd) {
  if (!open_) return inner_.do_attention_forward(out, lse, qkv, B, T, H, KV, hd);
  timed("attention_forward " + attention_tag(B, T, H, KV, hd), true, attention_forward_flops(B, T, H, hd),
        [&] { inner_.do_attention_forward(out, lse, qkv, B, T, H, KV, hd); });
}

void ProfilingBackend::do_attention_backward(Tensor dqkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv, int B,
                                             int T, int H, int KV, int hd) {
  if (!open_) return inner_.do_attention_backward(dqkv, dout, out, lse, qkv, B, T, H, KV, hd);
  timed("attention_backward " + attention_tag(B, T, H, KV, hd), true, 2.5 * attention_forward_flops(B, T, H, hd),
        [&] { inner_.do_attention_backward(dqkv, dout, out, lse, qkv, B, T, H, KV, hd); });
}

void ProfilingBackend::do_swiglu_forward(Tensor out, Tensor gu, int N, int F) {
  if (!open_) return inner_.do_swiglu_forward(out, gu, N, F);
  const double nf = static_cast<double>(N) * F;
  timed("swiglu_forward", false, nf * (2 * es(gu) + es(out)), [&] { inner_.do_swiglu_forward(out, gu, N, F); });
}

// The SwiGLU forward that writes FP8 (one byte per layout) instead of its output.
void ProfilingBackend::do_swiglu_forward_fp8(Tensor q, Tensor qt, Tensor inv_scale, Tensor amax, Tensor gu, int N,
                                             int F) {
  if (!open_) return inner_.do_swiglu_forward_fp8(q, qt, inv_scale, amax, gu, N, F);
  const double nf = static_cast<double>(N) * F;
  timed("swiglu_forward_fp8" + std::string(q.empty() || qt.empty() ? "" : " +T"), false,
        nf * (2 * es(gu) + (q.empty() ? 0 : 1) + (qt.empty() ? 0 : 1)),
        [&] { inner_.do_swiglu_forward_fp8(q, qt, inv_scale, amax, gu, N, F); });
}

void ProfilingBackend::do_upload_async(Tensor dst, const void* host, Lane lane) {
  inner_.do_upload_async(dst, host, lane);
}

void ProfilingBackend::do_download_async(void* host, Tensor src, Lane lane) {
  inner_.do_download_async(host, src, lane);
}

// The SwiGLU backward that writes FP8 (one byte per layout) instead of dgu.
void ProfilingBackend::do_swiglu_backward_fp8(Tensor q, Tensor qt, Tensor inv_scale, Tensor amax, Tensor dout,
                                              Tensor gu, int N, int F) {
  if (!open_) return inner_.do_swiglu_backward_fp8(q, qt, inv_scale, amax, dout, gu, N, F);
  const double nf = static_cast<double>(N) * F;
  timed("swiglu_backward_fp8" + std::string(q.empty() || qt.empty() ? "" : " +T"), false,
        nf * (es(dout) + 2 * es(gu) + 2 * ((q.empty() ? 0 : 1) + (qt.empty() ? 0 : 1))),
        [&] { inner_.do_swiglu_backward_fp8(q, qt, inv_scale, amax, dout, gu, N, F); });
}

void ProfilingBackend::do_swiglu_backward(Tensor dgu, Tensor dout, Tensor gu, int N, int F) {
  if (!open_) return inner_.do_swiglu_backward(dgu, dout, gu, N, F);
  const double nf = static_cast<double>(N) * F;
  timed("swiglu_backward", false, nf * (es(dout) + 2 * es(gu) + 2 * es(dgu)),
        [&] { inner_.do_swiglu_backward(dgu, dout, gu, N, F); });
}

void ProfilingBackend::do_cross_entropy(Tensor losses, Tensor logits, Tensor targets, int N, int V,
                                        int ignore_index, float dloss_scale, bool grad) {
  if (!open_) return inner_.do_cross_entropy(losses, logits, targets, N, V, ignore_index, dloss_scale, grad);
  const double nv = static_cast<double>(N) * V;
  // The logits are read, and overwritten with their gradient when `grad`.
  timed(grad ? "cross_entropy" : "cross_entropy (no grad)", false,
        nv * es(logits) * (grad ? 2 : 1) + N * (es(targets) + es(losses)),
        [&] { inner_.do_cross_entropy(losses, logits, targets, N, V, ignore_index, dloss_scale, grad); });
}

void ProfilingBackend::do_cross_entropy_fp8(Tensor losses, Tensor logits, Tensor dq, Tensor dqt, Tensor inv_scale,
                                            Tensor targets, int N, int V, int ignore_index, float dloss_scale,
                                            uint64_t round_key) {
  if (!open_)
    return inner_.do_cross_entropy_fp8(losses, logits, dq, dqt, inv_scale, targets, N, V, ignore_index, dloss_scale,
                                       round_key);
  const double nv = static_cast<double>(N) * V;
  // As cross_entropy with grad, and the e5m2 copy of the gradient written too; with its
  // transpose, the gradient is not written back, and the copy is read again for it.
  const double bytes = dqt.empty() ? nv * (es(logits) * 2 + 1) : nv * (es(logits) + 3);
  const std::string name = std::string(dqt.empty() ? "cross_entropy +e5m2" : "cross_entropy +e5m2 +T") +
                           (round_key ? " (stochastic)" : "");
  timed(name, false, bytes + N * (es(targets) + es(losses)), [&] {
    inner_.do_cross_entropy_fp8(losses, logits, dq, dqt, inv_scale, targets, N, V, ignore_index, dloss_scale,
                                round_key);
  });
}

void ProfilingBackend::do_adamw(Tensor param, Tensor grad, Tensor m, Tensor v, size_t n, const AdamWParams& p) {
  if (!open_) return inner_.do_adamw(param, grad, m, v, n, p);
  // param, m, v read and written; grad read.
  timed("adamw", false, n * (2 * (es(param) + es(m) + es(v)) + es(grad)),
        [&] { inner_.do_adamw(param, grad, m, v, n, p); });
}

void ProfilingBackend::do_upload_ids(Tensor dst, const int32_t* host, int V, bool has_ignore, int ignore) {
  if (!open_) return inner_.do_upload_ids(dst, host, V, has_ignore, ignore);
  timed("upload", false, dst.bytes(), [&] { inner_.do_upload_ids(dst, host, V, has_ignore, ignore); });
}

double ProfilingBackend::do_sum_squares_total(const std::vector<std::pair<Tensor, size_t>>& parts) {
  if (!open_) return inner_.do_sum_squares_total(parts);
  size_t bytes = 0;
  for (const auto& [x, n] : parts) bytes += n * es(x);
  double r = 0;
  timed("sum_squares", false, bytes, [&] { r = inner_.do_sum_squares_total(parts); });
  return r;
}

void ProfilingBackend::do_fill_normal(Tensor t, uint64_t key, uint64_t first, double stddev) {
  if (!open_) return inner_.do_fill_normal(t, key, first, stddev);
  timed("fill_normal", false, t.bytes(), [&] { inner_.do_fill_normal(t, key, first, stddev); });
}

void ProfilingBackend::do_adamw_copy(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor copy, size_t n,
                                     const AdamWParams& p) {
  if (!open_) return inner_.do_adamw_copy(param, grad, m, v, copy, n, p);
  timed("adamw_copy", false, n * (2 * (es(param) + es(m) + es(v)) + es(grad) + es(copy)),
        [&] { inner_.do_adamw_copy(param, grad, m, v, copy, n, p); });
}

}  // namespace st

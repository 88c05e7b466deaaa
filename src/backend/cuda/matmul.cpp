// cuBLASLt GEMMs for the linear layer.
//
// Mapping the row-major Hugging Face layout onto column-major cuBLAS: a row-major
// (R, C) matrix is a column-major (C, R) matrix with leading dimension C. So
//   out (N, OC) = inp (N, IC) · W (OC, IC)ᵀ   becomes   outᶜ (OC, N) = Wᶜᵀ · inpᶜ,
//       Wᶜ stored (IC, OC): transa;  inpᶜ stored (IC, N): no trans;  m=OC n=N k=IC
//   dinp (N, IC) = dout (N, OC) · W (OC, IC)  becomes  dinpᶜ (IC, N) = Wᶜ · doutᶜ,
//       m=IC n=N k=OC, no transposes
//   dW (OC, IC) += doutᵀ · inp               becomes  dWᶜ (IC, OC) += inpᶜ · doutᶜᵀ,
//       m=IC n=OC k=N, transb; C = D = dW in F32 with beta = 1
// Compute type is always CUBLAS_COMPUTE_32F (fp32 accumulation; no TF32 for F32).
// The bias (length m = OC) rides on the BIAS epilogue when its pointer is 16-byte
// aligned and an algorithm supports it; otherwise a separate kernel adds it.
// Operands are slices of flat unit buffers, so the heuristic is told each pointer's
// real alignment; should it find no algorithm, gemm() retries on aligned copies.
// The bias gradient is a deterministic column reduction (reduce.cu), not BGRADB.
#include "backend/cuda/matmul.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"

namespace st::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // what cuBLASLt suggests for Hopper
constexpr int kGemmCandidates = 6;                     // heuristic results tried by tune()
constexpr size_t kMaxTuneCopyBytes = size_t(256) << 20;

bool env_flag(const char* name, bool dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  return !(std::strcmp(v, "0") == 0 || std::strcmp(v, "off") == 0 || std::strcmp(v, "false") == 0);
}

void check_lt(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS)
    fail("cuBLASLt error: ", call, " failed: ", cublasLtGetStatusName(s), " (", cublasLtGetStatusString(s), ")");
}
#define ST_LT(call) check_lt((call), #call)

// Largest power of two (<= 256) dividing the address: what the algorithm may assume.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al) al /= 2;
  return al;
}

cudaDataType_t cuda_type(DType dt) {
  switch (dt) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F8E4M3: return CUDA_R_8F_E4M3;
    case DType::F8E5M2: return CUDA_R_8F_E5M2;
    default: fail("matmul: ", dtype_name(dt), " is not a GEMM type (bf16, f32, f8e4m3 or f8e5m2)");
  }
}

size_t type_bytes(cudaDataType_t t) {
  return t == CUDA_R_32F ? 4 : (t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2) ? 1 : 2;
}

// RAII holders so that an exception between create and destroy leaks nothing.
struct Desc {
  cublasLtMatmulDesc_t d = nullptr;
  ~Desc() { if (d) cublasLtMatmulDescDestroy(d); }
};
struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  ~Layout() { if (l) cublasLtMatrixLayoutDestroy(l); }
};
struct Pref {
  cublasLtMatmulPreference_t p = nullptr;
  ~Pref() { if (p) cublasLtMatmulPreferenceDestroy(p); }
};

}  // namespace

Matmul::Matmul(cudaStream_t stream) : stream_(stream) {
  ST_LT(cublasLtCreate(&handle_));
  ST_CUDA(cudaMalloc(&workspace_, kWorkspaceBytes));
  workspace_bytes_ = kWorkspaceBytes;
  tuning_ = env_flag("SHARDTRAIN_GEMM_TUNE", false);
  verbose_ = env_flag("SHARDTRAIN_GEMM_VERBOSE", false);
  if (const char* f = std::getenv("SHARDTRAIN_GEMM_ALGO"); f && *f) {
    char* end = nullptr;
    const long k = std::strtol(f, &end, 10);
    if (*end != '\0' || k < 0 || k >= kGemmCandidates)
      fail("SHARDTRAIN_GEMM_ALGO=", f, ": expected an index of the heuristic's ranking, 0 to ", kGemmCandidates - 1);
    forced_ = int(k);
  }
}

Matmul::~Matmul() {
  if (workspace_) cudaFree(workspace_);
  if (scales_) cudaFree(scales_);
  if (handle_) cublasLtDestroy(handle_);
}

bool Matmul::run(const Gemm& g) {
  Desc desc;
  ST_LT(cublasLtMatmulDescCreate(&desc.d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = g.transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  ST_LT(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  ST_LT(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (g.bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    ST_LT(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    ST_LT(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
  }
  if (g.a_scale) {
    ST_LT(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.a_scale, sizeof g.a_scale));
    ST_LT(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.b_scale, sizeof g.b_scale));
    const int8_t fast = g.fast_accum ? 1 : 0;
    ST_LT(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
  }
  const cudaDataType_t b_type = g.b_type >= 0 ? cudaDataType_t(g.b_type) : g.ab_type;
  Layout a, b, d;
  ST_LT(cublasLtMatrixLayoutCreate(&a.l, g.ab_type, g.transa ? g.k : g.m, g.transa ? g.m : g.k, g.lda));
  ST_LT(cublasLtMatrixLayoutCreate(&b.l, b_type, g.transb ? g.n : g.k, g.transb ? g.k : g.n, g.ldb));
  ST_LT(cublasLtMatrixLayoutCreate(&d.l, g.d_type, g.m, g.n, g.m));

  const uint32_t al_a = alignment_of(g.A), al_b = alignment_of(g.B), al_d = alignment_of(g.D);
  // FP8 GEMMs need every matrix 16-byte aligned: the heuristic may offer an algorithm for
  // less, which cublasLtMatmul then refuses (NOT_SUPPORTED). A weight gradient slice of a
  // unit's flat buffer may start anywhere; gemm() runs those through aligned scratch.
  if (g.a_scale && std::min({al_a, al_b, al_d}) < 16) return false;
  std::ostringstream key;
  key << g.transa << g.transb << ' ' << g.m << ' ' << g.n << ' ' << g.k << ' ' << g.lda << ' ' << g.ldb << ' '
      << int(g.ab_type) << ' ' << int(g.d_type) << ' ' << (g.bias != nullptr) << ' ' << al_a << ' ' << al_b << ' '
      << al_d << ' ' << (g.beta != 0.0f) << ' ' << int(b_type) << ' ' << (g.a_scale != nullptr) << g.fast_accum;
  auto it = algos_.find(key.str());
  if (it == algos_.end()) {
    Pref pref;
    ST_LT(cublasLtMatmulPreferenceCreate(&pref.p));
    ST_LT(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                               sizeof workspace_bytes_));
    // Slices of a unit's flat buffer start at any element: tell the heuristic.
    ST_LT(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
    ST_LT(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
    ST_LT(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d));
    ST_LT(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d));
    cublasLtMatmulHeuristicResult_t results[kGemmCandidates]{};
    int found = 0;
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle_, desc.d, a.l, b.l, d.l, d.l, pref.p,
                                                            tuning_ || forced_ >= 0 ? kGemmCandidates : 1, results,
                                                            &found);
    if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED) check_lt(s, "cublasLtMatmulAlgoGetHeuristic");
    const bool ok = s == CUBLAS_STATUS_SUCCESS && found > 0;
    int pick = 0;
    if (ok && forced_ >= 0)
      pick = std::min(forced_, found - 1);
    else if (ok && found > 1 && tuning_)
      pick = tune(g, key.str(), desc.d, a.l, b.l, d.l, results, found);
    Cached c{ok, results[pick].algo};
    it = algos_.emplace(key.str(), c).first;
  }
  if (!it->second.found) return false;
  const float alpha = 1.0f;
  const cublasStatus_t st = cublasLtMatmul(handle_, desc.d, &alpha, g.A, a.l, g.B, b.l, &g.beta, g.D, d.l, g.D, d.l,
                                           &it->second.algo, workspace_, workspace_bytes_, stream_);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
    // The heuristic's algorithm refused the call as given: never again for this key;
    // gemm() retries on aligned copies, without the bias epilogue.
    if (verbose_) std::fprintf(stderr, "[gemm] %s: the algorithm refused the call; aligned copies instead\n",
                               key.str().c_str());
    it->second.found = false;
    return false;
  }
  check_lt(st, "cublasLtMatmul");
  return true;
}

int Matmul::tune(const Gemm& g, const std::string& key, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                 cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d, const cublasLtMatmulHeuristicResult_t* results,
                 int count) {
  const size_t d_bytes = size_t(g.m) * g.n * type_bytes(g.d_type);
  if (d_bytes % 8 != 0 || reinterpret_cast<uintptr_t>(g.D) % 8 != 0) return 0;  // fingerprint needs 8-byte words
  // An accumulating GEMM needs a copy of D to restore: not for a big D (the lm_head's
  // weight gradient, ~0.9 GB for Qwen2.5-1.5B), where the copy could exhaust memory.
  if (g.beta != 0.0f && d_bytes > kMaxTuneCopyBytes) return 0;
  Scratch saved(g.beta != 0.0f ? d_bytes : 0, stream_);  // D's values, restored before every run
  Scratch prints(sizeof(unsigned long long) * count, stream_);
  auto* fp = prints.as<unsigned long long>();
  ST_CUDA(cudaMemsetAsync(fp, 0, sizeof(unsigned long long) * count, stream_));
  if (g.beta != 0.0f) ST_CUDA(cudaMemcpyAsync(saved.as<void>(), g.D, d_bytes, cudaMemcpyDeviceToDevice, stream_));
  auto restore = [&] {
    if (g.beta != 0.0f) ST_CUDA(cudaMemcpyAsync(g.D, saved.as<void>(), d_bytes, cudaMemcpyDeviceToDevice, stream_));
  };
  constexpr int kRuns = 2;  // the first also warms up; the faster of the two counts
  std::vector<cudaEvent_t> ev(size_t(count) * kRuns * 2);
  for (auto& e : ev) ST_CUDA(cudaEventCreate(&e));
  std::vector<bool> ran(count, false);
  const float alpha = 1.0f;
  for (int i = 0; i < count; i++) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    bool ok = true;
    for (int r = 0; r < kRuns && ok; r++) {
      restore();
      ST_CUDA(cudaEventRecord(ev[(size_t(i) * kRuns + r) * 2], stream_));
      ok = cublasLtMatmul(handle_, desc, &alpha, g.A, a, g.B, b, &g.beta, g.D, d, g.D, d, &results[i].algo, workspace_,
                          workspace_bytes_, stream_) == CUBLAS_STATUS_SUCCESS;
      ST_CUDA(cudaEventRecord(ev[(size_t(i) * kRuns + r) * 2 + 1], stream_));
    }
    if (!ok) continue;
    fingerprint_add(fp + i, g.D, d_bytes, stream_);
    ran[i] = true;
  }
  restore();
  std::vector<unsigned long long> host(count);
  ST_CUDA(cudaMemcpyAsync(host.data(), fp, sizeof(unsigned long long) * count, cudaMemcpyDeviceToHost, stream_));
  ST_CUDA(cudaStreamSynchronize(stream_));
  int best = 0;
  float best_ms = 0;
  std::ostringstream log;
  for (int i = 0; i < count; i++) {
    if (!ran[i]) continue;
    float ms = 1e30f;
    for (int r = 0; r < kRuns; r++) {
      float t = 0;
      ST_CUDA(cudaEventElapsedTime(&t, ev[(size_t(i) * kRuns + r) * 2], ev[(size_t(i) * kRuns + r) * 2 + 1]));
      ms = std::min(ms, t);
    }
    const bool same = ran[0] && host[i] == host[0];
    if (verbose_) log << " #" << i << " " << ms * 1e3 << "us" << (same ? "" : " (other bits)");
    if (i == 0) best_ms = ran[0] ? ms : 1e30f;
    else if (same && ms < best_ms) best = i, best_ms = ms;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  if (verbose_) {
    const double flop = 2.0 * g.m * g.n * g.k;
    std::fprintf(stderr, "[gemm] %s:%s -> #%d (%.0f TFLOP/s)\n", key.c_str(), log.str().c_str(), best,
                 flop / (best_ms * 1e-3) * 1e-12);
  }
  return best;
}

void Matmul::gemm(Gemm g) {
  if (run(g)) return;
  const size_t ab = type_bytes(g.ab_type), bb = type_bytes(g.b_type >= 0 ? cudaDataType_t(g.b_type) : g.ab_type),
               db = type_bytes(g.d_type);
  // Bytes a column-major (rows, cols) matrix with leading dimension ld spans.
  auto span = [](int rows, int cols, int ld, size_t elem) { return (size_t(ld) * (cols - 1) + rows) * elem; };
  const size_t a_bytes = span(g.transa ? g.k : g.m, g.transa ? g.m : g.k, g.lda, ab);
  const size_t b_bytes = span(g.transb ? g.n : g.k, g.transb ? g.k : g.n, g.ldb, bb);
  const size_t d_bytes = size_t(g.m) * g.n * db;
  Scratch a(a_bytes, stream_), b(b_bytes, stream_), d(d_bytes, stream_);
  ST_CUDA(cudaMemcpyAsync(a.as<void>(), g.A, a_bytes, cudaMemcpyDeviceToDevice, stream_));
  ST_CUDA(cudaMemcpyAsync(b.as<void>(), g.B, b_bytes, cudaMemcpyDeviceToDevice, stream_));
  if (g.beta != 0.0f) ST_CUDA(cudaMemcpyAsync(d.as<void>(), g.D, d_bytes, cudaMemcpyDeviceToDevice, stream_));
  void* out = g.D;
  g.A = a.as<void>(), g.B = b.as<void>(), g.D = d.as<void>();
  if (!run(g))
    fail("matmul: cuBLASLt has no algorithm for m=", g.m, " n=", g.n, " k=", g.k, " (transa ", g.transa,
         ", transb ", g.transb, ", lda ", g.lda, ", ldb ", g.ldb, ", types ", int(g.ab_type), "/", g.b_type, "->",
         int(g.d_type), g.a_scale ? ", fp8 scales" : "", g.bias ? ", bias" : "", ", beta ", g.beta, ")");
  ST_CUDA(cudaMemcpyAsync(out, g.D, d_bytes, cudaMemcpyDeviceToDevice, stream_));
}

void Matmul::forward(Tensor out, Tensor inp, Tensor weight, Tensor bias, int N, int IC, int OC) {
  const cudaDataType_t t = cuda_type(inp.dtype);
  gemm_with_bias(Gemm{true, false, OC, N, IC, weight.data, IC, inp.data, IC, t, out.data, t, 0.0f}, out, bias, N,
                 OC);
}

void Matmul::gemm_with_bias(Gemm g, Tensor out, Tensor bias, int rows, int cols) {
  if (!bias.empty() && alignment_of(bias.data) >= 16) {
    g.bias = bias.data;
    if (run(g)) return;
    g.bias = nullptr;  // no algorithm with the bias epilogue: plain GEMM, bias added below
  }
  gemm(g);
  if (bias.empty()) return;
  if (out.dtype == DType::BF16)
    add_bias(out.as<bf16>(), bias.as<bf16>(), rows, cols, stream_);
  else
    add_bias(out.as<float>(), bias.as<float>(), rows, cols, stream_);
}

void Matmul::backward_input(Tensor dinp, Tensor dout, Tensor weight, int N, int IC, int OC) {
  const cudaDataType_t t = cuda_type(dout.dtype);
  gemm(Gemm{false, false, IC, N, OC, weight.data, IC, dout.data, OC, t, dinp.data, t, 0.0f});
}

void Matmul::backward_weight(Tensor dweight, Tensor dout, Tensor inp, int N, int IC, int OC) {
  const cudaDataType_t t = cuda_type(dout.dtype);
  gemm(Gemm{false, true, IC, OC, N, inp.data, IC, dout.data, OC, t, dweight.data, CUDA_R_32F, 1.0f});
}

// Row-major out (M, N) = a (M, K) · b (N, K)ᵀ is column-major outᶜ (N, M) = bᶜᵀ · aᶜ:
// A = b stored (K, N) with transa, B = a stored (K, M): m=N n=M k=K, lda = ldb = K.
void Matmul::fp8(Tensor out, Tensor a, Tensor a_inv, Tensor b, Tensor b_inv, Tensor bias, int M, int K, int N,
                 bool accumulate, bool fast_accum) {
  Gemm g{true, false, N, M, K, b.data, K, a.data, K, cuda_type(b.dtype), out.data, cuda_type(out.dtype),
         accumulate ? 1.0f : 0.0f};
  g.b_type = int(cuda_type(a.dtype));
  g.a_scale = b_inv.data, g.b_scale = a_inv.data;
  if (alignment_of(g.a_scale) < 16 || alignment_of(g.b_scale) < 16) {
    // The scales' slots of a caller's buffer may be 4-byte aligned: use aligned copies
    // (stream-ordered, so the values are those the quantize before wrote).
    if (!scales_) ST_CUDA(cudaMalloc(&scales_, 512));
    float* s = static_cast<float*>(scales_);
    ST_CUDA(cudaMemcpyAsync(s, g.a_scale, sizeof(float), cudaMemcpyDeviceToDevice, stream_));
    ST_CUDA(cudaMemcpyAsync(s + 64, g.b_scale, sizeof(float), cudaMemcpyDeviceToDevice, stream_));
    g.a_scale = s, g.b_scale = s + 64;
  }
  g.fast_accum = fast_accum;
  gemm_with_bias(g, out, bias, M, N);
}

}  // namespace st::cuda

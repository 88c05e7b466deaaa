// The linear layer's GEMMs through cuBLASLt: one handle, one workspace, one stream
// (the backend's), and a cache of the algorithm per problem shape.
//
// Algorithm choice: cuBLASLt's heuristic first pick. With SHARDTRAIN_GEMM_TUNE=1 the
// first call of a shape times the heuristic's first kGemmCandidates on the real
// operands and keeps the fastest of those whose output is bit for bit the first
// pick's (compared by a device fingerprint), so the choice never changes a result,
// only the time. Off by default: on an H200 it made the Qwen2.5-1.5B GEMMs 2.6% faster
// alone but training only 0.2% (the GPU runs at its power limit there, clocks ~1.5 GHz),
// and it cost the first step 0.38 s (docs/performance.md, 2026-12-03).
// SHARDTRAIN_GEMM_VERBOSE=1 prints each tuned choice. For benchmarks,
// SHARDTRAIN_GEMM_ALGO=k takes the heuristic's k-th algorithm for every shape (or its
// last where it offers fewer), whatever its output bits.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>
#include <unordered_map>

#include "backend/tensor.h"

namespace st::cuda {

class Matmul {
 public:
  explicit Matmul(cudaStream_t stream);
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  // out (N, OC) = inp (N, IC) · weight (OC, IC)ᵀ + bias (OC, optional); all of one
  // dtype (BF16 or F32), fp32 accumulation.
  void forward(Tensor out, Tensor inp, Tensor weight, Tensor bias, int N, int IC, int OC);
  // dinp (N, IC) = dout (N, OC) · weight (OC, IC), in the activation dtype.
  void backward_input(Tensor dinp, Tensor dout, Tensor weight, int N, int IC, int OC);
  // dweight (OC, IC) F32 += dout (N, OC)ᵀ · inp (N, IC).
  void backward_weight(Tensor dweight, Tensor dout, Tensor inp, int N, int IC, int OC);

  // out (M, N) = a (M, K) · b (N, K)ᵀ · *a_inv · *b_inv (+ bias): the FP8 GEMM of
  // Backend::matmul_fp8 (a, b e4m3/e5m2; out BF16 or F32, F32 accumulated when
  // `accumulate`). Row-major NT is cuBLASLt's column-major TN, the one layout FP8
  // tensor cores take on sm_89 and sm_90. Split (fp32) accumulation unless
  // `fast_accum` allows the tensor cores' faster, narrower one.
  void fp8(Tensor out, Tensor a, Tensor a_inv, Tensor b, Tensor b_inv, Tensor bias, int M, int K, int N,
           bool accumulate, bool fast_accum);

  size_t workspace_bytes() const { return workspace_bytes_; }

 private:
  // One column-major GEMM: D (m, n) = op(A) op(B) + beta D, where A is stored
  // (transa ? k x m : m x k) with leading dimension lda, likewise B; D has ldd = m.
  struct Gemm {
    bool transa, transb;
    int m, n, k;
    const void* A;
    int lda;
    const void* B;
    int ldb;
    cudaDataType_t ab_type;
    void* D;
    cudaDataType_t d_type;
    float beta;
    const void* bias = nullptr;  // (m) added by the epilogue when set
    int b_type = -1;                // B's cudaDataType_t where it differs from A's (FP8)
    const void* a_scale = nullptr;  // device floats multiplying A and B (FP8)
    const void* b_scale = nullptr;
    bool fast_accum = false;        // FP8: the tensor cores' own accumulation
  };
  // Returns false when cuBLASLt has no algorithm for the problem as given.
  bool run(const Gemm& g);
  // run(), and when that finds no algorithm (say, for an operand at an odd address),
  // again on 256-byte aligned copies of the operands; fails if that finds none either.
  void gemm(Gemm g);
  // gemm() with bias (cols, may be empty) added to out (rows, cols): by the epilogue
  // where an algorithm has it for an aligned bias, else by a separate kernel.
  void gemm_with_bias(Gemm g, Tensor out, Tensor bias, int rows, int cols);

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  struct Cached {
    bool found;
    cublasLtMatmulAlgo_t algo;
  };
  // Index into `results` of the fastest candidate with the same output bits as
  // results[0]; runs them on g's operands (D restored afterwards when beta != 0).
  int tune(const Gemm& g, const std::string& key, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
           cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d, const cublasLtMatmulHeuristicResult_t* results,
           int count);
  bool tuning_ = false;
  int forced_ = -1;  // SHARDTRAIN_GEMM_ALGO
  bool verbose_ = false;
  void* scales_ = nullptr;  // FP8: 16-byte aligned copies of the two scales (512 bytes)
  std::unordered_map<std::string, Cached> algos_;
};

}  // namespace st::cuda

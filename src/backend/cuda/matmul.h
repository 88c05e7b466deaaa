// The linear layer's GEMMs through cuBLASLt: one handle, one workspace, one stream
// (the backend's), and a cache of the heuristic's algorithm per problem shape.
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
  };
  // Returns false when cuBLASLt has no algorithm for the problem as given.
  bool run(const Gemm& g);
  // run(), and when that finds no algorithm (say, for an operand at an odd address),
  // again on 256-byte aligned copies of the operands; fails if that finds none either.
  void gemm(Gemm g);

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  struct Cached {
    bool found;
    cublasLtMatmulAlgo_t algo;
  };
  std::unordered_map<std::string, Cached> algos_;
};

}  // namespace st::cuda

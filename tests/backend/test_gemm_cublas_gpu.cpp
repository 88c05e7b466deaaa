// The training GEMMs of Qwen2.5-1.5B through cuBLASLt, every algorithm the heuristic
// offers: time (and TFLOP/s) per algorithm, its tile/split-K/reduction settings, and
// whether its output is bitwise the same as the heuristic's first pick. A benchmark
// (DISABLED_, run by hand with --gtest_also_run_disabled_tests), not a timed test.
// GEMM_N sets the token count (default 49152: micro-batch 24 x 2048).
#include <gtest/gtest.h>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"

namespace {

#define CK(x) ASSERT_EQ((x), cudaSuccess) << #x
#define LT(x) ASSERT_EQ((x), CUBLAS_STATUS_SUCCESS) << #x

struct Shape {
  const char* name;
  bool ta, tb;
  int m, n, k;
  bool f32_out_beta1;  // weight gradient: D f32 += A·B
};

uint64_t checksum(const void* dev, size_t bytes) {
  std::vector<uint64_t> h((bytes + 7) / 8, 0);
  cudaMemcpy(h.data(), dev, bytes, cudaMemcpyDeviceToHost);
  uint64_t s = 1469598103934665603ull;
  for (uint64_t v : h) s = (s ^ v) * 1099511628211ull;
  return s;
}

TEST(GemmAlgos, DISABLED_AlgoSpeed) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int N = std::getenv("GEMM_N") ? std::atoi(std::getenv("GEMM_N")) : 49152;
  const int C = 1536, QKV = 2048, F = 8960, V = 151936, R = 4096;
  const std::vector<Shape> shapes = {
      {"fwd qkv", true, false, QKV, N, C, false},      {"fwd o", true, false, C, N, C, false},
      {"fwd gate_up", true, false, 2 * F, N, C, false}, {"fwd down", true, false, C, N, F, false},
      {"fwd lm_head", true, false, V, R, C, false},     {"dinp qkv", false, false, C, N, QKV, false},
      {"dinp o", false, false, C, N, C, false},         {"dinp gate_up", false, false, C, N, 2 * F, false},
      {"dinp down", false, false, F, N, C, false},      {"dinp lm_head", false, false, C, R, V, false},
      {"dw qkv", false, true, C, QKV, N, true},         {"dw o", false, true, C, C, N, true},
      {"dw gate_up", false, true, C, 2 * F, N, true},   {"dw down", false, true, F, C, N, true},
      {"dw lm_head", false, true, C, V, R, true},
  };
  cublasLtHandle_t lt;
  LT(cublasLtCreate(&lt));
  const size_t ws_bytes = size_t(32) << 20;
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::mt19937 rng(7);
  double best_total = 0, heur_total = 0, best_same_total = 0;
  for (const Shape& s : shapes) {
    const size_t a_el = size_t(s.m) * s.k, b_el = size_t(s.k) * s.n, d_el = size_t(s.m) * s.n;
    const size_t d_bytes = d_el * (s.f32_out_beta1 ? 4 : 2);
    void *A, *B, *D, *D0;
    CK(cudaMalloc(&A, a_el * 2));
    CK(cudaMalloc(&B, b_el * 2));
    CK(cudaMalloc(&D, d_bytes));
    CK(cudaMalloc(&D0, d_bytes));
    {
      std::vector<__nv_bfloat16> h(std::max(a_el, b_el));
      std::uniform_real_distribution<float> u(-1, 1);
      for (auto& x : h) x = __float2bfloat16(u(rng));
      CK(cudaMemcpy(A, h.data(), a_el * 2, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(B, h.data(), b_el * 2, cudaMemcpyHostToDevice));
      CK(cudaMemset(D0, 0, d_bytes));
    }
    cublasLtMatmulDesc_t desc;
    LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    cublasLtMatrixLayout_t la, lb, ld;
    const cudaDataType_t dt = s.f32_out_beta1 ? CUDA_R_32F : CUDA_R_16BF;
    LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.ta ? s.k : s.m, s.ta ? s.m : s.k, s.ta ? s.k : s.m));
    LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.tb ? s.n : s.k, s.tb ? s.k : s.n, s.tb ? s.n : s.k));
    LT(cublasLtMatrixLayoutCreate(&ld, dt, s.m, s.n, s.m));
    cublasLtMatmulPreference_t pref;
    LT(cublasLtMatmulPreferenceCreate(&pref));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                            sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t res[32];
    int found = 0;
    LT(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 32, res, &found));
    const float alpha = 1, beta = s.f32_out_beta1 ? 1.f : 0.f;
    const double flops = 2.0 * s.m * s.n * s.k;
    double t_heur = 0, t_best = 1e30, t_best_same = 1e30;
    uint64_t ref = 0;
    std::printf("%-13s m=%6d n=%6d k=%6d: %d algos\n", s.name, s.m, s.n, s.k, found);
    for (int i = 0; i < found; i++) {
      if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
      auto run = [&] {
        return cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &res[i].algo, ws, ws_bytes,
                              stream);
      };
      CK(cudaMemcpyAsync(D, D0, d_bytes, cudaMemcpyDeviceToDevice, stream));
      if (run() != CUBLAS_STATUS_SUCCESS) {
        std::printf("  #%2d failed to run\n", i);
        continue;
      }
      CK(cudaStreamSynchronize(stream));
      const uint64_t sum = checksum(D, d_bytes);
      if (i == 0) ref = sum;
      for (int w = 0; w < 2; w++) run();
      const int reps = 10;
      CK(cudaEventRecord(e0, stream));
      for (int r = 0; r < reps; r++) run();
      CK(cudaEventRecord(e1, stream));
      CK(cudaEventSynchronize(e1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      const double us = 1000.0 * ms / reps;
      int tile = 0, splitk = 0, red = 0, stages = 0, cluster = 0, id = 0;
      size_t n = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &n);
      cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &n);
      cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &n);
      cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red, &n);
      cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &n);
      cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                           sizeof cluster, &n);
      const bool same = sum == ref;
      std::printf("  #%2d id %3d tile %3d stages %3d cluster %2d splitk %2d red %d ws %8zu: %9.1f us %6.1f TFLOP/s %s\n",
                  i, id, tile, stages, cluster, splitk, red, res[i].workspaceSize, us, flops / us * 1e-6,
                  same ? "same bits" : "DIFFERENT bits");
      if (i == 0) t_heur = us;
      t_best = std::min(t_best, us);
      if (same) t_best_same = std::min(t_best_same, us);
    }
    std::printf("  => heuristic %.1f us, best %.1f us (%.3fx), best with the same bits %.1f us (%.3fx)\n", t_heur,
                t_best, t_heur / t_best, t_best_same, t_heur / t_best_same);
    heur_total += t_heur, best_total += t_best, best_same_total += t_best_same;
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(A), cudaFree(B), cudaFree(D), cudaFree(D0);
  }
  std::printf("all shapes once: heuristic %.0f us, best %.0f us (%.3fx), best with the same bits %.0f us (%.3fx)\n",
              heur_total, best_total, heur_total / best_total, best_same_total, heur_total / best_same_total);
  cudaFree(ws);
  cublasLtDestroy(lt);
}

}  // namespace

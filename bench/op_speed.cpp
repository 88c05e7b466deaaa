// Not a check: the speed of the CUDA ops at Qwen2.5-1.5B's shapes, for the performance
// log. Results go into docs/performance.md with the command, device, date and commit.
// Built in CUDA builds with the tests (bench/CMakeLists.txt), not a ctest case; on a
// GPU machine, from the repository root:
//
//   build/bench/bench_op_speed                                     # everything
//   build/bench/bench_op_speed --gtest_filter='*MemoryBoundSpeed*'  # one part
//
// A GoogleTest program on the op tests' harness (tests/support/op_harness.h): it
// skips without a CUDA device, and its checks on the way fail it as in the tests.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "support/op_harness.h"

namespace st::testing {
namespace {

// The mean wall time of fn() over `reps` calls after `warmup` untimed ones, in
// milliseconds, with the device synchronised before and after the timed calls.
template <class Fn>
double mean_ms(Backend& be, int warmup, int reps, Fn&& fn) {
  for (int i = 0; i < warmup; i++) fn();
  be.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; i++) fn();
  be.synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
}

// The attention kernels at Qwen2.5-1.5B's shape. Times the legacy kernels
// (SHARDTRAIN_ATTENTION=legacy) and the FlashAttention-2 ones at hd 128 and 64, and
// checks the FA2 results against the legacy kernels' at this shape (both are checked
// against the CPU at small shapes in tests/backend/ops/test_op_attention.cpp).
TEST_F(CudaOps, AttentionSpeed) {
  struct Env {  // restores the default on the way out, whatever happens
    ~Env() { unsetenv("SHARDTRAIN_ATTENTION"); }
  } env_guard;
  const int B = 4, T = 2048, H = 12, KV = 2;
  for (const int hd : {128, 64}) {
    const size_t rows = size_t(B) * T, nqkv = rows * (H + 2 * KV) * hd, nout = rows * H * hd;
    Tensor qkv = gpu_from(randv(nqkv, -2, 2), DType::BF16), out = make(gpu(), DType::BF16, nout);
    Tensor lse = make(gpu(), DType::F32, size_t(B) * H * T), dqkv = make(gpu(), DType::BF16, nqkv);
    Tensor dout = gpu_from(randv(nout), DType::BF16);
    Tensor out_ref = make(gpu(), DType::BF16, nout), lse_ref = make(gpu(), DType::F32, size_t(B) * H * T);
    Tensor dqkv_ref = make(gpu(), DType::BF16, nqkv);
    auto time_ms = [&](auto&& fn) { return mean_ms(gpu(), 3, 20, fn); };
    // Causal: half of the 4·B·H·T²·hd forward FLOPs; the backward does 2.5x the forward's work.
    const double flop = 4.0 * B * H * double(T) * T * hd / 2;
    auto report = [&](const char* name, double fwd, double bwd) {
      std::printf("attention %-14s B=%d T=%d H=%d KV=%d hd=%d: forward %.3f ms (%.1f TFLOP/s), backward %.3f ms "
                  "(%.1f TFLOP/s)\n",
                  name, B, T, H, KV, hd, fwd, flop / fwd * 1e-9, bwd, 2.5 * flop / bwd * 1e-9);
    };
    // Legacy: the reference results and times. Both backward runs read the legacy forward's out and lse.
    setenv("SHARDTRAIN_ATTENTION", "legacy", 1);
    const double lf = time_ms([&] { gpu().attention_forward(out_ref, lse_ref, qkv, B, T, H, KV, hd); });
    const double lb =
        time_ms([&] { gpu().attention_backward(dqkv_ref, dout, out_ref, lse_ref, qkv, B, T, H, KV, hd); });
    report("legacy", lf, lb);
    const Vec o_ref = get(out_ref), l_ref = get(lse_ref), d_ref = get(dqkv_ref);
    unsetenv("SHARDTRAIN_ATTENTION");
    gpu().fill(out, NAN), gpu().fill(lse, NAN), gpu().fill(dqkv, NAN);
    for (const char* run : {"fa2", "fa2 (again)"}) {  // twice: the spread between runs is the noise
      const double f = time_ms([&] { gpu().attention_forward(out, lse, qkv, B, T, H, KV, hd); });
      const double b = time_ms([&] { gpu().attention_backward(dqkv, dout, out_ref, lse_ref, qkv, B, T, H, KV, hd); });
      report(run, f, b);
    }
    const std::string tagv = " hd=" + std::to_string(hd) + " vs legacy";
    expect_close("fa2 out" + tagv, get(out), o_ref, 1e-2);
    expect_close("fa2 lse" + tagv, get(lse), l_ref, 1e-5);
    const auto gparts = qkv_parts(get(dqkv), rows, H, KV, hd), rparts = qkv_parts(d_ref, rows, H, KV, hd);
    for (size_t p = 0; p < gparts.size(); p++)
      expect_close("fa2 " + gparts[p].first + tagv, gparts[p].second, rparts[p].second, 1e-2);
  }

  // The MLP's gate_up GEMM at the same token count, for scale (cuBLASLt).
  const int N = B * T, IC = 1536, OC = 2 * 8960;
  auto time_ms = [&](auto&& fn) { return mean_ms(gpu(), 1, 5, fn); };
  Tensor x = gpu_from(randv(size_t(N) * IC), DType::BF16), w = gpu_from(randv(size_t(OC) * IC), DType::BF16);
  Tensor y = make(gpu(), DType::BF16, size_t(N) * OC), dw = make(gpu(), DType::F32, size_t(OC) * IC);
  const double mf = time_ms([&] { gpu().matmul_forward(y, x, w, Tensor{}, N, IC, OC); });
  const double mb = time_ms([&] { gpu().matmul_backward(x, dw, Tensor{}, y, x, w, N, IC, OC); });
  const double mflop = 2.0 * N * IC * OC;
  std::printf("matmul N=%d IC=%d OC=%d: forward %.3f ms (%.0f TFLOP/s), backward %.3f ms (%.0f TFLOP/s)\n", N, IC,
              OC, mf, mflop / mf * 1e-9, mb, 2 * mflop / mb * 1e-9);
}

// The memory-bound kernels at the training shape of Qwen2.5-1.5B (micro-batch 8 x 2048
// tokens), with the bytes each must move and the rate that makes.
// (cross_entropy's time includes the id check's synchronisation.)
TEST_F(CudaOps, MemoryBoundSpeed) {
  const int N = 16384, C = 1536, F = 8960, V = 151936, chunk = 4096, H = 12, KV = 2, hd = 128;
  const DType bf = DType::BF16;
  auto time_us = [&](auto&& fn) { return 1e3 * mean_ms(gpu(), 3, 20, fn); };
  auto report = [](const char* name, double us, double bytes) {
    std::printf("%-28s %9.1f us  %7.1f MB  %6.2f TB/s\n", name, us, bytes * 1e-6, bytes / us * 1e-6);
  };
  const size_t nc = size_t(N) * C, nf = size_t(N) * F;
  Tensor a = gpu_from(randv(nc), bf), b = gpu_from(randv(nc), bf), w = gpu_from(randv(C, 0.5, 1.5), bf);
  Tensor sum = make(gpu(), bf, nc), out = make(gpu(), bf, nc), rstd = make(gpu(), DType::F32, N);
  Tensor dinp = make(gpu(), bf, nc), dw = make(gpu(), DType::F32, C);
  report("add", time_us([&] { gpu().add(sum, a, b, nc); }), 3.0 * nc * 2);
  report("accumulate", time_us([&] { gpu().accumulate(sum, a, nc); }), 3.0 * nc * 2);
  report("rmsnorm_forward", time_us([&] { gpu().rmsnorm_forward(out, rstd, a, w, N, C, 1e-6f); }), 2.0 * nc * 2);
  report("add_rmsnorm_forward",
         time_us([&] { gpu().add_rmsnorm_forward(sum, out, rstd, a, b, w, N, C, 1e-6f); }), 4.0 * nc * 2);
  report("rmsnorm_backward", time_us([&] { gpu().rmsnorm_backward(dinp, dw, a, b, w, rstd, N, C); }), 4.0 * nc * 2);
  {
    Tensor gu = gpu_from(randv(2 * nf, -4, 4), bf), y = make(gpu(), bf, nf), dy = gpu_from(randv(nf), bf);
    Tensor dgu = make(gpu(), bf, 2 * nf);
    report("swiglu_forward", time_us([&] { gpu().swiglu_forward(y, gu, N, F); }), 3.0 * nf * 2);
    report("swiglu_backward", time_us([&] { gpu().swiglu_backward(dgu, dy, gu, N, F); }), 5.0 * nf * 2);
  }
  {
    const size_t nq = size_t(N) * (H + 2 * KV) * hd;
    Tensor qkv = gpu_from(randv(nq), bf);
    report("rope_forward", time_us([&] { gpu().rope_forward(qkv, 8, 2048, H, KV, hd, 1e6f); }),
           2.0 * N * (H + KV) * hd * 2);
  }
  {
    const size_t nl = size_t(chunk) * V;
    Tensor logits = gpu_from(randv(nl, -8, 8), bf), losses = make(gpu(), DType::F32, chunk);
    std::vector<int32_t> tg(chunk);
    for (auto& t : tg) t = int32_t(rng() % V);
    Tensor targets = gpu_ids(tg);
    report("cross_entropy (4096 rows)",
           time_us([&] { gpu().cross_entropy(losses, logits, targets, chunk, V, -100, 1.0f, true); }), 3.0 * nl * 2);
  }
}

// The FP8 casts at Qwen2.5-1.5B's training shape on an H100 (micro-batch 12 x 2048
// tokens), delayed scaling (the scale given, the amax recorded), both layouts written
// as the FP8 linear layers ask for them, with the bytes each moves and its rate.
TEST_F(CudaOps, Fp8CastSpeed) {
  const int N = 24576, C = 1536, F = 8960;
  const DType bf = DType::BF16, e4 = DType::F8E4M3, e5 = DType::F8E5M2;
  auto time_us = [&](auto&& fn) { return 1e3 * mean_ms(gpu(), 3, 20, fn); };
  auto report = [](const char* name, double us, double bytes) {
    std::printf("%-34s %9.1f us  %7.1f MB  %6.2f TB/s\n", name, us, bytes * 1e-6, bytes / us * 1e-6);
  };
  const size_t nc = size_t(N) * C, nf = size_t(N) * F;
  Tensor inv = gpu_from({1.0f / 64}, DType::F32), amax = gpu_from({0.0f}, DType::F32);
  {
    Tensor x = gpu_from(randv(nc), bf), q = make(gpu(), e4, nc), qt = make(gpu(), e4, nc);
    report("fp8_quantize N x C, q + qt", time_us([&] { gpu().fp8_quantize(q, qt, inv, x, N, C, true, amax); }),
           4.0 * nc);
    report("fp8_quantize N x C, qt", time_us([&] { gpu().fp8_quantize(Tensor{}, qt, inv, x, N, C, true, amax); }),
           3.0 * nc);
  }
  Tensor gu = gpu_from(randv(2 * nf, -4, 4), bf), y = make(gpu(), bf, nf);
  Tensor q = make(gpu(), e4, nf), qt = make(gpu(), e4, nf);
  report("swiglu_forward (bf16 out)", time_us([&] { gpu().swiglu_forward(y, gu, N, F); }), 6.0 * nf);
  report("fp8_quantize N x F, q + qt", time_us([&] { gpu().fp8_quantize(q, qt, inv, y, N, F, true, amax); }),
         4.0 * nf);
  report("swiglu_forward_fp8, q + qt", time_us([&] { gpu().swiglu_forward_fp8(q, qt, inv, amax, gu, N, F); }),
         6.0 * nf);
  report("swiglu_forward_fp8, qt", time_us([&] { gpu().swiglu_forward_fp8(Tensor{}, qt, inv, amax, gu, N, F); }),
         5.0 * nf);
  Tensor dy = gpu_from(randv(nf), bf), dgu = make(gpu(), bf, 2 * nf);
  Tensor dq = make(gpu(), e5, 2 * nf), dqt = make(gpu(), e5, 2 * nf);
  report("swiglu_backward (bf16 out)", time_us([&] { gpu().swiglu_backward(dgu, dy, gu, N, F); }), 10.0 * nf);
  report("swiglu_backward_fp8, q + qt",
         time_us([&] { gpu().swiglu_backward_fp8(dq, dqt, inv, amax, dy, gu, N, F); }), 10.0 * nf);
  // The loss over one 4,096-row chunk of logits (the lm_head's): the bf16 gradient
  // alone, with its e5m2 copy, and the copy with its transpose (no bf16 gradient
  // written, the codes read back for the transpose). Bytes count the row's two reads.
  {
    const int chunk = 4096, V = 151936;
    const size_t nl = size_t(chunk) * V;
    Tensor logits = gpu_from(randv(nl, -8, 8), bf), losses = make(gpu(), DType::F32, chunk);
    Tensor lq = make(gpu(), e5, nl), lqt = make(gpu(), e5, nl), linv = make(gpu(), DType::F32, 1);
    std::vector<int32_t> tg(chunk);
    for (auto& t : tg) t = int32_t(rng() % V);
    Tensor targets = gpu_ids(tg);
    report("cross_entropy (bf16 gradient)",
           time_us([&] { gpu().cross_entropy(losses, logits, targets, chunk, V, -100, 1.0f / N, true); }),
           6.0 * nl);
    report("cross_entropy_fp8, + e5m2",
           time_us([&] {
             gpu().cross_entropy_fp8(losses, logits, lq, Tensor{}, linv, targets, chunk, V, -100, 1.0f / N);
           }),
           7.0 * nl);
    report("cross_entropy_fp8, e5m2 + T",
           time_us([&] {
             gpu().cross_entropy_fp8(losses, logits, lq, lqt, linv, targets, chunk, V, -100, 1.0f / N);
           }),
           7.0 * nl);
  }
}

}  // namespace
}  // namespace st::testing

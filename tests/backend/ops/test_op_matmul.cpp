// matmul_forward / matmul_backward: the CPU against naive sums and finite
// differences, with and without bias; CUDA against the CPU (dweight and dbias
// accumulate, an empty dinp is skipped) at aligned and unaligned slices; and the GEMM
// algorithm tuning, which changes no bits.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "support/op_harness.h"

namespace st::testing {
namespace {

// ---- CPU ------------------------------------------------------------------------------

class CpuMatmul : public CpuOps, public ::testing::WithParamInterface<bool> {};

TEST_P(CpuMatmul, ForwardAndBackward) {
  const bool with_bias = GetParam();
  const int N = 4, IC = 5, OC = 3;
  Tensor x = rand(N * IC), wt = rand(OC * IC), b = with_bias ? rand(OC) : Tensor{};
  Tensor out = make(DType::F64, N * OC);
  be->matmul_forward(out, x, wt, b, N, IC, OC);
  Vec xv = get(x), wv = get(wt), bv = with_bias ? get(b) : Vec(OC, 0.0), ov = get(out);
  for (int r = 0; r < N; r++)
    for (int o = 0; o < OC; o++) {
      double s = bv[o];
      for (int i = 0; i < IC; i++) s += xv[r * IC + i] * wv[o * IC + i];
      EXPECT_NEAR(ov[r * OC + o], s, 1e-14);
    }

  Vec w = randv(N * OC), dw0 = randv(OC * IC), db0 = randv(OC);
  Tensor dx = rand(N * IC);  // garbage: dinp is overwritten
  Tensor dw = from(dw0), db = with_bias ? from(db0) : Tensor{};
  be->matmul_backward(dx, dw, db, from(w), x, wt, N, IC, OC);
  auto loss = [&] {
    be->matmul_forward(out, x, wt, b, N, IC, OC);
    return wsum(w, out);
  };
  expect_grad("dinp", x, get(dx), loss);
  expect_grad("dweight", wt, minus(get(dw), dw0), loss);
  if (with_bias) expect_grad("dbias", b, minus(get(db), db0), loss);

  // An empty dinp is skipped; dweight keeps accumulating.
  Vec dw1 = get(dw);
  be->matmul_backward(Tensor{}, dw, db, from(w), x, wt, N, IC, OC);
  Vec dw2 = get(dw);
  for (int i = 0; i < OC * IC; i++) EXPECT_NEAR(dw2[i] - dw1[i], dw1[i] - dw0[i], 1e-14);
}
INSTANTIATE_TEST_SUITE_P(Bias, CpuMatmul, ::testing::Bool());

// ---- CUDA -----------------------------------------------------------------------------

struct MatmulShape {
  int N, IC, OC;
  bool bias;
  size_t offset;  // weight and bias start this many elements into their buffer (alignment)
};
class CudaMatmul : public CudaOps, public ::testing::WithParamInterface<MatmulShape> {};

TEST_P(CudaMatmul, ForwardAndBackwardAccumulate) {
  const auto [N, IC, OC, with_bias, off] = GetParam();
  for (DType dt : kBoth) {
    Vec x = randv_as(dt, size_t(N) * IC), w = randv_as(dt, off + size_t(OC) * IC), b = randv_as(dt, off + OC);
    Vec dy = randv_as(dt, size_t(N) * OC), dw0 = randv(size_t(OC) * IC), db0 = randv(OC);
    // CPU: out, then the backward twice (dweight and dbias must accumulate).
    Tensor cx = cpu_from(x), cw = cpu_from(w).slice(off, size_t(OC) * IC);
    Tensor cb = with_bias ? cpu_from(b).slice(off, OC) : Tensor{};
    Tensor co = make(*cpu, DType::F32, size_t(N) * OC), cdx = make(*cpu, DType::F32, size_t(N) * IC);
    Tensor cdw = cpu_from(dw0), cdb = with_bias ? cpu_from(db0) : Tensor{}, cdy = cpu_from(dy);
    cpu->matmul_forward(co, cx, cw, cb, N, IC, OC);
    cpu->matmul_backward(cdx, cdw, cdb, cdy, cx, cw, N, IC, OC);
    cpu->matmul_backward(Tensor{}, cdw, cdb, cdy, cx, cw, N, IC, OC);

    Tensor gx = gpu_from(x, dt), gw = gpu_from(w, dt).slice(off, size_t(OC) * IC);
    Tensor gb = with_bias ? gpu_from(b, dt).slice(off, OC) : Tensor{};
    Tensor go = gpu_poisoned(dt, size_t(N) * OC), gdx = gpu_poisoned(dt, size_t(N) * IC);
    Tensor gdw = gpu_from(dw0, DType::F32), gdb = with_bias ? gpu_from(db0, DType::F32) : Tensor{};
    Tensor gdy = gpu_from(dy, dt);
    gpu().matmul_forward(go, gx, gw, gb, N, IC, OC);
    gpu().matmul_backward(gdx, gdw, gdb, gdy, gx, gw, N, IC, OC);
    gpu().matmul_backward(Tensor{}, gdw, gdb, gdy, gx, gw, N, IC, OC);  // empty dinp: skipped
    expect_close(tag(dt, "matmul out"), get(go), cget(co), tolerance(dt));
    expect_close(tag(dt, "matmul dinp"), get(gdx), cget(cdx), tolerance(dt));
    // F32 output from exact bf16 products summed in fp32: far tighter than bf16 outputs.
    expect_close(tag(dt, "matmul dweight (+= twice)"), get(gdw), cget(cdw), dt == DType::F32 ? 1e-4 : 1e-3);
    if (with_bias) expect_close(tag(dt, "matmul dbias (+= twice)"), get(gdb), cget(cdb), 1e-4);
  }
}
INSTANTIATE_TEST_SUITE_P(Shapes, CudaMatmul,
                         ::testing::Values(MatmulShape{37, 72, 100, false, 0}, MatmulShape{37, 72, 100, true, 0},
                                           MatmulShape{256, 512, 384, true, 0},
                                           MatmulShape{33, 64, 48, true, 1},    // 2-byte aligned slices
                                           MatmulShape{64, 96, 40, false, 3}),  // odd offset, no bias
                         [](const auto& info) {
                           const MatmulShape& s = info.param;
                           return "N" + std::to_string(s.N) + "IC" + std::to_string(s.IC) + "OC" +
                                  std::to_string(s.OC) + (s.bias ? "Bias" : "NoBias") + "Off" +
                                  std::to_string(s.offset);
                         });

// The GEMM algorithm tuning (SHARDTRAIN_GEMM_TUNE=1) keeps only algorithms whose output is the
// heuristic first pick's bit for bit: a backend with it and one without give the same
// bytes for the forward, the input gradient and the accumulated weight gradient, on
// shapes large enough for the heuristic to offer several algorithms.
TEST_F(CudaOps, GemmTuningChangesNoBits) {
  const DType bf = DType::BF16;
  struct Out {
    std::vector<uint8_t> y, dx, dw;
  };
  auto run = [&](const char* tune, int N, int IC, int OC, uint64_t seed) {
    setenv("SHARDTRAIN_GEMM_TUNE", tune, 1);
    std::unique_ptr<Backend> be = make_cuda_backend(0);
    unsetenv("SHARDTRAIN_GEMM_TUNE");
    std::mt19937_64 r(seed);
    std::uniform_real_distribution<float> u(-1, 1);
    auto up = [&](DType dt, size_t n) {
      Vec v(n);
      for (auto& x : v) x = u(r);
      Tensor t = be->alloc(dt, n);
      if (dt == DType::BF16) {
        std::vector<uint16_t> h(n);
        for (size_t i = 0; i < n; i++) h[i] = f32_to_bf16(v[i]);
        be->upload(t, h.data());
      } else {
        be->upload(t, v.data());
      }
      return t;
    };
    Tensor x = up(bf, size_t(N) * IC), w = up(bf, size_t(OC) * IC), dy = up(bf, size_t(N) * OC);
    Tensor dw = up(DType::F32, size_t(OC) * IC);  // accumulated into
    Tensor y = be->alloc(bf, size_t(N) * OC), dx = be->alloc(bf, size_t(N) * IC);
    be->matmul_forward(y, x, w, Tensor{}, N, IC, OC);
    be->matmul_backward(dx, dw, Tensor{}, dy, x, w, N, IC, OC);
    auto bytes = [&](Tensor t) {
      std::vector<uint8_t> b(t.bytes());
      be->download(b.data(), t);
      return b;
    };
    Out o{bytes(y), bytes(dx), bytes(dw)};
    for (Tensor t : {x, w, dy, dw, y, dx}) be->free(t);
    return o;
  };
  for (auto [N, IC, OC] : {std::tuple{4096, 1536, 2048}, std::tuple{8192, 1536, 8960}, std::tuple{2048, 8960, 1536}}) {
    const uint64_t seed = rng();
    const Out tuned = run("1", N, IC, OC, seed), plain = run("0", N, IC, OC, seed);
    const std::string shape = std::to_string(N) + "x" + std::to_string(IC) + "->" + std::to_string(OC);
    EXPECT_TRUE(tuned.y == plain.y) << shape << ": forward differs";
    EXPECT_TRUE(tuned.dx == plain.dx) << shape << ": input gradient differs";
    EXPECT_TRUE(tuned.dw == plain.dw) << shape << ": weight gradient differs";
  }
}

}  // namespace
}  // namespace st::testing

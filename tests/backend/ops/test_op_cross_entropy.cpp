// cross_entropy (fused forward + backward over the logits): the CPU against hand
// values and finite differences, ignored rows and grad=false; CUDA against the CPU at
// Qwen2's vocabulary, every alignment of a row, deterministic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "support/op_harness.h"

namespace st::testing {
namespace {

// ---- CPU ------------------------------------------------------------------------------

TEST_F(CpuOps, CrossEntropyHandValues) {
  const int N = 3, V = 4;
  const float scale = 0.5f;
  Vec x0 = {1, 2, 3, 4, 1000, 0, 0, 1000, 5, 6, 7, 8};
  Tensor logits = from(x0), losses = make(DType::F64, N), tgt = ids({3, 1, -100});
  be->cross_entropy(losses, logits, tgt, N, V, -100, scale, false);
  EXPECT_EQ(get(logits), x0) << "grad=false leaves the logits alone";
  Vec l = get(losses);
  EXPECT_NEAR(l[0], std::log(1 + std::exp(-1.0) + std::exp(-2.0) + std::exp(-3.0)), 1e-14);
  EXPECT_NEAR(l[1], 1000 + std::log(2.0), 1e-12);  // needs the max subtraction
  EXPECT_EQ(l[2], 0.0);

  be->cross_entropy(losses, logits, tgt, N, V, -100, scale, true);
  Vec g = get(logits);
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + std::exp(4.0);
  const Vec g1 = {0.25, -0.5, 0, 0.25};  // softmax (1/2, 0, 0, 1/2) minus onehot(1), times 1/2
  for (int i = 0; i < V; i++) {
    EXPECT_NEAR(g[i], scale * (std::exp(i + 1.0) / z - (i == 3)), 1e-14);
    EXPECT_NEAR(g[V + i], g1[i], 1e-12);  // exp(-log 2) after lse = 1000 + log 2 rounds at 1e-13
  }
  EXPECT_EQ(Vec(g.begin() + 8, g.end()), Vec(4, 0.0)) << "ignored rows get a zero gradient";
  EXPECT_EQ(get(losses), l) << "grad=true reports the same losses";
}

TEST_F(CpuOps, CrossEntropyGradientMatchesFiniteDifferences) {
  const int N = 5, V = 7;
  const float scale = 0.75f;
  Tensor x = rand(N * V, -3, 3), work = make(DType::F64, N * V), losses = make(DType::F64, N);
  Tensor tgt = ids({2, 6, -1, 0, 2});
  be->copy(work, x);
  be->cross_entropy(losses, work, tgt, N, V, -1, scale, true);
  // L = scale · Σ losses, whose gradient the fused backward writes into the logits.
  expect_grad("dlogits", x, get(work), [&] {
    be->copy(work, x);
    be->cross_entropy(losses, work, tgt, N, V, -1, scale, false);
    double s = 0;
    for (double v : get(losses)) s += v;
    return double(scale) * s;
  });
}

// ---- CUDA -----------------------------------------------------------------------------

// Row 2 of every case is ignored. V = 151936 (Qwen2's vocabulary) with aligned rows, and
// at an offset that puts the targets in a row's scalar head (0), its 16-byte packs and
// its scalar tail (151935); V = 1001 gives each row another alignment.
TEST_F(CudaOps, CrossEntropy) {
  struct Case {
    int N, V;
    std::vector<int32_t> targets;
    size_t off = 0;  // logits start this many elements into their buffer
  };
  const float scale = 0.25f;
  for (const Case& k : {Case{5, 7, {2, 6, -100, 0, 2}}, Case{4, 151936, {5, 151935, -100, 77}},
                        Case{4, 151936, {0, 151935, -100, 151930}, 3},
                        Case{7, 1001, {0, 1000, -100, 500, 3, 999, 8}, 1}}) {
    const int N = k.N, V = k.V;
    for (DType dt : kBoth) {
      Vec x = randv_as(dt, size_t(N) * V, -8, 8);
      Tensor cx = cpu_from(x), cl = make(*cpu, DType::F32, N);
      cpu->cross_entropy(cl, cx, cpu_ids(k.targets), N, V, -100, scale, true);

      Tensor gt = gpu_ids(k.targets), gx = gpu_from_at(x, dt, k.off), gl = gpu_poisoned(DType::F32, N);
      gpu().cross_entropy(gl, gx, gt, N, V, -100, scale, false);
      EXPECT_EQ(get(gx), x) << "grad=false leaves the logits alone";
      Vec loss_nograd = get(gl);
      gpu().fill(gl, NAN);
      gpu().cross_entropy(gl, gx, gt, N, V, -100, scale, true);
      const std::string v = " V=" + std::to_string(V) + " offset " + std::to_string(k.off);
      // The loss is computed from the same (rounded) logits in fp32: tight either way.
      expect_close(tag(dt, "cross-entropy losses" + v), get(gl), cget(cl), 1e-5);
      EXPECT_EQ(get(gl), loss_nograd) << "grad=true reports the same losses";
      EXPECT_EQ(get(gl)[2], 0.0f) << "ignored row";
      Vec g = get(gx);
      expect_close(tag(dt, "cross-entropy dlogits" + v), g, cget(cx), tolerance(dt));
      for (int i = 0; i < V; i++) ASSERT_EQ(g[size_t(2) * V + i], 0.0f) << "ignored rows get a zero gradient";
      // Deterministic: a second run on the same logits gives the same bits.
      Tensor gx2 = gpu_from_at(x, dt, k.off), gl2 = gpu_poisoned(DType::F32, N);
      gpu().cross_entropy(gl2, gx2, gt, N, V, -100, scale, true);
      EXPECT_TRUE(raw(gx2) == raw(gx) && raw(gl2) == raw(gl)) << tag(dt, "cross-entropy") << v << ": not deterministic";
    }
  }
}

}  // namespace
}  // namespace st::testing

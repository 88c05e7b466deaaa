// rope_forward / rope_backward: the CPU against known rotations, its backward as the
// transpose and inverse (finite differences); CUDA against the CPU at long positions,
// odd head counts and unaligned buffers.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "support/op_harness.h"

namespace st::testing {
namespace {

// ---- CPU ------------------------------------------------------------------------------

TEST_F(CpuOps, RopeKnownValues) {
  // B=2, T=2, H=KV=1, hd=4, theta=100: inv_freq = {1, 0.1}; rows 0 and 2 are position 0.
  const int B = 2, T = 2, H = 1, KV = 1, hd = 4, row = 12;
  Vec x0;
  for (int r = 0; r < B * T; r++)
    for (double v : {1.0, 2.0, 3.0, 4.0, -1.0, 0.5, 2.0, -3.0, 9.0, 8.0, 7.0, 6.0}) x0.push_back(v + r);
  Tensor x = from(x0);
  be->rope_forward(x, B, T, H, KV, hd, 100.0f);
  Vec y = get(x);
  for (int r : {0, 2})
    for (int i = 0; i < row; i++) EXPECT_EQ(y[r * row + i], x0[r * row + i]) << "position 0 is the identity";
  for (int r : {1, 3}) {
    for (int head = 0; head < 2; head++) {  // q then k; pairs (0,2) at angle 1, (1,3) at angle 0.1
      const double* a = &x0[r * row + head * hd];
      const double* b = &y[r * row + head * hd];
      EXPECT_NEAR(b[0], a[0] * std::cos(1.0) - a[2] * std::sin(1.0), 1e-14);
      EXPECT_NEAR(b[2], a[2] * std::cos(1.0) + a[0] * std::sin(1.0), 1e-14);
      EXPECT_NEAR(b[1], a[1] * std::cos(0.1) - a[3] * std::sin(0.1), 1e-14);
      EXPECT_NEAR(b[3], a[3] * std::cos(0.1) + a[1] * std::sin(0.1), 1e-14);
    }
    for (int i = 8; i < row; i++) EXPECT_EQ(y[r * row + i], x0[r * row + i]) << "v is untouched";
  }
}

TEST_F(CpuOps, RopeBackwardIsTransposeAndInverse) {
  const int B = 2, T = 3, H = 4, KV = 2, hd = 6, n = B * T * (H + 2 * KV) * hd;
  const float theta = 1e4f;
  Vec x0 = randv(n);
  Tensor x = from(x0), y = make(DType::F64, n);
  be->copy(y, x);
  be->rope_forward(y, B, T, H, KV, hd, theta);
  be->rope_backward(y, B, T, H, KV, hd, theta);  // a rotation: its transpose is its inverse
  Vec back = get(y);
  for (int i = 0; i < n; i++) EXPECT_NEAR(back[i], x0[i], 1e-14);

  Vec w = randv(n);
  Tensor g = from(w);
  be->rope_backward(g, B, T, H, KV, hd, theta);
  expect_grad("dqkv", x, get(g), [&] {
    be->copy(y, x);  // rope is in place: work on a copy of the perturbed input
    be->rope_forward(y, B, T, H, KV, hd, theta);
    return wsum(w, y);
  });
}

// ---- CUDA -----------------------------------------------------------------------------

TEST_F(CudaOps, Rope) {
  struct Shape {
    int B, T, H, KV, hd;
    float theta;
    size_t off = 0;  // qkv starts this many elements into its buffer (alignment)
  };
  // The second reaches position 2047, where the angle needs double precision. The 16-byte
  // path takes hd/2 % (8 bf16, 4 f32) == 0 on an aligned buffer and rotates two heads a
  // step (an odd H + KV leaves one: the second and the last); the scalar path runs at an
  // odd offset and at hd 12. The third and fourth are Qwen2.5-1.5B's heads.
  for (const Shape s : {Shape{2, 50, 4, 2, 64, 1e6f}, Shape{1, 2048, 2, 1, 128, 1e4f},
                        Shape{1, 300, 12, 2, 128, 1e6f}, Shape{1, 300, 12, 2, 128, 1e6f, 1},
                        Shape{2, 40, 3, 1, 12, 1e4f}, Shape{2, 40, 4, 1, 16, 1e4f}}) {
    const size_t n = size_t(s.B) * s.T * (s.H + 2 * s.KV) * s.hd;
    const std::string what =
        " T=" + std::to_string(s.T) + " hd=" + std::to_string(s.hd) + " offset " + std::to_string(s.off);
    for (DType dt : kBoth) {
      Vec x = randv_as(dt, n, -2, 2);
      Tensor cx = cpu_from(x), gx = gpu_from_at(x, dt, s.off);
      cpu->rope_forward(cx, s.B, s.T, s.H, s.KV, s.hd, s.theta);
      gpu().rope_forward(gx, s.B, s.T, s.H, s.KV, s.hd, s.theta);
      expect_close(tag(dt, "rope forward" + what), get(gx), cget(cx), tolerance(dt));
      Tensor cg = cpu_from(x), gg = gpu_from_at(x, dt, s.off);
      cpu->rope_backward(cg, s.B, s.T, s.H, s.KV, s.hd, s.theta);
      gpu().rope_backward(gg, s.B, s.T, s.H, s.KV, s.hd, s.theta);
      expect_close(tag(dt, "rope backward" + what), get(gg), cget(cg), tolerance(dt));
    }
  }
}

}  // namespace
}  // namespace st::testing

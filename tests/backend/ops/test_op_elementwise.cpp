// The element-wise ops: add, accumulate (the first n elements only), sum_squares and
// its one-wait form sum_squares_total; the CPU against hand values, CUDA against the
// CPU's sums, at slices of every alignment.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "support/op_harness.h"

namespace st::testing {
namespace {

// ---- CPU ------------------------------------------------------------------------------

TEST_F(CpuOps, AddAccumulate) {
  Tensor x = from({1, 2, 3}), y = from({10, 20, 30}), z = make(DType::F64, 3);
  be->add(z, x, y, 3);
  EXPECT_EQ(get(z), (Vec{11, 22, 33}));
  be->accumulate(z, x, 2);  // only the first n elements
  EXPECT_EQ(get(z), (Vec{12, 24, 33}));
}

TEST_F(CpuOps, SumSquares) {
  Vec v = randv(1001);
  double want = 0, want_half = 0;
  for (size_t i = 0; i < v.size(); i++) want += v[i] * v[i], want_half += i < 500 ? v[i] * v[i] : 0;
  Tensor d = from(v);
  EXPECT_NEAR(be->sum_squares(d, v.size()), want, 1e-12 * want);
  EXPECT_NEAR(be->sum_squares(d, 500), want_half, 1e-12 * want);
  // F32: the squares of the rounded values, still summed in double.
  Tensor f = make(DType::F32, v.size());
  be->copy(f, d);
  double want_f = 0;
  for (double x : get(f)) want_f += x * x;
  EXPECT_NEAR(be->sum_squares(f, v.size()), want_f, 1e-12 * want_f);
}

// ---- CUDA -----------------------------------------------------------------------------

TEST_F(CudaOps, AddAccumulateSumSquares) {
  const size_t n = 100003;
  for (DType dt : kBoth) {
    Vec a = randv_as(dt, n), b = randv_as(dt, n);
    Tensor ga = gpu_from(a, dt), gb = gpu_from(b, dt), out = gpu_poisoned(dt, n);
    gpu().add(out, ga, gb, n);
    Vec want(n);
    for (size_t i = 0; i < n; i++) want[i] = a[i] + b[i];
    expect_close(tag(dt, "add"), get(out), want, tolerance(dt));
    gpu().accumulate(ga, gb, n - 1);  // only the first n-1 elements
    Vec acc = get(ga);
    want.back() = a.back();
    expect_close(tag(dt, "accumulate"), acc, want, tolerance(dt));

    double ss = 0, ss_half = 0;
    for (size_t i = 0; i < n; i++) ss += double(b[i]) * b[i], ss_half += i < n / 2 ? double(b[i]) * b[i] : 0;
    EXPECT_NEAR(gpu().sum_squares(gb, n), ss, 1e-12 * ss) << dtype_name(dt);
    EXPECT_NEAR(gpu().sum_squares(gb, n / 2), ss_half, 1e-12 * ss) << dtype_name(dt);
  }
}

// add and accumulate at slices: every array at the same misalignment (a scalar head,
// then 16-byte packs), at different ones (all scalar) and aligned; each path gives the
// same bits, and the CPU's sums.
TEST_F(CudaOps, AddAccumulateSlices) {
  const size_t n = 16384 + 5;
  struct Offs {
    size_t out, a, b;
  };
  for (DType dt : kBoth) {
    Vec a = randv_as(dt, n), b = randv_as(dt, n);
    Vec want(n);
    for (size_t i = 0; i < n; i++) want[i] = a[i] + b[i];
    std::vector<uint8_t> first_add, first_acc;
    for (const Offs o : {Offs{0, 0, 0}, Offs{3, 3, 3}, Offs{1, 2, 0}, Offs{0, 0, 5}}) {
      const std::string what = " offsets " + std::to_string(o.out) + "," + std::to_string(o.a) + "," +
                               std::to_string(o.b);
      Tensor ga = gpu_from_at(a, dt, o.a), gb = gpu_from_at(b, dt, o.b), out = gpu_poisoned(dt, n, o.out);
      gpu().add(out, ga, gb, n);
      expect_close(tag(dt, "add" + what), get(out), want, tolerance(dt));
      Tensor acc = gpu_from_at(a, dt, o.out);
      gpu().accumulate(acc, gb, n);
      expect_close(tag(dt, "accumulate" + what), get(acc), want, tolerance(dt));
      if (first_add.empty()) {
        first_add = raw(out), first_acc = raw(acc);
      } else {
        EXPECT_TRUE(raw(out) == first_add) << tag(dt, "add") << what << ": bits differ from the aligned path";
        EXPECT_TRUE(raw(acc) == first_acc) << tag(dt, "accumulate") << what << ": bits differ from the aligned path";
      }
    }
  }
}

// The gradient norm's one-wait form gives the same double as part by part.
TEST_F(CudaOps, SumSquaresTotalIsThePartsSummedInOrder) {
  std::vector<std::pair<Tensor, size_t>> parts;
  double want = 0;
  for (size_t n : {size_t{1}, size_t{1000}, size_t{0}, size_t{123457}, size_t{4096}}) {
    Tensor t = gpu_from_at(randv(n + 1), DType::F32, n % 3);
    parts.push_back({t, n});
    want += gpu().sum_squares(t, n);
  }
  EXPECT_EQ(gpu().sum_squares_total(parts), want);
  EXPECT_EQ(cpu->sum_squares_total({}), 0.0);
}

}  // namespace
}  // namespace st::testing

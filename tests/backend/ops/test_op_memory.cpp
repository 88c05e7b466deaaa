// The memory ops: alloc (zero-filled, aligned), fill, zero, copy with dtype
// conversion, upload and download, free, and the seeded fill_normal; on the CPU and on
// CUDA (whose seeded fill gives the CPU's values).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "support/op_harness.h"

namespace st::testing {
namespace {

// ---- CPU ------------------------------------------------------------------------------

TEST_F(CpuOps, AllocZeroFillCopyConvert) {
  Tensor a = make(DType::F32, 37);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data) % 64, 0u);
  for (double x : get(a)) EXPECT_EQ(x, 0.0);
  be->fill(a, 2.5);
  for (double x : get(a)) EXPECT_EQ(x, 2.5);
  be->zero(a);
  for (double x : get(a)) EXPECT_EQ(x, 0.0);

  // F64 -> F32 -> BF16 -> F32 with values exact in bf16; F64 -> I32 truncates.
  Tensor d = from({1.5, -2.25, 3.0, 0.0, -2.7, 2.7});
  Tensor f = make(DType::F32, 6), h = make(DType::BF16, 6), f2 = make(DType::F32, 6), i = make(DType::I32, 6);
  be->copy(f, d), be->copy(h, f), be->copy(f2, h), be->copy(i, d);
  EXPECT_EQ(get(f2)[0], 1.5);
  EXPECT_EQ(get(f2)[1], -2.25);
  EXPECT_EQ(get(h)[2], 3.0);
  EXPECT_EQ(get(i), (Vec{1, -2, 3, 0, -2, 2}));
  expect_error([&] { be->copy(make(DType::F32, 5), d); }, {"copy", "5", "6"});

  std::vector<float> host{1, 2, 3}, back(3);
  Tensor u = make(DType::F32, 3);
  be->upload(u, host.data());
  be->download(back.data(), u);
  EXPECT_EQ(back, host);

  Tensor own = be->alloc(DType::F64, 3);  // not in `owned`, so freed once
  be->free(own);
  EXPECT_TRUE(own.empty());
}

// ---- CUDA -----------------------------------------------------------------------------

TEST_F(CudaOps, AllocFillCopyConvert) {
  for (DType dt : {DType::F32, DType::BF16, DType::I32}) {
    Tensor t = make(gpu(), dt, 1000);
    std::vector<uint8_t> raw(t.bytes(), 0xff);
    gpu().download(raw.data(), t);
    for (uint8_t b : raw) ASSERT_EQ(b, 0) << "alloc zero-fills " << dtype_name(dt);
  }
  Tensor f = make(gpu(), DType::F32, 777);
  gpu().fill(f, 2.5);
  for (float x : get(f)) ASSERT_EQ(x, 2.5f);
  gpu().zero(f);
  for (float x : get(f)) ASSERT_EQ(x, 0.0f);

  // F32 -> BF16 rounds to nearest even exactly like the host's f32_to_bf16.
  Vec v = randv(4099, -100, 100);
  v[0] = 1.00390625f;  // a tie between two bf16 values: rounds to even (1.0)
  v[1] = 1.01171875f;  // a tie rounding up to 1.015625
  Tensor src = gpu_from(v, DType::F32), h = make(gpu(), DType::BF16, v.size());
  gpu().copy(h, src);
  std::vector<uint16_t> hb(v.size());
  gpu().download(hb.data(), h);
  for (size_t i = 0; i < v.size(); i++) ASSERT_EQ(hb[i], f32_to_bf16(v[i])) << "element " << i << " = " << v[i];
  Tensor back = make(gpu(), DType::F32, v.size());
  gpu().copy(back, h);
  Vec b = get(back);
  for (size_t i = 0; i < v.size(); i++) ASSERT_EQ(b[i], bf16_to_f32(hb[i]));

  // F32 -> I32 truncates; same-dtype copy is a plain copy.
  Tensor fi = gpu_from({1.5f, -2.7f, 3.0f, 0.0f}, DType::F32), ii = make(gpu(), DType::I32, 4);
  gpu().copy(ii, fi);
  std::vector<int32_t> iv(4);
  gpu().download(iv.data(), ii);
  EXPECT_EQ(iv, (std::vector<int32_t>{1, -2, 3, 0}));
  Tensor same = make(gpu(), DType::F32, v.size());
  gpu().copy(same, src);
  EXPECT_EQ(get(same), v);
  expect_error([&] { gpu().copy(make(gpu(), DType::F32, 5), fi); }, {"copy", "5", "4"});

  Tensor own = gpu().alloc(DType::F32, 3);  // not in `owned`, so freed once
  gpu().free(own);
  EXPECT_TRUE(own.empty());
}

// The GPU's seeded initialisation gives the CPU's values: the same bits, except where
// CUDA's double log or cos differ from glibc's in the last bit and the float rounds
// the other way (then by one ulp, and rarely).
TEST_F(CudaOps, FillNormalMatchesTheCpu) {
  const size_t n = size_t{1} << 24;
  const uint64_t key = rng(), first = rng() % 1000000;
  Tensor c = make(*cpu, DType::F32, n), g = gpu_poisoned(DType::F32, n);
  cpu->fill_normal(c, key, first, 0.02);
  gpu().fill_normal(g, key, first, 0.02);
  const Vec want = cget(c), got = get(g);
  size_t differ = 0;
  for (size_t i = 0; i < n; i++) {
    ASSERT_TRUE(std::isfinite(got[i])) << i;
    if (got[i] == want[i]) continue;
    ++differ;
    EXPECT_EQ(std::nextafter(want[i], got[i]), got[i]) << "more than one ulp apart at " << i;
  }
  std::printf("[ error    ] fill_normal: %zu of %zu floats differ from the CPU's (by one ulp)\n", differ, n);
  EXPECT_LE(differ, n / 100000) << "of " << n;
}

}  // namespace
}  // namespace st::testing

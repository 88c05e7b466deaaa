// embedding_forward / embedding_backward: the CPU backward against finite
// differences (repeated ids add up), CUDA against the CPU, and CUDA's scatter over
// long runs of one id, the same bits every time.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "support/op_harness.h"

namespace st::testing {
namespace {

// ---- CPU ------------------------------------------------------------------------------

TEST_F(CpuOps, EmbeddingForwardAndBackward) {
  const int N = 6, C = 3, V = 5;
  Tensor tok = ids({1, 3, 1, 0, 4, 1});  // repeats must add up in the backward
  Tensor wte = rand(V * C), out = make(DType::F64, N * C);
  be->embedding_forward(out, tok, wte, N, C, V);
  Vec o = get(out), e = get(wte);
  for (int c = 0; c < C; c++) EXPECT_EQ(o[1 * C + c], e[3 * C + c]);

  Vec w = randv(N * C), g0 = randv(V * C);
  Tensor dwte = from(g0);  // prefilled: the backward must add
  be->embedding_backward(dwte, from(w), tok, N, C, V);
  expect_grad("dwte", wte, minus(get(dwte), g0), [&] {
    be->embedding_forward(out, tok, wte, N, C, V);
    return wsum(w, out);
  });
}

// ---- CUDA -----------------------------------------------------------------------------

TEST_F(CudaOps, Embedding) {
  const int N = 300, C = 96, V = 50;
  std::vector<int32_t> tok(N);
  for (auto& t : tok) t = int32_t(rng() % V);  // many repeats: the backward must add them up
  for (DType dt : kBoth) {
    Vec wte = randv_as(dt, size_t(V) * C), dout = randv_as(dt, size_t(N) * C), dw0 = randv(size_t(V) * C);
    Tensor cout = make(*cpu, DType::F32, size_t(N) * C), cdw = cpu_from(dw0);
    cpu->embedding_forward(cout, cpu_ids(tok), cpu_from(wte), N, C, V);
    cpu->embedding_backward(cdw, cpu_from(dout), cpu_ids(tok), N, C, V);

    Tensor gt = gpu_ids(tok), gout = gpu_poisoned(dt, size_t(N) * C), gdw = gpu_from(dw0, DType::F32);
    gpu().embedding_forward(gout, gt, gpu_from(wte, dt), N, C, V);
    gpu().embedding_backward(gdw, gpu_from(dout, dt), gt, N, C, V);
    expect_close(tag(dt, "embedding out"), get(gout), cget(cout), tolerance(dt));
    expect_close(tag(dt, "embedding dwte (+=)"), get(gdw), cget(cdw), 1e-5);  // F32 sums either way
  }
}

// Long runs of one token (20000 rows over 3 ids): the scatter gives the same bits every
// time, and still the CPU's sums.
TEST_F(CudaOps, EmbeddingBackwardIsDeterministic) {
  const int N = 20000, C = 80, V = 3;
  std::vector<int32_t> tok(N);
  for (auto& t : tok) t = int32_t(rng() % V);
  for (DType dt : kBoth) {
    Vec dout = randv_as(dt, size_t(N) * C), dw0 = randv(size_t(V) * C);
    Tensor cdw = cpu_from(dw0);
    cpu->embedding_backward(cdw, cpu_from(dout), cpu_ids(tok), N, C, V);
    Tensor gt = gpu_ids(tok), gd = gpu_from(dout, dt);
    std::vector<Vec> runs;
    for (int rep = 0; rep < 3; ++rep) {
      Tensor gdw = gpu_from(dw0, DType::F32);
      gpu().embedding_backward(gdw, gd, gt, N, C, V);
      runs.push_back(get(gdw));
    }
    EXPECT_EQ(runs[0], runs[1]) << dtype_name(dt);
    EXPECT_EQ(runs[0], runs[2]) << dtype_name(dt);
    expect_close(tag(dt, "embedding dwte, long runs"), runs[0], cget(cdw), 1e-4);
  }
}

}  // namespace
}  // namespace st::testing

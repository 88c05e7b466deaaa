// The argument contract every op front checks (backend.cpp): dtypes, sizes and head
// shapes, and the ids of embedding and cross_entropy (on the host at upload_ids, else
// where the ids live), with the messages naming the op, the argument and the value.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "support/op_harness.h"

namespace st::testing {
namespace {

// ---- CPU ------------------------------------------------------------------------------

TEST_F(CpuOps, DtypeAndSizeMismatchesThrow) {
  Tensor x = rand(12), w32 = make(DType::F32, 6), out = make(DType::F64, 8);
  expect_error([&] { be->matmul_forward(out, x, w32, Tensor{}, 4, 3, 2); },
               {"matmul_forward", "weight", "f32"});
  Tensor w = rand(6);
  expect_error([&] { be->matmul_forward(make(DType::F64, 7), x, w, Tensor{}, 4, 3, 2); },
               {"matmul_forward", "out", "7", "8"});
  expect_error([&] { be->attention_forward(rand(12), rand(6), rand(60), 1, 3, 3, 2, 2); }, {"KV=2"});
  expect_error([&] { be->rope_forward(rand(36), 1, 3, 2, 1, 3, 1e4f); }, {"head_dim 3", "even"});
}

TEST_F(CpuOps, OutOfRangeIdsThrow) {
  Tensor wte = rand(5 * 2), out = make(DType::F64, 3 * 2);
  expect_error(
      [&] {
        be->embedding_forward(out, ids({0, 4, 5}), wte, 3, 2, 5);
      },
      {"token id 5", "row 2", "V=5"});
  expect_error([&] { be->embedding_forward(out, ids({0, -1, 1}), wte, 3, 2, 5); }, {"token id -1", "row 1"});
  expect_error([&] { be->embedding_backward(wte, out, ids({7, 0, 1}), 3, 2, 5); }, {"token id 7", "row 0"});
  {
    Tensor t = be->alloc(DType::I32, 3);
    const std::vector<int32_t> bad = {1, 2, 9}, ignored = {1, -100, 2};
    expect_error([&] { be->upload_ids(t, bad.data(), 5, false, 0, "token id"); }, {"token id 9", "row 2", "V=5"});
    expect_error([&] { be->upload_ids(t, ignored.data(), 5, false, 0, "target"); }, {"target -100", "row 1"});
    be->upload_ids(t, ignored.data(), 5, true, -100, "target");  // the ignore index passes
    be->free(t);
  }
  Tensor logits = rand(3 * 4), losses = make(DType::F64, 3);
  expect_error(
      [&] {
        be->cross_entropy(losses, logits, ids({0, 4, -100}), 3, 4, -100, 1, true);
      },
      {"target 4", "row 1", "V=4"});
  be->cross_entropy(losses, logits, ids({0, 3, -100}), 3, 4, -100, 1, true);  // ignore_index is fine
}

// ---- CUDA -----------------------------------------------------------------------------

TEST_F(CudaOps, OutOfRangeIdsThrow) {
  Tensor wte = gpu_from(randv(5 * 2), DType::BF16), out = gpu_poisoned(DType::BF16, 3 * 2);
  Tensor dwte = make(gpu(), DType::F32, 5 * 2);
  expect_error([&] { gpu().embedding_forward(out, gpu_ids({0, 4, 5}), wte, 3, 2, 5); },
               {"embedding_forward", "token id 5", "row 2", "V=5"});
  expect_error([&] { gpu().embedding_forward(out, gpu_ids({0, -1, 7}), wte, 3, 2, 5); }, {"token id -1", "row 1"});
  expect_error([&] { gpu().embedding_backward(dwte, out, gpu_ids({7, 0, 1}), 3, 2, 5); }, {"token id 7", "row 0"});
  Tensor logits = gpu_from(randv(3 * 4), DType::BF16), losses = make(gpu(), DType::F32, 3);
  expect_error([&] { gpu().cross_entropy(losses, logits, gpu_ids({0, 4, -100}), 3, 4, -100, 1, true); },
               {"cross_entropy", "target 4", "row 1", "V=4"});
  // ignore_index is fine, and the backend still works after the errors.
  gpu().cross_entropy(losses, logits, gpu_ids({0, 3, -100}), 3, 4, -100, 1, true);
  gpu().embedding_forward(out, gpu_ids({0, 4, 1}), wte, 3, 2, 5);
  for (float x : get(out)) EXPECT_TRUE(std::isfinite(x));
  // Dtype contract: statistics and parameter gradients are F32.
  expect_error([&] { gpu().embedding_backward(make(gpu(), DType::BF16, 10), out, gpu_ids({0, 1, 2}), 3, 2, 5); },
               {"dwte", "bf16", "f32"});
}

// Ids checked on the host by upload_ids: a bad one is refused before the upload,
// naming it and its row; checked ones are trusted by the ops until something else
// writes their memory, after which the ops check again.
TEST_F(CudaOps, UploadIdsChecksOnTheHostAndOnlyOnce) {
  const int N = 3, C = 2, V = 5;
  Tensor wte = gpu_from(randv(V * C), DType::F32), out = gpu_poisoned(DType::F32, N * C);
  Tensor ids = make(gpu(), DType::I32, N);
  const std::vector<int32_t> good = {0, 4, 1}, bad = {0, 1, 5};
  expect_error([&] { gpu().upload_ids(ids, bad.data(), V, false, 0, "token id"); }, {"token id 5", "row 2", "V=5"});
  gpu().upload_ids(ids, good.data(), V, false, 0, "token id");
  gpu().embedding_forward(out, ids, wte, N, C, V);
  EXPECT_TRUE(std::isfinite(get(out)[0]));
  gpu().upload(ids, bad.data());  // a plain upload: no longer trusted
  expect_error([&] { gpu().embedding_forward(out, ids, wte, N, C, V); }, {"embedding_forward", "token id 5", "row 2"});
  // Checked with an ignore index: trusted only by an op with the same one.
  const std::vector<int32_t> ignored = {0, -100, 1};
  gpu().upload_ids(ids, ignored.data(), V, true, -100, "target");
  expect_error([&] { gpu().embedding_forward(out, ids, wte, N, C, V); }, {"token id -100", "row 1"});
}

}  // namespace
}  // namespace st::testing

// The CPU reference's F32 path against its F64 one, op after op along one layer's
// chain (embedding, rmsnorm, matmul, rope, attention, swiglu, cross-entropy).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "support/op_harness.h"

namespace st::testing {
namespace {

TEST_F(CpuOps, F32AgreesWithF64) {
  const int B = 2, T = 5, H = 4, KV = 2, hd = 4, N = B * T, C = H * hd, F = 6, V = 9;
  const int QKV = (H + 2 * KV) * hd;
  auto D = [](Twin t) { return t.d; };
  auto S = [](Twin t) { return t.f; };
  auto both = [&](auto&& fn) { fn(D), fn(S); };

  Tensor tok = ids({0, 3, 8, 1, 1, 4, 7, 2, 5, 6});
  Twin wte = twin(randv(V * C)), x = twin_zeros(N * C), dwte = twin_zeros(V * C), dx = twin(randv(N * C));
  both([&](auto pick) { be->embedding_forward(pick(x), tok, pick(wte), N, C, V); });
  both([&](auto pick) { be->embedding_backward(pick(dwte), pick(dx), tok, N, C, V); });
  expect_agree("embedding out", x), expect_agree("dwte", dwte);

  Twin nw = twin(randv(C, 0.5, 1.5)), xn = twin_zeros(N * C), rstd = twin_zeros(N), dnw = twin_zeros(C);
  Twin dxn = twin_zeros(N * C), dy = twin(randv(N * C));
  both([&](auto pick) { be->rmsnorm_forward(pick(xn), pick(rstd), pick(x), pick(nw), N, C, 1e-6f); });
  both([&](auto pick) {
    be->rmsnorm_backward(pick(dxn), pick(dnw), pick(dy), pick(x), pick(nw), pick(rstd), N, C);
  });
  expect_agree("rmsnorm out", xn), expect_agree("rstd", rstd), expect_agree("rmsnorm dinp", dxn);
  expect_agree("rmsnorm dweight", dnw);

  Twin wq = twin(randv(QKV * C)), bq = twin(randv(QKV)), qkv = twin_zeros(N * QKV);
  Twin dwq = twin_zeros(QKV * C), dbq = twin_zeros(QKV), dxq = twin_zeros(N * C), dq = twin(randv(N * QKV));
  both([&](auto pick) { be->matmul_forward(pick(qkv), pick(xn), pick(wq), pick(bq), N, C, QKV); });
  both([&](auto pick) {
    be->matmul_backward(pick(dxq), pick(dwq), pick(dbq), pick(dq), pick(xn), pick(wq), N, C, QKV);
  });
  expect_agree("matmul out", qkv), expect_agree("matmul dinp", dxq), expect_agree("matmul dweight", dwq);
  expect_agree("matmul dbias", dbq);

  both([&](auto pick) { be->rope_forward(pick(qkv), B, T, H, KV, hd, 1e6f); });
  expect_agree("rope", qkv);
  Twin att = twin_zeros(N * C), lse = twin_zeros(B * H * T), datt = twin(randv(N * C)),
       dqkv = twin_zeros(N * QKV);
  both([&](auto pick) { be->attention_forward(pick(att), pick(lse), pick(qkv), B, T, H, KV, hd); });
  both([&](auto pick) {
    be->attention_backward(pick(dqkv), pick(datt), pick(att), pick(lse), pick(qkv), B, T, H, KV, hd);
  });
  expect_agree("attention out", att), expect_agree("lse", lse), expect_agree("attention dqkv", dqkv);
  both([&](auto pick) { be->rope_backward(pick(dqkv), B, T, H, KV, hd, 1e6f); });
  expect_agree("rope backward", dqkv);

  Twin gu = twin(randv(N * 2 * F, -3, 3)), act = twin_zeros(N * F), dgu = twin_zeros(N * 2 * F);
  Twin dact = twin(randv(N * F));
  both([&](auto pick) { be->swiglu_forward(pick(act), pick(gu), N, F); });
  both([&](auto pick) { be->swiglu_backward(pick(dgu), pick(dact), pick(gu), N, F); });
  expect_agree("swiglu out", act), expect_agree("swiglu dgu", dgu);

  Twin logits = twin(randv(N * V, -4, 4)), losses = twin_zeros(N);
  Tensor tgt = ids({1, 2, -100, 8, 0, 0, 3, 4, 5, 6});
  both([&](auto pick) { be->cross_entropy(pick(losses), pick(logits), tgt, N, V, -100, 0.1f, true); });
  expect_agree("losses", losses), expect_agree("dlogits", logits);
}

}  // namespace
}  // namespace st::testing

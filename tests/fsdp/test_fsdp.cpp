#include <gtest/gtest.h>

#include <cmath>

#include "backend/backend.h"
#include "dist/comm.h"
#include "fsdp/fsdp.h"
#include "model/config.h"
#include "model/dense_params.h"
#include "model/init.h"
#include "model/qwen2.h"

namespace st {
namespace {

ModelConfig cfg() {
  ModelConfig c = model_preset("tiny");
  c.num_layers = 2;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  return c;
}

TEST(Fsdp, InitEqualsTheLayoutInitAndRoundTrips) {
  auto be = make_cpu_backend();
  auto comm = make_single_comm(*be);
  ParamLayout layout(cfg(), 1);
  Fsdp f(layout, *be, *comm, nullptr, {});
  f.init_weights(11);
  for (int u = 0; u < layout.num_units(); ++u) {
    const Unit& unit = layout.unit(u);
    std::vector<float> want(unit.numel);
    init_unit_values(unit, 11, 0.02, 0, unit.numel, want.data());
    EXPECT_EQ(f.gather_unit(u), want) << unit.name;
    for (auto& x : want) x = -x + 0.5f;
    f.load_unit(u, want);
    EXPECT_EQ(f.gather_unit(u), want) << unit.name;
  }
  EXPECT_THROW(f.load_unit(0, std::vector<float>(3)), Error);
}

TEST(Fsdp, ShardInitDoesNotDependOnWorldSize) {
  // Rank r's shard at world W holds exactly elements [r*s, (r+1)*s) of the world-1 values.
  const ModelConfig c = cfg();
  ParamLayout one(c, 1), three(c, 3);
  for (int u = 0; u < one.num_units(); ++u) {
    const Unit& a = one.unit(u);
    const Unit& b = three.unit(u);
    std::vector<float> whole(a.numel), part(b.shard_numel);
    init_unit_values(a, 5, 0.02, 0, a.numel, whole.data());
    init_unit_values(b, 5, 0.02, 2 * b.shard_numel, 3 * b.shard_numel, part.data());
    for (size_t i = 0; i < b.shard_numel; ++i) {
      const size_t g = 2 * b.shard_numel + i;
      ASSERT_EQ(part[i], g < a.numel ? whole[g] : 0.0f) << a.name << " " << g;
    }
  }
}

TEST(Fsdp, WeightDecayOnlyOnMatrices) {
  auto be = make_cpu_backend();
  auto comm = make_single_comm(*be);
  ParamLayout layout(cfg(), 1);
  Fsdp f(layout, *be, *comm, nullptr, {});
  f.init_weights(3);
  const int u = layout.layer_unit(0);
  std::vector<float> v = f.gather_unit(u);
  for (auto& x : v) x = 1.0f;  // norms, biases and weights all 1
  f.load_unit(u, v);
  f.zero_grads();
  AdamWParams p;
  p.lr = 0.1f;
  p.weight_decay = 0.5f;
  f.step(p);  // zero gradient: only decay moves anything
  const std::vector<float> after = f.gather_unit(u);
  for (const ParamSpec& ps : layout.unit(u).params)
    EXPECT_FLOAT_EQ(after[ps.offset], ps.decay ? 1.0f - 0.1f * 0.5f : 1.0f) << ps.name;
}

TEST(Fsdp, GradientsMatchDenseParamsWithAndWithoutReshard) {
  const ModelConfig c = cfg();
  auto be = make_cpu_backend();
  auto comm = make_single_comm(*be);
  ParamLayout layout(c, 1);
  const int B = 2, T = 8;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (int i = 0; i < B * T; ++i) tok[i] = (i * 31) % 256, tgt[i] = (i * 17 + 3) % 256;
  Qwen2Model model(layout, *be, DType::F32, B, T);

  DenseParams dense(layout, *be, DType::F32, true);
  dense.init(9);
  const LossSum ld = model.forward_backward(dense, tok.data(), tgt.data(), 1.0f / (B * T), -100);
  std::vector<double> want;
  for (int u = 0; u < layout.num_units(); ++u) {
    auto g = dense.get_grad_f64(u);
    want.insert(want.end(), g.begin(), g.end());
  }
  double want_sq = 0;
  for (double g : want) want_sq += g * g;

  for (bool reshard : {true, false}) {
    FsdpOptions o;
    o.reshard_after_forward = reshard;
    Fsdp f(layout, *be, *comm, nullptr, o);
    f.init_weights(9);
    f.zero_grads();
    const LossSum lf = model.forward_backward(f, tok.data(), tgt.data(), 1.0f / (B * T), -100);
    EXPECT_EQ(lf.sum, ld.sum);
    EXPECT_NEAR(f.grad_norm(), std::sqrt(want_sq), 1e-6 * std::sqrt(want_sq));
    EXPECT_GT(f.memory().gathered_peak_bytes, 0u);
  }
}

}  // namespace
}  // namespace st

namespace st {
namespace {

TEST(Init, ThreadedLargeRangesGiveTheSameBits) {
  Unit u{"big"};
  ParamSpec w{"model.embed_tokens.weight", {3000, 3000}, 0, 9000000, true};
  ParamSpec n{"model.norm.weight", {3000}, 9000000, 3000, false};
  u.params = {w, n};
  u.numel = u.padded_numel = u.shard_numel = 9003000;
  std::vector<float> whole(u.numel), pieces(u.numel);
  init_unit_values(u, 42, 0.02, 0, u.numel, whole.data());  // large: split across threads
  for (size_t lo = 0; lo < u.numel; lo += 1000000)           // small: one thread each
    init_unit_values(u, 42, 0.02, lo, std::min(u.numel, lo + 1000000), pieces.data() + lo);
  EXPECT_EQ(whole, pieces);
  EXPECT_EQ(whole.back(), 1.0f);
}

}  // namespace
}  // namespace st

// Whole-model gradient check: the analytic gradient of the mean cross-entropy with
// respect to every kind of parameter, against central finite differences, in
// double precision (truncation error O(h^2) ~ 1e-10 and rounding ~ 1e-16/h ~ 1e-10
// at h = 1e-5/1e-6, so 1e-6 relative is a tight bar that a wrong term cannot meet).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/backend.h"
#include "model/dense_params.h"
#include "model/qwen2.h"

namespace st {
namespace {

ModelConfig tiny_cfg(bool tied, int kv) {
  ModelConfig c;
  c.source = "gradcheck";
  c.vocab_size = 23;
  c.hidden_size = 16;
  c.intermediate_size = 20;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = kv;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000;
  c.tie_word_embeddings = tied;
  return c;
}

struct Case {
  bool tied;
  int kv;
  int chunk;
};

class ModelGrad : public ::testing::TestWithParam<Case> {};

TEST_P(ModelGrad, MatchesFiniteDifferences) {
  const Case cs = GetParam();
  const ModelConfig cfg = tiny_cfg(cs.tied, cs.kv);
  const int B = 2, T = 5, N = B * T, ignore = -100;
  auto be = make_cpu_backend();
  ParamLayout layout(cfg);
  DenseParams params(layout, *be, DType::F64, /*with_grads=*/true);
  params.init(7, 0.3);  // large init so every path carries signal
  // Randomise norms and biases too: they are 1 and 0 at init, which hides errors.
  std::mt19937_64 rng(42);
  std::normal_distribution<double> nd(0.0, 0.3);
  for (int u = 0; u < layout.num_units(); ++u) {
    auto v = params.get_unit(u);
    for (auto& x : v) x += static_cast<float>(0.2 * nd(rng));
    params.set_unit(u, v);
  }
  std::vector<int32_t> tokens(N), targets(N);
  for (int i = 0; i < N; ++i) tokens[i] = static_cast<int32_t>(rng() % cfg.vocab_size);
  for (int i = 0; i < N; ++i) targets[i] = static_cast<int32_t>(rng() % cfg.vocab_size);
  targets[3] = ignore;
  targets[7] = ignore;
  const int valid = N - 2;

  Qwen2Model model(layout, *be, DType::F64, B, T, cs.chunk);
  params.zero_grads();
  const LossSum ls = model.forward_backward(params, tokens.data(), targets.data(), 1.0f / valid, ignore);
  ASSERT_EQ(ls.count, valid);

  auto loss_at = [&]() {
    LossSum l = model.forward(params, tokens.data(), targets.data(), ignore);
    return l.sum / l.count;
  };
  EXPECT_NEAR(loss_at(), ls.sum / ls.count, 1e-12);

  // Check a spread of elements of every tensor.
  const double h = 1e-5;
  for (int u = 0; u < layout.num_units(); ++u) {
    const std::vector<double> g = params.get_grad_f64(u);
    const Unit& unit = layout.unit(u);
    // Perturb through an F64 copy of the unit's weights (set_unit is f32).
    Tensor w = params.weights(u);
    for (const ParamSpec& p : unit.params) {
      for (int k = 0; k < 6; ++k) {
        const size_t i = p.offset + (rng() % p.numel);
        double orig;
        be->download(&orig, w.slice(i, 1));
        double plus_v = orig + h, minus_v = orig - h;
        be->upload(w.slice(i, 1), &plus_v);
        const double lp = loss_at();
        be->upload(w.slice(i, 1), &minus_v);
        const double lm = loss_at();
        be->upload(w.slice(i, 1), &orig);
        const double fd = (lp - lm) / (2 * h);
        const double err = std::abs(fd - g[i]) / std::max(1e-3, std::abs(fd) + std::abs(g[i]));
        EXPECT_LT(err, 1e-6) << p.name << "[" << i - p.offset << "] analytic " << g[i] << " fd " << fd;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, ModelGrad,
                         ::testing::Values(Case{true, 2, 0}, Case{false, 2, 0}, Case{true, 1, 3}, Case{false, 4, 4}),
                         [](const auto& info) {
                           return std::string(info.param.tied ? "tied" : "untied") + "_kv" +
                                  std::to_string(info.param.kv) + "_chunk" + std::to_string(info.param.chunk);
                         });

TEST(Model, F32ForwardAgreesWithF64) {
  const ModelConfig cfg = tiny_cfg(true, 2);
  const int B = 2, T = 7;
  auto be = make_cpu_backend();
  ParamLayout layout(cfg);
  DenseParams p64(layout, *be, DType::F64, false), p32(layout, *be, DType::F32, false);
  p64.init(3);
  p32.init(3);
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (int i = 0; i < B * T; ++i) tok[i] = (i * 7) % cfg.vocab_size, tgt[i] = (i * 5 + 1) % cfg.vocab_size;
  Qwen2Model m64(layout, *be, DType::F64, B, T), m32(layout, *be, DType::F32, B, T);
  std::vector<float> l64(B * T * cfg.vocab_size), l32(l64.size());
  const LossSum a = m64.forward(p64, tok.data(), tgt.data(), -100, l64.data());
  const LossSum b = m32.forward(p32, tok.data(), tgt.data(), -100, l32.data());
  EXPECT_NEAR(a.sum / a.count, b.sum / b.count, 1e-5);
  for (size_t i = 0; i < l64.size(); ++i) ASSERT_NEAR(l64[i], l32[i], 1e-5) << i;
  // A model at init predicts nearly uniformly: loss ~ log(V).
  EXPECT_NEAR(a.sum / a.count, std::log(cfg.vocab_size), 0.1);
}

// The lm_head's FP8 gradients (train.fp8_layers = lm_head_grad, emulated on the CPU):
// the logits' gradient as e5m2 and transposed for the weight gradient, the final norm's
// output as e4m3. Against the exact f32 gradients of the same model and batch, two
// chunks of logits: both gradients point the same way (cosine > 0.99) at the same
// size (norm within 5%); a scale, layout or chunk offset wrong in either GEMM cannot.
// The forward is untouched, so the loss is the f32 one bit for bit.
TEST(Model, Fp8LmHeadGradientsFollowTheExactOnes) {
  ModelConfig cfg = tiny_cfg(false, 1);
  cfg.vocab_size = 48, cfg.hidden_size = 32, cfg.intermediate_size = 32, cfg.num_heads = 2;
  const int B = 2, T = 16, N = B * T, chunk = 16;
  auto be = make_cpu_backend();
  ParamLayout layout(cfg);
  std::mt19937_64 rng(5);
  std::vector<int32_t> tokens(N), targets(N);
  for (int i = 0; i < N; ++i) tokens[i] = int32_t(rng() % cfg.vocab_size), targets[i] = int32_t(rng() % cfg.vocab_size);
  Fp8Options fp8;
  fp8.on = true;
  fp8.kinds = Fp8Options::kLmHeadGrad;
  struct Out {
    LossSum loss;
    std::vector<double> head, norm_in;  // the lm_head's weight gradient; a block's (the input gradient's path)
  };
  auto run = [&](const Fp8Options& o) {
    DenseParams params(layout, *be, DType::F32, true);
    params.init(11, 0.5);
    params.zero_grads();
    Qwen2Model model(layout, *be, DType::F32, B, T, chunk, Recompute::None, o);
    Out out;
    out.loss = model.forward_backward(params, tokens.data(), targets.data(), 1.0f / N, -100);
    const std::vector<double> g = params.get_grad_f64(layout.lm_head_unit());
    const size_t V = cfg.vocab_size, C = cfg.hidden_size;
    out.head.assign(g.begin() + layout.lm_head_offset(), g.begin() + layout.lm_head_offset() + V * C);
    out.norm_in = params.get_grad_f64(layout.layer_unit(cfg.num_layers - 1));
    return out;
  };
  const Out exact = run(Fp8Options{}), f8 = run(fp8);
  EXPECT_EQ(exact.loss.sum, f8.loss.sum) << "the forward changed";
  auto compare = [](const std::vector<double>& a, const std::vector<double>& b, const char* what) {
    ASSERT_EQ(a.size(), b.size());
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < a.size(); ++i) ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
    ASSERT_GT(aa, 0) << what;
    EXPECT_GT(ab / std::sqrt(aa * bb), 0.99) << what;
    EXPECT_NEAR(std::sqrt(bb / aa), 1.0, 0.05) << what;
    EXPECT_NE(a, b) << what << ": not computed in FP8";
  };
  compare(exact.head, f8.head, "lm_head weight gradient");
  compare(exact.norm_in, f8.norm_in, "the last block's gradient (from the lm_head's input gradient)");
}

}  // namespace
}  // namespace st

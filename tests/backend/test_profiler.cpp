// ProfilingBackend on the CPU reference: it forwards (bitwise the same results), it
// counts calls per key per step inside the window and nothing outside it, and its
// report adds up (shares sum to 1 with the "other" row, FLOP rates = FLOPs / time).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/profiler.h"

namespace st {
namespace {

class Profiler : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  ProfilingBackend prof{*cpu};
  std::mt19937_64 rng{1234};
  std::vector<Tensor> owned;

  ~Profiler() override {
    for (auto& t : owned) cpu->free(t);
  }
  Tensor rand(size_t n) {
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng);
    Tensor t = owned.emplace_back(cpu->alloc(DType::F32, n));
    cpu->upload(t, v.data());
    return t;
  }
  Tensor zeros(size_t n) { return owned.emplace_back(cpu->alloc(DType::F32, n)); }
  std::vector<float> get(Tensor t) {
    std::vector<float> v(t.numel);
    cpu->download(v.data(), t);
    return v;
  }
  static bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  }
  static const ProfileRow* row(const ProfileReport& r, const std::string& op) {
    for (const auto& x : r.rows)
      if (x.op == op) return &x;
    return nullptr;
  }
};

TEST_F(Profiler, ForwardsEveryCallWithTheSameResults) {
  const int N = 8, IC = 16, OC = 12, F = 6;
  Tensor x = rand(N * IC), w = rand(OC * IC), b = rand(OC), g = rand(IC);
  // The same ops through the wrapper (window open: the timed path) and straight on
  // the inner backend must give identical bits.
  for (bool open : {true, false}) {
    if (open) prof.open_window();
    Tensor y1 = zeros(N * OC), y2 = zeros(N * OC);
    prof.matmul_forward(y1, x, w, b, N, IC, OC);
    cpu->matmul_forward(y2, x, w, b, N, IC, OC);
    EXPECT_TRUE(bitwise_equal(get(y1), get(y2))) << "matmul_forward, window open " << open;

    Tensor dout = rand(N * OC);
    Tensor dx1 = zeros(N * IC), dw1 = zeros(OC * IC), db1 = zeros(OC);
    Tensor dx2 = zeros(N * IC), dw2 = zeros(OC * IC), db2 = zeros(OC);
    prof.matmul_backward(dx1, dw1, db1, dout, x, w, N, IC, OC);
    cpu->matmul_backward(dx2, dw2, db2, dout, x, w, N, IC, OC);
    EXPECT_TRUE(bitwise_equal(get(dx1), get(dx2)));
    EXPECT_TRUE(bitwise_equal(get(dw1), get(dw2)));
    EXPECT_TRUE(bitwise_equal(get(db1), get(db2)));

    Tensor s1 = zeros(N * IC), o1 = zeros(N * IC), r1 = zeros(N);
    Tensor s2 = zeros(N * IC), o2 = zeros(N * IC), r2 = zeros(N);
    Tensor a = rand(N * IC);
    prof.add_rmsnorm_forward(s1, o1, r1, a, x, g, N, IC, 1e-6f);
    cpu->add_rmsnorm_forward(s2, o2, r2, a, x, g, N, IC, 1e-6f);
    EXPECT_TRUE(bitwise_equal(get(s1), get(s2)));
    EXPECT_TRUE(bitwise_equal(get(o1), get(o2)));
    EXPECT_TRUE(bitwise_equal(get(r1), get(r2)));

    Tensor gu = rand(N * 2 * F), sw1 = zeros(N * F), sw2 = zeros(N * F);
    prof.swiglu_forward(sw1, gu, N, F);
    cpu->swiglu_forward(sw2, gu, N, F);
    EXPECT_TRUE(bitwise_equal(get(sw1), get(sw2)));

    EXPECT_EQ(prof.sum_squares(x, N * IC), cpu->sum_squares(x, N * IC));

    const size_t n = 40;
    Tensor p1 = rand(n), p2 = zeros(n), gr = rand(n), m1 = zeros(n), v1 = zeros(n), m2 = zeros(n), v2 = zeros(n);
    Tensor c1 = zeros(n), c2 = zeros(n);
    cpu->copy(p2, p1);
    AdamWParams hp;
    hp.lr = 1e-2f;
    prof.adamw_copy(p1, gr, m1, v1, c1, n, hp);
    cpu->adamw_copy(p2, gr, m2, v2, c2, n, hp);
    EXPECT_TRUE(bitwise_equal(get(p1), get(p2)));
    EXPECT_TRUE(bitwise_equal(get(c1), get(c2)));
    EXPECT_TRUE(bitwise_equal(get(v1), get(v2)));
    if (open) prof.close_window();
  }
  // The rest forwards to the inner backend as it is.
  EXPECT_EQ(prof.device(), cpu->device());
  EXPECT_EQ(prof.name(), cpu->name());
  EXPECT_EQ(prof.native_stream(), cpu->native_stream());
  EXPECT_EQ(prof.workspace_bytes(), cpu->workspace_bytes());
  EXPECT_EQ(&prof.inner(), cpu.get());
}

TEST_F(Profiler, CountsCallsPerKeyPerStepInsideTheWindowOnly) {
  const int N = 16, C = 32, F = 24;
  Tensor x = rand(N * C), wq = rand(3 * C * C), wd = rand(C * F), y = zeros(N * 3 * C), z = zeros(N * C),
         f = rand(N * F);
  auto step = [&] {
    prof.matmul_forward(y, x, wq, Tensor{}, N, C, 3 * C);  // twice a step
    prof.matmul_forward(y, x, wq, Tensor{}, N, C, 3 * C);
    prof.matmul_forward(z, f, wd, Tensor{}, N, F, C);      // once
    prof.add(z, z, x, N * C);                              // three times
    prof.add(z, z, x, N * C);
    prof.add(z, z, x, N * C);
  };
  step();  // before the window: not recorded
  prof.open_window();
  step();
  prof.mark_step();
  step();
  prof.mark_step();
  prof.close_window();
  step();  // after it: not recorded either
  prof.mark_step();
  EXPECT_EQ(prof.steps(), 2);

  const ProfileReport r = prof.report(prof.measured_step_ms(), 0, 0);
  EXPECT_EQ(r.steps, 2);
  ASSERT_EQ(r.rows.size(), 4u);  // three keys and "other"
  const std::string qkv = "matmul_forward 16x32->96", down = "matmul_forward 16x24->32";
  ASSERT_NE(row(r, qkv), nullptr);
  ASSERT_NE(row(r, down), nullptr);
  ASSERT_NE(row(r, "add"), nullptr);
  EXPECT_DOUBLE_EQ(row(r, qkv)->calls_per_step, 2);
  EXPECT_DOUBLE_EQ(row(r, down)->calls_per_step, 1);
  EXPECT_DOUBLE_EQ(row(r, "add")->calls_per_step, 3);
  // add: a, b read, out written, f32.
  EXPECT_DOUBLE_EQ(row(r, "add")->bytes_per_call, 3.0 * N * C * 4);
  EXPECT_TRUE(r.rows.back().is_other);
  for (size_t i = 1; i + 1 < r.rows.size(); ++i) EXPECT_GE(r.rows[i - 1].ms_per_step, r.rows[i].ms_per_step);

  // A new window starts from nothing; with the window closed nothing is booked.
  prof.open_window();
  prof.close_window();
  const ProfileReport empty = prof.report(0, 0, 0);
  EXPECT_EQ(empty.steps, 0);
  ASSERT_EQ(empty.rows.size(), 1u);
  EXPECT_TRUE(empty.rows[0].is_other);
}

// The fused FP8 ops (SwiGLU's, the loss's) reach the inner backend as themselves (its
// fused kernel), each one row: not the base class's composition of the op and a cast.
// A fast-accumulating FP8 GEMM has a row of its own.
TEST_F(Profiler, FusedFp8OpsAreForwardedWhole) {
  const int N = 16, F = 8, V = 32;
  Tensor gu = rand(size_t(N) * 2 * F), dy = rand(size_t(N) * F);
  Tensor q = owned.emplace_back(cpu->alloc(DType::F8E4M3, size_t(N) * F)),
         qt = owned.emplace_back(cpu->alloc(DType::F8E4M3, size_t(N) * F)),
         dq = owned.emplace_back(cpu->alloc(DType::F8E5M2, size_t(N) * 2 * F)), inv = zeros(1), amax = zeros(1);
  Tensor logits = rand(size_t(N) * V), losses = zeros(N), targets = owned.emplace_back(cpu->alloc(DType::I32, N));
  Tensor dlq = owned.emplace_back(cpu->alloc(DType::F8E5M2, size_t(N) * V)), dinv = zeros(1),
         dlqt = owned.emplace_back(cpu->alloc(DType::F8E5M2, size_t(N) * V));
  Tensor out = zeros(size_t(N) * N), b = owned.emplace_back(cpu->alloc(DType::F8E4M3, size_t(N) * V));
  for (int i = 0; i < N; ++i) targets.as<int32_t>()[i] = i % V;
  cpu->fill(inv, 0.5);
  prof.open_window();
  prof.swiglu_forward_fp8(q, qt, inv, amax, gu, N, F);
  prof.swiglu_backward_fp8(dq, Tensor{}, inv, amax, dy, gu, N, F);
  prof.cross_entropy_fp8(losses, logits, dlq, Tensor{}, dinv, targets, N, V, -100, 1.0f / N);
  prof.cross_entropy_fp8(losses, logits, dlq, dlqt, dinv, targets, N, V, -100, 1.0f / N);
  prof.matmul_fp8(out, dlq, dinv, b, inv, Tensor{}, N, V, N, false, true);
  prof.mark_step();
  prof.close_window();
  const ProfileReport r = prof.report(prof.measured_step_ms(), 0, 0);
  ASSERT_NE(row(r, "swiglu_forward_fp8 +T"), nullptr);
  ASSERT_NE(row(r, "swiglu_backward_fp8"), nullptr);
  ASSERT_NE(row(r, "cross_entropy +e5m2"), nullptr);
  ASSERT_NE(row(r, "cross_entropy +e5m2 +T"), nullptr);
  ASSERT_NE(row(r, "matmul_fp8 16x32->16 fast"), nullptr);
  for (const ProfileRow& x : r.rows)
    EXPECT_TRUE(x.is_other || x.op.rfind("matmul_fp8", 0) == 0 || x.op.rfind("cross_entropy +e5m2", 0) == 0 ||
                x.op.rfind("swiglu_", 0) == 0 && x.op.find("_fp8") != std::string::npos)
        << "a fused op was decomposed through the wrapper: " << x.op;
  EXPECT_EQ(get(dinv)[0], 1.0f / Backend::dlogits_fp8_scale(1.0f / N)) << "the loss's e5m2 scale";
  EXPECT_DOUBLE_EQ(row(r, "swiglu_forward_fp8 +T")->bytes_per_call, N * F * (2 * 4.0 + 2));  // gate and up read (f32), q and qt written
}

TEST_F(Profiler, SharesSumToOneWithTheOtherRow) {
  const int N = 32, C = 64;
  Tensor x = rand(N * C), w = rand(C * C), y = zeros(N * C), rstd = zeros(N), g = rand(C);
  prof.open_window();
  for (int s = 0; s < 3; ++s) {
    prof.matmul_forward(y, x, w, Tensor{}, N, C, C);
    prof.rmsnorm_forward(y, rstd, x, g, N, C, 1e-6f);
    prof.mark_step();
  }
  prof.close_window();
  const ProfileReport probe = prof.report(0, 0, 0);
  ASSERT_GT(probe.ops_ms_per_step, 0);

  // A step time longer than the ops: "other" is the difference.
  const double step_ms = 2 * probe.ops_ms_per_step + 1;
  const ProfileReport r = prof.report(step_ms, 0, 0);
  double shares = 0, ms = 0;
  for (const auto& row : r.rows) {
    shares += row.share_of_step;
    ms += row.ms_per_step;
    EXPECT_GE(row.ms_per_step, 0);
  }
  EXPECT_NEAR(shares, 1.0, 1e-12);
  EXPECT_NEAR(ms, step_ms, 1e-9 * step_ms);
  EXPECT_NEAR(r.rows.back().ms_per_step, step_ms - r.ops_ms_per_step, 1e-12 * step_ms);

  // One too short: "other" is 0, never negative, and the shares still sum to 1.
  const ProfileReport short_step = prof.report(probe.ops_ms_per_step / 2, 0, 0);
  EXPECT_EQ(short_step.rows.back().ms_per_step, 0);
  shares = 0;
  for (const auto& row : short_step.rows) shares += row.share_of_step;
  EXPECT_NEAR(shares, 1.0, 1e-12);

  // The table: a header naming the steps, a line per row, the ops' names in it.
  const std::string t = r.table();
  EXPECT_NE(t.find("3 steps in the window"), std::string::npos) << t;
  EXPECT_NE(t.find("matmul_forward 32x64->64"), std::string::npos) << t;
  EXPECT_NE(t.find("rmsnorm_forward"), std::string::npos) << t;
  EXPECT_NE(t.find("other (communication, host, gaps)"), std::string::npos) << t;
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 2 + static_cast<long>(r.rows.size())) << t;
}

TEST_F(Profiler, JsonHasTheFields) {
  const int N = 8, C = 16;
  Tensor x = rand(N * C), w = rand(C * C), y = zeros(N * C);
  prof.open_window();
  prof.matmul_forward(y, x, w, Tensor{}, N, C, C);
  prof.add(y, y, x, N * C);
  prof.mark_step();
  prof.close_window();
  const nlohmann::json j = prof.report(100, 989, 4800).json();
  for (const char* k : {"steps", "device", "step_ms", "ops_ms_per_step", "denominator_ms", "peak_tflops", "peak_gbps",
                        "rows"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["steps"], 1);
  EXPECT_EQ(j["step_ms"], 100.0);
  ASSERT_EQ(j["rows"].size(), 3u);
  for (const auto& row : j["rows"])
    for (const char* k : {"op", "calls_per_step", "ms_per_step", "share_of_step", "flops_per_call", "bytes_per_call",
                          "tflops", "gbps", "percent_of_peak", "other"})
      EXPECT_TRUE(row.contains(k)) << k << " in " << row.dump();
  // The matmul has FLOPs and a TFLOP/s; the add bytes and a GB/s; "other" neither.
  for (const auto& row : j["rows"]) {
    const std::string op = row["op"];
    if (op.rfind("matmul_forward", 0) == 0) {
      EXPECT_TRUE(row["tflops"].is_number());
      EXPECT_TRUE(row["gbps"].is_null());
      EXPECT_TRUE(row["percent_of_peak"].is_number());
    } else if (op == "add") {
      EXPECT_TRUE(row["gbps"].is_number());
      EXPECT_TRUE(row["tflops"].is_null());
    } else {
      EXPECT_TRUE(row["other"].get<bool>());
      EXPECT_TRUE(row["percent_of_peak"].is_null());
    }
  }
  // Unknown ceilings: no percentage anywhere. (The report is held in a variable: a
  // range-for over a member of a temporary would read it after it is destroyed.)
  const nlohmann::json unknown = prof.report(100, 0, 0).json();
  for (const auto& row : unknown["rows"]) EXPECT_TRUE(row["percent_of_peak"].is_null());
}

TEST_F(Profiler, MatmulFlopsAndRates) {
  const int N = 64, IC = 48, OC = 80;
  Tensor x = rand(N * IC), w = rand(OC * IC), y = zeros(N * OC), dout = rand(N * OC);
  Tensor dx = zeros(N * IC), dw = zeros(OC * IC);
  prof.open_window();
  for (int s = 0; s < 2; ++s) {
    prof.matmul_forward(y, x, w, Tensor{}, N, IC, OC);
    prof.matmul_backward(dx, dw, Tensor{}, dout, x, w, N, IC, OC);
    prof.matmul_backward(Tensor{}, dw, Tensor{}, dout, x, w, N, IC, OC);  // dweight only
    prof.mark_step();
  }
  prof.close_window();
  const double peak = 2.0;  // TFLOP/s, so that a CPU gets a visible percentage
  const ProfileReport r = prof.report(0, peak, 0);
  const double gemm = 2.0 * N * IC * OC;
  struct Want {
    std::string op;
    double flops;
  } wants[] = {{"matmul_forward 64x48->80", gemm},
               {"matmul_backward 64x48->80", 2 * gemm},
               {"matmul_backward 64x48->80 dW only", gemm}};
  for (const auto& want : wants) {
    const ProfileRow* row = this->row(r, want.op);
    ASSERT_NE(row, nullptr) << want.op;
    EXPECT_DOUBLE_EQ(row->flops_per_call, want.flops) << want.op;
    EXPECT_EQ(row->bytes_per_call, 0) << want.op;
    ASSERT_GT(row->ms_per_step, 0) << want.op;
    // TFLOP/s = FLOPs / time.
    const double tflops = row->calls_per_step * want.flops / (row->ms_per_step * 1e-3) / 1e12;
    EXPECT_NEAR(row->tflops, tflops, 1e-9 * tflops) << want.op;
    EXPECT_NEAR(row->percent_of_peak, 100 * tflops / peak, 1e-9 * 100 * tflops / peak) << want.op;
  }
}

TEST_F(Profiler, AttentionFlops) {
  const int B = 2, T = 8, H = 4, KV = 2, hd = 4;
  Tensor qkv = rand(B * T * (H + 2 * KV) * hd), out = zeros(B * T * H * hd), lse = zeros(B * H * T);
  Tensor dout = rand(B * T * H * hd), dqkv = zeros(B * T * (H + 2 * KV) * hd);
  prof.open_window();
  prof.attention_forward(out, lse, qkv, B, T, H, KV, hd);
  prof.attention_backward(dqkv, dout, out, lse, qkv, B, T, H, KV, hd);
  prof.mark_step();
  prof.close_window();
  const ProfileReport r = prof.report(0, 0, 0);
  const double fwd = 2.0 * 2.0 * B * H * T * T * hd / 2.0;
  ASSERT_NE(row(r, "attention_forward B2 T8 H4 KV2 hd4"), nullptr);
  ASSERT_NE(row(r, "attention_backward B2 T8 H4 KV2 hd4"), nullptr);
  EXPECT_DOUBLE_EQ(row(r, "attention_forward B2 T8 H4 KV2 hd4")->flops_per_call, fwd);
  EXPECT_DOUBLE_EQ(row(r, "attention_backward B2 T8 H4 KV2 hd4")->flops_per_call, 2.5 * fwd);
}

TEST(DeviceCeilings, KnownAndUnknownNames) {
  auto is = [](const std::string& name, double tflops, double gbps) {
    const DeviceCeilings c = device_ceilings(name);
    EXPECT_EQ(c.tflops, tflops) << name;
    EXPECT_EQ(c.gbps, gbps) << name;
  };
  is("cuda:0 (NVIDIA H100 80GB HBM3)", 989, 3350);
  is("cuda:0 (NVIDIA H200)", 989, 4800);
  is("cuda:3 (NVIDIA A100-SXM4-80GB)", 312, 2039);
  is("cuda:0 (NVIDIA L4)", 121, 300);
  is("cuda:0 (NVIDIA L40S)", 0, 0);  // "L4" only as a whole word
  is("cpu", 0, 0);
}

}  // namespace
}  // namespace st

// rmsnorm_forward / rmsnorm_backward and the fused add_rmsnorm_forward: the CPU
// against hand values and finite differences, CUDA against the CPU (and the fused op
// bit for bit against add + rmsnorm_forward) at shapes and alignments that take each
// kernel path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "support/op_harness.h"

namespace st::testing {
namespace {

// ---- CPU ------------------------------------------------------------------------------

TEST_F(CpuOps, RmsNorm) {
  const int N = 3, C = 7;
  const float eps = 1e-5f;
  Tensor x = rand(N * C, -2, 2), wt = rand(C, 0.5, 1.5);
  Tensor out = make(DType::F64, N * C), rstd = make(DType::F64, N);
  be->rmsnorm_forward(out, rstd, x, wt, N, C, eps);
  Vec xv = get(x), wv = get(wt), ov = get(out);
  for (int r = 0; r < N; r++) {
    double ms = 0;
    for (int c = 0; c < C; c++) ms += xv[r * C + c] * xv[r * C + c] / C;
    double rs = 1 / std::sqrt(ms + double(eps));
    EXPECT_NEAR(get(rstd)[r], rs, 1e-14 * rs);
    for (int c = 0; c < C; c++) EXPECT_NEAR(ov[r * C + c], xv[r * C + c] * rs * wv[c], 1e-14);
  }

  Vec w = randv(N * C), dx0 = randv(N * C), dw0 = randv(C);
  Tensor dx = from(dx0), dw = from(dw0);  // both prefilled: both must add
  be->rmsnorm_backward(dx, dw, from(w), x, wt, rstd, N, C);
  auto loss = [&] {
    be->rmsnorm_forward(out, rstd, x, wt, N, C, eps);
    return wsum(w, out);
  };
  expect_grad("dinp", x, minus(get(dx), dx0), loss);
  expect_grad("dweight", wt, minus(get(dw), dw0), loss);
}

// ---- CUDA -----------------------------------------------------------------------------

TEST_F(CudaOps, RmsNorm) {
  const int N = 77, C = 200;  // C not a multiple of 32
  const float eps = 1e-6f;
  for (DType dt : kBoth) {
    Vec x = randv_as(dt, size_t(N) * C, -2, 2), w = randv_as(dt, C, 0.5, 1.5), dy = randv_as(dt, size_t(N) * C);
    Vec dx0 = randv_as(dt, size_t(N) * C), dw0 = randv(C);  // both prefilled: both must add
    Tensor co = make(*cpu, DType::F32, size_t(N) * C), cr = make(*cpu, DType::F32, N);
    Tensor cx = cpu_from(x), cw = cpu_from(w), cdx = cpu_from(dx0), cdw = cpu_from(dw0);
    cpu->rmsnorm_forward(co, cr, cx, cw, N, C, eps);
    cpu->rmsnorm_backward(cdx, cdw, cpu_from(dy), cx, cw, cr, N, C);

    Tensor go = gpu_poisoned(dt, size_t(N) * C), gr = gpu_poisoned(DType::F32, N);
    Tensor gx = gpu_from(x, dt), gw = gpu_from(w, dt), gdx = gpu_from(dx0, dt), gdw = gpu_from(dw0, DType::F32);
    gpu().rmsnorm_forward(go, gr, gx, gw, N, C, eps);
    gpu().rmsnorm_backward(gdx, gdw, gpu_from(dy, dt), gx, gw, gr, N, C);
    expect_close(tag(dt, "rmsnorm out"), get(go), cget(co), tolerance(dt));
    expect_close(tag(dt, "rmsnorm rstd"), get(gr), cget(cr), 1e-5);
    expect_close(tag(dt, "rmsnorm dinp (+=)"), get(gdx), cget(cdx), tolerance(dt));
    expect_close(tag(dt, "rmsnorm dweight (+=)"), get(gdw), cget(cdw), 1e-4);
  }
}

// The fused residual add + norm: against the CPU (add, then rmsnorm of the sum rounded
// to dt, as the GPU rounds it), and bit for bit against add() then rmsnorm_forward()
// on the GPU. Shapes: Qwen2.5-1.5B's C (vector path, row in registers), C % 8 != 0
// (scalar path, partial pack), C = 3000 (past the register cache); slices at offsets
// that break the 16-byte alignment of some or all arguments.
TEST_F(CudaOps, AddRmsNormForward) {
  const float eps = 1e-6f;
  struct Case {
    int N, C;
    size_t off_a, off_b, off_sum, off_out;
  };
  for (const Case k : {Case{37, 1536, 0, 0, 0, 0}, Case{37, 1536, 1, 1, 1, 1}, Case{37, 1536, 0, 3, 0, 0},
                       Case{21, 100, 0, 0, 0, 0}, Case{9, 3000, 0, 0, 0, 0}, Case{9, 3000, 2, 0, 2, 1}}) {
    const int N = k.N, C = k.C;
    const size_t n = size_t(N) * C;
    const std::string what = " N=" + std::to_string(N) + " C=" + std::to_string(C) + " offsets " +
                             std::to_string(k.off_a) + "," + std::to_string(k.off_b) + "," +
                             std::to_string(k.off_sum) + "," + std::to_string(k.off_out);
    for (DType dt : kBoth) {
      Vec a = randv_as(dt, n, -2, 2), b = randv_as(dt, n, -2, 2), w = randv_as(dt, C, 0.5, 1.5);
      Vec sum(n);
      for (size_t i = 0; i < n; i++) sum[i] = a[i] + b[i];
      sum = representable(sum, dt);
      Tensor co = make(*cpu, DType::F32, n), cr = make(*cpu, DType::F32, N);
      cpu->rmsnorm_forward(co, cr, cpu_from(sum), cpu_from(w), N, C, eps);

      Tensor ga = gpu_from_at(a, dt, k.off_a), gb = gpu_from_at(b, dt, k.off_b), gw = gpu_from(w, dt);
      Tensor gs = gpu_poisoned(dt, n, k.off_sum), go = gpu_poisoned(dt, n, k.off_out);
      Tensor gr = gpu_poisoned(DType::F32, N);
      gpu().add_rmsnorm_forward(gs, go, gr, ga, gb, gw, N, C, eps);
      expect_close(tag(dt, "add_rmsnorm sum" + what), get(gs), sum, 1e-6);
      expect_close(tag(dt, "add_rmsnorm out" + what), get(go), cget(co), tolerance(dt));
      expect_close(tag(dt, "add_rmsnorm rstd" + what), get(gr), cget(cr), 1e-5);

      // add + rmsnorm_forward, the unfused sum at another alignment (so the other path of
      // each kernel runs): the same bits.
      Tensor us = gpu_poisoned(dt, n, k.off_sum == 0 ? 1 : 0), uo = gpu_poisoned(dt, n);
      Tensor ur = gpu_poisoned(DType::F32, N);
      gpu().add(us, ga, gb, n);
      gpu().rmsnorm_forward(uo, ur, us, gw, N, C, eps);
      EXPECT_TRUE(raw(us) == raw(gs)) << tag(dt, "sum") << what << ": fused and unfused bits differ";
      EXPECT_TRUE(raw(uo) == raw(go)) << tag(dt, "out") << what << ": fused and unfused bits differ";
      EXPECT_TRUE(raw(ur) == raw(gr)) << tag(dt, "rstd") << what << ": fused and unfused bits differ";
      expect_close(tag(dt, "rmsnorm out" + what), get(uo), cget(co), tolerance(dt));
    }
  }
  // In place: sum written over a.
  for (DType dt : kBoth) {
    const int N = 5, C = 1536;
    const size_t n = size_t(N) * C;
    Vec a = randv_as(dt, n), b = randv_as(dt, n), w = randv_as(dt, C, 0.5, 1.5);
    Tensor ga = gpu_from(a, dt), gb = gpu_from(b, dt), gw = gpu_from(w, dt);
    Tensor ref_s = gpu_poisoned(dt, n), ref_o = gpu_poisoned(dt, n), ref_r = gpu_poisoned(DType::F32, N);
    gpu().add_rmsnorm_forward(ref_s, ref_o, ref_r, ga, gb, gw, N, C, eps);
    Tensor go = gpu_poisoned(dt, n), gr = gpu_poisoned(DType::F32, N);
    gpu().add_rmsnorm_forward(ga, go, gr, ga, gb, gw, N, C, eps);
    EXPECT_TRUE(raw(ga) == raw(ref_s) && raw(go) == raw(ref_o) && raw(gr) == raw(ref_r))
        << tag(dt, "add_rmsnorm in place (sum = a)");
  }
}

// The backward at sizes that take many blocks (3001 rows: not a multiple of any
// block's row count above 1), at C = 1536, C % 8 != 0 and slices off 16-byte
// alignment; dinp and dweight both prefilled (both add). Two runs give the same bits.
TEST_F(CudaOps, RmsNormBackwardLarge) {
  struct Case {
    int N, C;
    size_t off;  // of dinp, dout, inp and weight
  };
  for (const Case k : {Case{3001, 1536, 0}, Case{3001, 1536, 1}, Case{1000, 1000, 0}, Case{517, 4100, 0}}) {
    const int N = k.N, C = k.C;
    const size_t n = size_t(N) * C;
    const std::string what =
        " N=" + std::to_string(N) + " C=" + std::to_string(C) + " offset " + std::to_string(k.off);
    for (DType dt : kBoth) {
      Vec x = randv_as(dt, n, -2, 2), w = randv_as(dt, C, 0.5, 1.5), dy = randv_as(dt, n);
      Vec dx0 = randv_as(dt, n), dw0 = randv(C);
      Vec rs(N);
      for (int r = 0; r < N; r++) {
        double ss = 0;
        for (int c = 0; c < C; c++) ss += double(x[size_t(r) * C + c]) * x[size_t(r) * C + c];
        rs[r] = float(1.0 / std::sqrt(ss / C + 1e-6));
      }
      Tensor cdx = cpu_from(dx0), cdw = cpu_from(dw0);
      cpu->rmsnorm_backward(cdx, cdw, cpu_from(dy), cpu_from(x), cpu_from(w), cpu_from(rs), N, C);
      Tensor gdy = gpu_from_at(dy, dt, k.off), gx = gpu_from_at(x, dt, k.off), gw = gpu_from_at(w, dt, k.off);
      Tensor grs = gpu_from(rs, DType::F32);
      std::vector<std::vector<uint8_t>> dx_bits, dw_bits;
      for (int rep = 0; rep < 2; rep++) {
        Tensor gdx = gpu_from_at(dx0, dt, k.off), gdw = gpu_from(dw0, DType::F32);
        gpu().rmsnorm_backward(gdx, gdw, gdy, gx, gw, grs, N, C);
        if (rep == 0) {
          expect_close(tag(dt, "rmsnorm dinp (+=)" + what), get(gdx), cget(cdx), tolerance(dt));
          expect_close(tag(dt, "rmsnorm dweight (+=)" + what), get(gdw), cget(cdw), 1e-4);
        }
        dx_bits.push_back(raw(gdx)), dw_bits.push_back(raw(gdw));
      }
      EXPECT_TRUE(dx_bits[0] == dx_bits[1]) << tag(dt, "rmsnorm dinp") << what << ": not deterministic";
      EXPECT_TRUE(dw_bits[0] == dw_bits[1]) << tag(dt, "rmsnorm dweight") << what << ": not deterministic";
    }
  }
}

}  // namespace
}  // namespace st::testing

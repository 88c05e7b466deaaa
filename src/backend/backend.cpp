// The checked fronts of the op interface (backend.h): every argument contract is
// written here once, in the order the messages promise, before the backend's do_<op>
// runs. What differs between backends (the dtypes they compute in, attention's head
// dim limit, where ids are read) comes from op_rules() and check_ids().
#include "backend/backend.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/op_checks.h"
#include "backend/stochastic_round.h"
#include "core/error.h"
#include "core/rng.h"

namespace st {

// ---- helpers ----------------------------------------------------------------------

void check_ids_on_host(const int32_t* ids, size_t n, int V, bool has_ignore, int ignore, const char* what,
                       const char* op) {
  for (size_t r = 0; r < n; ++r) {
    const int32_t id = ids[r];
    if (has_ignore && id == ignore) continue;
    ST_CHECK(id >= 0 && id < V, op ? op : "", op ? ": " : "", what, " ", id, " at row ", r, " is outside [0, V=", V,
             ")");
  }
}

DType Backend::act_dtype(const char* op, const char* name, Tensor t) const {
  const OpRules r = op_rules();
  ST_CHECK(t.dtype == r.act[0] || t.dtype == r.act[1], op, ": ", name, " is ", dtype_name(t.dtype), "; ",
           r.act_text);
  return t.dtype;
}

namespace {

void check_heads(const char* op, int B, int T, int H, int KV, int hd) {
  check_dim(op, "B", B), check_dim(op, "T", T), check_dim(op, "H", H), check_dim(op, "KV", KV),
      check_dim(op, "hd", hd);
  ST_CHECK(H % KV == 0, op, ": H=", H, " is not a multiple of KV=", KV);
}

// A tensor that has elements has memory for them.
void check_not_empty(const char* op, Tensor t) {
  ST_CHECK(!t.empty() || t.numel == 0, op, ": empty tensor of ", t.numel, " elements");
}

}  // namespace

void Backend::check_rope(const char* op, Tensor qkv, int B, int T, int H, int KV, int hd, float theta) const {
  check_heads(op, B, T, H, KV, hd);
  ST_CHECK(hd % 2 == 0, op, ": head_dim ", hd, " must be even");
  ST_CHECK(theta > 0, op, ": theta must be positive, got ", theta);
  DType dt = act_dtype(op, "qkv", qkv);
  check_buf(op, "qkv", qkv, dt, size_t(B) * T * (H + 2 * KV) * hd);
}

void Backend::check_attention(const char* op, int B, int T, int H, int KV, int hd) const {
  check_heads(op, B, T, H, KV, hd);
  const OpRules r = op_rules();
  if (r.max_head_dim > 0)
    ST_CHECK(hd <= r.max_head_dim, op, ": head_dim ", hd, " is above ", r.max_head_dim_text, " limit of ",
             r.max_head_dim);
}

// ---- memory -------------------------------------------------------------------------

void Backend::fill(Tensor t, double value) {
  check_not_empty("fill", t);
  do_fill(t, value);
}

void Backend::fill_normal(Tensor t, uint64_t key, uint64_t first, double stddev) {
  ST_CHECK(t.dtype == DType::F32 || t.dtype == DType::F64, "fill_normal: ", dtype_name(t.dtype),
           " tensors are not supported (F32, F64)");
  check_not_empty("fill_normal", t);
  do_fill_normal(t, key, first, stddev);
}

// The default seeded fill: computed on the host in pieces, each uploaded into place.
void Backend::do_fill_normal(Tensor t, uint64_t key, uint64_t first, double stddev) {
  constexpr size_t kPiece = size_t{1} << 20;
  std::vector<double> d;
  std::vector<float> f;
  for (size_t at = 0; at < t.numel; at += kPiece) {
    const size_t n = std::min(kPiece, t.numel - at);
    d.resize(n);
    for (size_t i = 0; i < n; ++i) d[i] = stddev * counter_normal(key, first + at + i);
    if (t.dtype == DType::F64) {
      do_upload(t.slice(at, n), d.data());
    } else {
      f.assign(d.begin(), d.end());
      do_upload(t.slice(at, n), f.data());
    }
  }
}

void Backend::copy(Tensor dst, Tensor src) {
  ST_CHECK(dst.numel == src.numel, "copy: dst has ", dst.numel, " elements, src ", src.numel);
  if (dst.numel == 0) return;
  ST_CHECK(!dst.empty() && !src.empty(), "copy: empty tensor");
  do_copy(dst, src);
}

void Backend::upload(Tensor dst, const void* host) {
  check_not_empty("upload", dst);
  if (dst.numel) do_upload(dst, host);
}

void Backend::download(void* host, Tensor src) {
  check_not_empty("download", src);
  if (src.numel) do_download(host, src);
}

void Backend::upload_async(Tensor dst, const void* host, Lane lane) {
  check_not_empty("upload_async", dst);
  if (dst.numel) do_upload_async(dst, host, lane);
}

void Backend::download_async(void* host, Tensor src, Lane lane) {
  check_not_empty("download_async", src);
  if (src.numel) do_download_async(host, src, lane);
}

void Backend::upload_ids(Tensor dst, const int32_t* host, int V, bool has_ignore, int ignore, const char* what) {
  ST_CHECK(dst.dtype == DType::I32, "upload_ids: ", what, " tensor is ", dtype_name(dst.dtype), ", expected i32");
  check_ids_on_host(host, dst.numel, V, has_ignore, ignore, what);
  check_not_empty("upload", dst);
  if (dst.numel) do_upload_ids(dst, host, V, has_ignore, ignore);
}

// ---- element-wise -------------------------------------------------------------------

void Backend::add(Tensor out, Tensor a, Tensor b, size_t n) {
  DType dt = act_dtype("add", "out", out);
  check_buf("add", "out", out, dt, n);
  check_buf("add", "a", a, dt, n);
  check_buf("add", "b", b, dt, n);
  do_add(out, a, b, n);
}

void Backend::accumulate(Tensor acc, Tensor x, size_t n) {
  DType dt = act_dtype("accumulate", "acc", acc);
  check_buf("accumulate", "acc", acc, dt, n);
  check_buf("accumulate", "x", x, dt, n);
  do_accumulate(acc, x, n);
}

double Backend::sum_squares(Tensor x, size_t n) {
  ST_CHECK(x.numel >= n, "sum_squares: x holds ", x.numel, " elements, needs ", n);
  if (n == 0) return 0.0;
  return do_sum_squares(x, n);
}

double Backend::sum_squares_total(const std::vector<std::pair<Tensor, size_t>>& parts) {
  for (const auto& [x, n] : parts) ST_CHECK(x.numel >= n, "sum_squares: x holds ", x.numel, " elements, needs ", n);
  return do_sum_squares_total(parts);
}

// ---- embedding ----------------------------------------------------------------------

void Backend::embedding_forward(Tensor out, Tensor tokens, Tensor wte, int N, int C, int V) {
  const char* op = "embedding_forward";
  check_dim(op, "N", N), check_dim(op, "C", C), check_dim(op, "V", V);
  DType dt = act_dtype(op, "wte", wte);
  check_buf(op, "out", out, dt, size_t(N) * C);
  check_buf(op, "tokens", tokens, DType::I32, N);
  check_buf(op, "wte", wte, dt, size_t(V) * C);
  check_ids(op, "token id", tokens, N, V, false, 0);
  do_embedding_forward(out, tokens, wte, N, C, V);
}

void Backend::embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int N, int C, int V) {
  const char* op = "embedding_backward";
  check_dim(op, "N", N), check_dim(op, "C", C), check_dim(op, "V", V);
  // The dtype from the first argument holding activations: dwte too where gradients
  // take the activations' dtype.
  DType dt = op_rules().f32_grads_and_stats ? act_dtype(op, "dout", dout) : act_dtype(op, "dwte", dwte);
  check_buf(op, "dwte", dwte, side_dtype(dt), size_t(V) * C);
  check_buf(op, "dout", dout, dt, size_t(N) * C);
  check_buf(op, "tokens", tokens, DType::I32, N);
  check_ids(op, "token id", tokens, N, V, false, 0);
  do_embedding_backward(dwte, dout, tokens, N, C, V);
}

// ---- RMSNorm ------------------------------------------------------------------------

void Backend::rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, int N, int C, float eps) {
  const char* op = "rmsnorm_forward";
  check_dim(op, "N", N), check_dim(op, "C", C);
  DType dt = act_dtype(op, "inp", inp);
  check_buf(op, "out", out, dt, size_t(N) * C);
  check_buf(op, "rstd", rstd, side_dtype(dt), N);
  check_buf(op, "inp", inp, dt, size_t(N) * C);
  check_buf(op, "weight", weight, dt, C);
  do_rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
}

void Backend::rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd,
                               int N, int C) {
  const char* op = "rmsnorm_backward";
  check_dim(op, "N", N), check_dim(op, "C", C);
  DType dt = act_dtype(op, "inp", inp);
  const size_t nc = size_t(N) * C;
  check_buf(op, "dinp", dinp, dt, nc);
  check_buf(op, "dweight", dweight, side_dtype(dt), C);
  check_buf(op, "dout", dout, dt, nc);
  check_buf(op, "inp", inp, dt, nc);
  check_buf(op, "weight", weight, dt, C);
  check_buf(op, "rstd", rstd, side_dtype(dt), N);
  do_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
}

void Backend::add_rmsnorm_forward(Tensor sum, Tensor out, Tensor rstd, Tensor a, Tensor b, Tensor weight, int N,
                                  int C, float eps) {
  const char* op = "add_rmsnorm_forward";
  check_dim(op, "N", N), check_dim(op, "C", C);
  DType dt = act_dtype(op, "a", a);
  const size_t n = size_t(N) * C;
  check_buf(op, "sum", sum, dt, n);
  check_buf(op, "out", out, dt, n);
  check_buf(op, "rstd", rstd, side_dtype(dt), N);
  check_buf(op, "a", a, dt, n);
  check_buf(op, "b", b, dt, n);
  check_buf(op, "weight", weight, dt, C);
  do_add_rmsnorm_forward(sum, out, rstd, a, b, weight, N, C, eps);
}

// ---- linear -------------------------------------------------------------------------

void Backend::matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias, int N, int IC, int OC) {
  const char* op = "matmul_forward";
  check_dim(op, "N", N), check_dim(op, "IC", IC), check_dim(op, "OC", OC);
  DType dt = act_dtype(op, "inp", inp);
  check_buf(op, "out", out, dt, size_t(N) * OC);
  check_buf(op, "inp", inp, dt, size_t(N) * IC);
  check_buf(op, "weight", weight, dt, size_t(OC) * IC);
  if (!bias.empty()) check_buf(op, "bias", bias, dt, OC);
  do_matmul_forward(out, inp, weight, bias, N, IC, OC);
}

void Backend::matmul_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                              int N, int IC, int OC) {
  const char* op = "matmul_backward";
  check_dim(op, "N", N), check_dim(op, "IC", IC), check_dim(op, "OC", OC);
  DType dt = act_dtype(op, "inp", inp);
  if (!dinp.empty()) check_buf(op, "dinp", dinp, dt, size_t(N) * IC);
  // dweight may be empty too (a frozen weight): the contract only says so for
  // dinp and dbias, but skipping is the only sensible reading of an empty buffer.
  if (!dweight.empty()) check_buf(op, "dweight", dweight, side_dtype(dt), size_t(OC) * IC);
  if (!dbias.empty()) check_buf(op, "dbias", dbias, side_dtype(dt), OC);
  check_buf(op, "dout", dout, dt, size_t(N) * OC);
  check_buf(op, "inp", inp, dt, size_t(N) * IC);
  check_buf(op, "weight", weight, dt, size_t(OC) * IC);
  do_matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
}

// ---- FP8 ----------------------------------------------------------------------------

namespace {
bool is_fp8(DType t) { return t == DType::F8E4M3 || t == DType::F8E5M2; }
}  // namespace

void Backend::fp8_quantize(Tensor q, Tensor qt, Tensor inv_scale, Tensor x, int rows, int cols, bool reuse_scale,
                           Tensor amax) {
  const char* op = "fp8_quantize";
  check_dim(op, "rows", rows), check_dim(op, "cols", cols);
  ST_CHECK(!q.empty() || !qt.empty(), op, ": q and qt are both empty (nothing to write)");
  const DType qd = q.empty() ? qt.dtype : q.dtype;
  ST_CHECK(is_fp8(qd), op, ": q is ", dtype_name(qd), ", expected f8e4m3 or f8e5m2");
  const size_t n = size_t(rows) * cols;
  if (!q.empty()) check_buf(op, "q", q, qd, n);
  if (!qt.empty()) check_buf(op, "qt", qt, qd, n);
  check_buf(op, "inv_scale", inv_scale, DType::F32, 1);
  check_buf(op, "x", x, act_dtype(op, "x", x), n);
  if (!amax.empty()) check_buf(op, "amax", amax, DType::F32, 1);
  do_fp8_quantize(q, qt, inv_scale, x, rows, cols, reuse_scale, amax);
}

void Backend::fp8_transpose(Tensor qt, Tensor q, int rows, int cols) {
  const char* op = "fp8_transpose";
  check_dim(op, "rows", rows), check_dim(op, "cols", cols);
  ST_CHECK(is_fp8(q.dtype), op, ": q is ", dtype_name(q.dtype), ", expected f8e4m3 or f8e5m2");
  const size_t n = size_t(rows) * cols;
  check_buf(op, "q", q, q.dtype, n);
  check_buf(op, "qt", qt, q.dtype, n);
  ST_CHECK(qt.data != q.data, op, ": not in place");
  do_fp8_transpose(qt, q, rows, cols);
}

void Backend::fp8_roll_scales(Tensor inv_scale, int stride, Tensor amax, Tensor history, int n, int len, int pos,
                              Fp8Format format) {
  const char* op = "fp8_roll_scales";
  check_dim(op, "n", n), check_dim(op, "len", len), check_dim(op, "stride", stride);
  ST_CHECK(pos >= 0 && pos < len, op, ": pos ", pos, " is outside the history of ", len);
  check_buf(op, "inv_scale", inv_scale, DType::F32, size_t(n - 1) * stride + 1);
  check_buf(op, "amax", amax, DType::F32, size_t(n));
  check_buf(op, "history", history, DType::F32, size_t(n) * len);
  do_fp8_roll_scales(inv_scale, stride, amax, history, n, len, pos, format);
}

void Backend::matmul_fp8(Tensor out, Tensor a, Tensor a_inv, Tensor b, Tensor b_inv, Tensor bias, int M, int K,
                         int N, bool accumulate, bool fast_accum) {
  const char* op = "matmul_fp8";
  check_dim(op, "M", M), check_dim(op, "K", K), check_dim(op, "N", N);
  ST_CHECK(M % 16 == 0 && K % 16 == 0 && N % 16 == 0, op, ": M, K and N must be multiples of 16, got M=", M,
           " K=", K, " N=", N);
  ST_CHECK(is_fp8(a.dtype), op, ": a is ", dtype_name(a.dtype), ", expected f8e4m3 or f8e5m2");
  ST_CHECK(is_fp8(b.dtype), op, ": b is ", dtype_name(b.dtype), ", expected f8e4m3 or f8e5m2");
  ST_CHECK(!(a.dtype == DType::F8E5M2 && b.dtype == DType::F8E5M2), op,
           ": a and b are both f8e5m2 (FP8 tensor cores take e4m3 x e4m3 or one e5m2)");
  check_buf(op, "a", a, a.dtype, size_t(M) * K);
  check_buf(op, "b", b, b.dtype, size_t(N) * K);
  check_buf(op, "a_inv", a_inv, DType::F32, 1);
  check_buf(op, "b_inv", b_inv, DType::F32, 1);
  DType od;
  if (accumulate) {
    ST_CHECK(bias.empty(), op, ": no bias with accumulate");
    od = side_dtype(op_rules().act[0]);
    if (out.dtype != od) od = side_dtype(op_rules().act[1]);
  } else {
    od = act_dtype(op, "out", out);
  }
  check_buf(op, "out", out, od, size_t(M) * N);
  if (!bias.empty()) check_buf(op, "bias", bias, od, N);
  do_matmul_fp8(out, a, a_inv, b, b_inv, bias, M, K, N, accumulate, fast_accum);
}

// ---- RoPE and attention -------------------------------------------------------------

void Backend::rope_forward(Tensor qkv, int B, int T, int H, int KV, int hd, float theta) {
  check_rope("rope_forward", qkv, B, T, H, KV, hd, theta);
  do_rope(qkv, B, T, H, KV, hd, theta, +1);
}

void Backend::rope_backward(Tensor dqkv, int B, int T, int H, int KV, int hd, float theta) {
  check_rope("rope_backward", dqkv, B, T, H, KV, hd, theta);
  do_rope(dqkv, B, T, H, KV, hd, theta, -1);
}

void Backend::attention_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int H, int KV, int hd) {
  const char* op = "attention_forward";
  check_attention(op, B, T, H, KV, hd);
  DType dt = act_dtype(op, "qkv", qkv);
  const size_t rows = size_t(B) * T;
  check_buf(op, "out", out, dt, rows * H * hd);
  check_buf(op, "lse", lse, side_dtype(dt), rows * H);
  check_buf(op, "qkv", qkv, dt, rows * (H + 2 * KV) * hd);
  do_attention_forward(out, lse, qkv, B, T, H, KV, hd);
}

void Backend::attention_backward(Tensor dqkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv, int B, int T, int H,
                                 int KV, int hd) {
  const char* op = "attention_backward";
  check_attention(op, B, T, H, KV, hd);
  DType dt = act_dtype(op, "qkv", qkv);
  const size_t rows = size_t(B) * T;
  check_buf(op, "dqkv", dqkv, dt, rows * (H + 2 * KV) * hd);
  check_buf(op, "dout", dout, dt, rows * H * hd);
  check_buf(op, "out", out, dt, rows * H * hd);
  check_buf(op, "lse", lse, side_dtype(dt), rows * H);
  check_buf(op, "qkv", qkv, dt, rows * (H + 2 * KV) * hd);
  do_attention_backward(dqkv, dout, out, lse, qkv, B, T, H, KV, hd);
}

// ---- SwiGLU -------------------------------------------------------------------------

namespace {

// A fused cast's outputs: q and/or qt (not both empty), one FP8 dtype, n elements each.
void check_fp8_outputs(const char* op, Tensor q, Tensor qt, size_t n) {
  ST_CHECK(!q.empty() || !qt.empty(), op, ": q and qt are both empty (nothing to write)");
  const DType qd = q.empty() ? qt.dtype : q.dtype;
  ST_CHECK(is_fp8(qd), op, ": q is ", dtype_name(qd), ", expected f8e4m3 or f8e5m2");
  if (!q.empty()) check_buf(op, "q", q, qd, n);
  if (!qt.empty()) check_buf(op, "qt", qt, qd, n);
}

}  // namespace

void Backend::swiglu_forward(Tensor out, Tensor gu, int N, int F) {
  const char* op = "swiglu_forward";
  check_dim(op, "N", N), check_dim(op, "F", F);
  DType dt = act_dtype(op, "gu", gu);
  check_buf(op, "out", out, dt, size_t(N) * F);
  check_buf(op, "gu", gu, dt, size_t(N) * 2 * F);
  do_swiglu_forward(out, gu, N, F);
}

void Backend::swiglu_backward(Tensor dgu, Tensor dout, Tensor gu, int N, int F) {
  const char* op = "swiglu_backward";
  check_dim(op, "N", N), check_dim(op, "F", F);
  DType dt = act_dtype(op, "gu", gu);
  check_buf(op, "dgu", dgu, dt, size_t(N) * 2 * F);
  check_buf(op, "dout", dout, dt, size_t(N) * F);
  check_buf(op, "gu", gu, dt, size_t(N) * 2 * F);
  do_swiglu_backward(dgu, dout, gu, N, F);
}

void Backend::swiglu_backward_fp8(Tensor q, Tensor qt, Tensor inv_scale, Tensor amax, Tensor dout, Tensor gu, int N,
                                  int F) {
  const char* op = "swiglu_backward_fp8";
  check_dim(op, "N", N), check_dim(op, "F", F);
  DType dt = act_dtype(op, "gu", gu);
  check_buf(op, "dout", dout, dt, size_t(N) * F);
  check_buf(op, "gu", gu, dt, size_t(N) * 2 * F);
  check_fp8_outputs(op, q, qt, size_t(N) * 2 * F);
  check_buf(op, "inv_scale", inv_scale, DType::F32, 1);
  if (!amax.empty()) check_buf(op, "amax", amax, DType::F32, 1);
  do_swiglu_backward_fp8(q, qt, inv_scale, amax, dout, gu, N, F);
}

void Backend::swiglu_forward_fp8(Tensor q, Tensor qt, Tensor inv_scale, Tensor amax, Tensor gu, int N, int F) {
  const char* op = "swiglu_forward_fp8";
  check_dim(op, "N", N), check_dim(op, "F", F);
  DType dt = act_dtype(op, "gu", gu);
  check_buf(op, "gu", gu, dt, size_t(N) * 2 * F);
  check_fp8_outputs(op, q, qt, size_t(N) * F);
  check_buf(op, "inv_scale", inv_scale, DType::F32, 1);
  if (!amax.empty()) check_buf(op, "amax", amax, DType::F32, 1);
  do_swiglu_forward_fp8(q, qt, inv_scale, amax, gu, N, F);
}

void Backend::do_swiglu_forward_fp8(Tensor q, Tensor qt, Tensor inv_scale, Tensor amax, Tensor gu, int N, int F) {
  Tensor out = alloc(gu.dtype, size_t(N) * F);
  do_swiglu_forward(out, gu, N, F);
  do_fp8_quantize(q, qt, inv_scale, out, N, F, true, amax);
  free(out);
}

// The composition, for backends without a fused kernel: the same bits by definition.
void Backend::do_swiglu_backward_fp8(Tensor q, Tensor qt, Tensor inv_scale, Tensor amax, Tensor dout, Tensor gu,
                                     int N, int F) {
  Tensor dgu = alloc(gu.dtype, size_t(N) * 2 * F);
  do_swiglu_backward(dgu, dout, gu, N, F);
  do_fp8_quantize(q, qt, inv_scale, dgu, N, 2 * F, true, amax);
  free(dgu);
}

// ---- cross-entropy --------------------------------------------------------------------

void Backend::check_cross_entropy(const char* op, Tensor losses, Tensor logits, Tensor targets, int N, int V,
                                  int ignore_index) {
  check_dim(op, "N", N), check_dim(op, "V", V);
  DType dt = act_dtype(op, "logits", logits);
  check_buf(op, "losses", losses, side_dtype(dt), N);
  check_buf(op, "logits", logits, dt, size_t(N) * V);
  check_buf(op, "targets", targets, DType::I32, N);
  check_ids(op, "target", targets, N, V, true, ignore_index);
}

void Backend::cross_entropy(Tensor losses, Tensor logits, Tensor targets, int N, int V, int ignore_index,
                            float dloss_scale, bool grad) {
  check_cross_entropy("cross_entropy", losses, logits, targets, N, V, ignore_index);
  do_cross_entropy(losses, logits, targets, N, V, ignore_index, dloss_scale, grad);
}

float Backend::dlogits_fp8_scale(float dloss_scale) {
  return fp8_scale(std::fabs(dloss_scale), fp8_spec(Fp8Format::E5M2).max_finite);
}

void Backend::cross_entropy_fp8(Tensor losses, Tensor logits, Tensor dq, Tensor dqt, Tensor inv_scale, Tensor targets,
                                int N, int V, int ignore_index, float dloss_scale, uint64_t round_key) {
  const char* op = "cross_entropy_fp8";
  check_cross_entropy(op, losses, logits, targets, N, V, ignore_index);
  check_buf(op, "dq", dq, DType::F8E5M2, size_t(N) * V);
  if (!dqt.empty()) check_buf(op, "dqt", dqt, DType::F8E5M2, size_t(N) * V);
  check_buf(op, "inv_scale", inv_scale, DType::F32, 1);
  do_cross_entropy_fp8(losses, logits, dq, dqt, inv_scale, targets, N, V, ignore_index, dloss_scale, round_key);
}

// The composition, for backends without a fused kernel: the same bits by definition.
// Stochastic rounding has no op of its own: the gradient comes to the host (as f32,
// which holds the activation dtype's value exactly where that is bf16 or f32) and its
// codes go back.
void Backend::do_cross_entropy_fp8(Tensor losses, Tensor logits, Tensor dq, Tensor dqt, Tensor inv_scale,
                                   Tensor targets, int N, int V, int ignore_index, float dloss_scale,
                                   uint64_t round_key) {
  do_cross_entropy(losses, logits, targets, N, V, ignore_index, dloss_scale, true);
  const float s = dlogits_fp8_scale(dloss_scale);
  do_fill(inv_scale, 1.0 / double(s));
  if (round_key == 0) return do_fp8_quantize(dq, dqt, inv_scale, logits, N, V, true, Tensor{});
  const size_t n = size_t(N) * V;
  Tensor f = alloc(DType::F32, n);
  do_copy(f, logits);
  std::vector<float> g(n);
  download(g.data(), f);
  free(f);
  std::vector<uint8_t> q(n), qt(dqt.empty() ? 0 : n);
  for (size_t i = 0; i < n; ++i) {
    q[i] = fp8_encode(e5m2_round_stochastic(g[i] * s, random8(round_key, i)), Fp8Format::E5M2);
    if (!qt.empty()) qt[(i % V) * N + i / V] = q[i];
  }
  upload(dq, q.data());
  if (!dqt.empty()) upload(dqt, qt.data());
}

// ---- AdamW ----------------------------------------------------------------------------

namespace {

void check_adamw(const char* op, Tensor param, Tensor grad, Tensor m, Tensor v, size_t n) {
  ST_CHECK(param.dtype == DType::F32 || param.dtype == DType::BF16, op, ": param is ", dtype_name(param.dtype),
           "; f32 or bf16 expected");
  ST_CHECK(m.dtype == DType::F32 || m.dtype == DType::BF16, op, ": m is ", dtype_name(m.dtype),
           "; f32 or bf16 expected");
  check_buf(op, "param", param, param.dtype, n);
  check_buf(op, "grad", grad, DType::F32, n);
  check_buf(op, "m", m, m.dtype, n);
  check_buf(op, "v", v, m.dtype, n);
}

}  // namespace

void Backend::adamw(Tensor param, Tensor grad, Tensor m, Tensor v, size_t n, const AdamWParams& p) {
  const char* op = "adamw";
  if (n == 0) return;
  check_adamw(op, param, grad, m, v, n);
  ST_CHECK(p.step >= 1, op, ": step is 1-based, got ", p.step);
  do_adamw(param, grad, m, v, n, p);
}

void Backend::adamw_copy(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor copy, size_t n,
                         const AdamWParams& p) {
  const char* op = "adamw_copy";
  if (n == 0) return;
  check_adamw(op, param, grad, m, v, n);
  check_buf(op, "copy", copy, copy.dtype, n);
  ST_CHECK(p.step >= 1, op, ": step is 1-based, got ", p.step);
  do_adamw_copy(param, grad, m, v, copy, n, p);
}

}  // namespace st

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>

#include "backend/backend.h"
#include "comm/comm.h"
#include "comm/comm_gloo.h"
#include "comm/tcp_store.h"
#include "core/collective.h"
#include "fsdp/fsdp.h"
#include "config/model_config.h"
#include "model/dense_params.h"
#include "model/init.h"
#include "model/qwen2.h"
#include "support/fork_ranks.h"

namespace st {
namespace {

ModelConfig cfg() {
  ModelConfig c = model_preset("tiny");
  c.num_layers = 2;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  return c;
}

// Fsdp over cfg() as the only rank, initialised from `seed`.
struct OneRank {
  explicit OneRank(uint64_t seed) { f.init_weights(seed); }
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::unique_ptr<Comm> comm = make_single_comm(*be);
  ParamLayout layout{cfg()};
  ShardPlan plan{layout, 1};
  Fsdp f{plan, *be, *comm, nullptr, {}};
};

TEST(Fsdp, InitEqualsTheLayoutInitAndRoundTrips) {
  OneRank one(11);
  const ParamLayout& layout = one.layout;
  Fsdp& f = one.f;
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
  ParamLayout layout(c);
  ShardPlan three(layout, 3);
  for (int u = 0; u < layout.num_units(); ++u) {
    const Unit& a = layout.unit(u);
    const ElemRange r = three.range_of(u, 2);
    std::vector<float> whole(a.numel), part(r.size());
    init_unit_values(a, 5, 0.02, 0, a.numel, whole.data());
    init_unit_values(a, 5, 0.02, r.begin, r.end, part.data());
    for (size_t i = 0; i < r.size(); ++i) {
      const size_t g = r.begin + i;
      ASSERT_EQ(part[i], g < a.numel ? whole[g] : 0.0f) << a.name << " " << g;
    }
  }
}

TEST(Fsdp, WeightDecayOnlyOnMatrices) {
  OneRank one(3);
  const ParamLayout& layout = one.layout;
  Fsdp& f = one.f;
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
  ParamLayout layout(c);
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

  // The general path (gather, reduce-scatter) at one rank, and the in-place one.
  for (auto [reshard, in_place] : {std::pair{true, false}, std::pair{false, false}, std::pair{true, true}}) {
    FsdpOptions o;
    o.reshard_after_forward = reshard;
    o.in_place_when_alone = in_place;
    ShardPlan plan(layout, 1);
    Fsdp f(plan, *be, *comm, nullptr, o);
    f.init_weights(9);
    f.zero_grads();
    const LossSum lf = model.forward_backward(f, tok.data(), tgt.data(), 1.0f / (B * T), -100);
    EXPECT_EQ(lf.sum, ld.sum);
    EXPECT_NEAR(f.grad_norm(), std::sqrt(want_sq), 1e-6 * std::sqrt(want_sq));
    // Element by element, every unit: the same program on the same values gives the
    // same bits, whatever path the gradient took through the shard.
    size_t at = 0, differ = 0;
    for (int u = 0; u < layout.num_units(); ++u) {
      const std::vector<float> got = f.download_shard(u, ShardState::Grad);
      ASSERT_EQ(got.size(), plan.shard_numel(u));
      for (size_t i = 0; i < layout.unit(u).numel; ++i) differ += static_cast<double>(got[i]) != want[at + i];
      for (size_t i = layout.unit(u).numel; i < got.size(); ++i) differ += got[i] != 0.0f;  // padding
      at += layout.unit(u).numel;
    }
    EXPECT_EQ(at, want.size());
    EXPECT_EQ(differ, 0u) << (reshard ? "reshard" : "no reshard") << (in_place ? ", in place" : "");
    if (in_place)
      EXPECT_EQ(f.memory().gathered_peak_bytes, 0u);  // nothing gathered: the shards were used as they are
    else
      EXPECT_GT(f.memory().gathered_peak_bytes, 0u);
  }
}

// A comm whose asynchronous collectives run only when waited for, the latest moment
// a real one may finish. At the start their outputs are poisoned with NaN (f32 or
// bf16; except an in-place input slot) and their inputs' bytes are copied; at the wait the inputs must
// be unchanged. So Fsdp reading a result before waiting, or touching a buffer of a
// collective in flight, shows up as a wrong number or a failed check.
class DeferredComm final : public Comm {
 public:
  explicit DeferredComm(Comm& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int world() const override { return inner_.world(); }
  void all_gather(Tensor r, Tensor s, size_t n) override { inner_.all_gather(r, s, n); }
  void reduce_scatter(Tensor r, Tensor s, size_t n) override { inner_.reduce_scatter(r, s, n); }
  void all_reduce(Tensor b, size_t n) override { inner_.all_reduce(b, n); }
  void broadcast(Tensor b, size_t n, int root) override { inner_.broadcast(b, n, root); }
  void barrier() override { inner_.barrier(); }
  double all_reduce_sum(double v) override { return inner_.all_reduce_sum(v); }

  CommWork all_gather_async(Tensor recv, Tensor send, size_t n) override {
    const bool in_place = send.data == recv.as<char>() + static_cast<size_t>(rank()) * n * dtype_size(recv.dtype);
    Op op{snapshot(send, n), send, n, [=, this] { inner_.all_gather(recv, send, n); }};
    poison(recv, in_place ? static_cast<size_t>(rank()) * n : 0, in_place ? n : 0);
    return start(std::move(op));
  }
  CommWork reduce_scatter_async(Tensor recv, Tensor send, size_t n) override {
    Op op{snapshot(send, n * world()), send, n * world(), [=, this] { inner_.reduce_scatter(recv, send, n); }};
    poison(recv, 0, 0);
    return start(std::move(op));
  }
  CommWork all_reduce_async(Tensor buf, size_t n) override {
    return start(Op{snapshot(buf, n), buf, n, [=, this] { inner_.all_reduce(buf, n); }});
  }
  void wait(CommWork w) override {
    auto it = ops_.find(w.id);
    if (it == ops_.end()) return;
    if (snapshot(it->second.input, it->second.input_numel) != it->second.before) ++inputs_changed;
    it->second.run();
    ops_.erase(it);
  }

  size_t in_flight() const { return ops_.size(); }
  size_t max_in_flight = 0, started = 0, inputs_changed = 0;

 private:
  struct Op {
    std::vector<char> before;
    Tensor input;
    size_t input_numel;
    std::function<void()> run;
  };
  static std::vector<char> snapshot(Tensor t, size_t n) {
    ST_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, "DeferredComm handles f32 and bf16 only");
    return std::vector<char>(t.as<char>(), t.as<char>() + n * dtype_size(t.dtype));
  }
  void poison(Tensor t, size_t keep_from, size_t keep_n) {
    for (size_t i = 0; i < t.numel; ++i) {
      if (i >= keep_from && i < keep_from + keep_n) continue;
      if (t.dtype == DType::BF16)
        t.as<uint16_t>()[i] = 0x7fc0;  // a quiet NaN
      else
        t.as<float>()[i] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  CommWork start(Op op) {
    ops_.emplace(++next_, std::move(op));
    ++started;
    max_in_flight = std::max(max_in_flight, ops_.size());
    return {next_};
  }
  Comm& inner_;
  std::map<uint64_t, Op> ops_;
  uint64_t next_ = 0;
};

// Two ranks (forked processes over Gloo), three optimizer steps of two micro-batches
// each: through a comm that defers its collectives, the losses, gradient norms and
// final weights are bit-identical to those through the same comm used synchronously,
// with gathers prefetched and reductions retired late (several collectives in flight
// at once), no input touched while in flight, and nothing left in flight after a
// step. The real overlap, Gloo's comm thread (dist.overlap), trains the same bit for
// bit too. Plain FSDP over both ranks, and HSDP with the replicate all-reduce across
// them; with and without resharding after forward; gradients reduced in f32 and in
// bf16 (which trains close to f32, not equal to it).
TEST(Fsdp, OverlappedCollectivesGiveTheSameTraining) {
  const ModelConfig c = cfg();
  const int B = 2, T = 8, world = 2;
  const int port = test::free_port();
  const auto errors = test::run_ranks(world, [&](int rank) {
    auto be = make_cpu_backend();
    auto store = std::make_shared<TcpStore>("127.0.0.1", port, rank, world, 30);
    // Synchronous Gloo (dist.overlap = false) is the reference; the same comm on its
    // own thread (dist.overlap = true) must train the same bit for bit.
    auto gloo_shard = make_gloo_comm(store, "shard", rank, world, 30, nullptr, -1, {}, /*overlap=*/false);
    auto gloo_rep = make_gloo_comm(store, "replicate", rank, world, 30, nullptr, -1, {}, /*overlap=*/false);
    auto thread_shard = make_gloo_comm(store, "shard_thread", rank, world, 30, nullptr, -1, {}, /*overlap=*/true);
    auto thread_rep = make_gloo_comm(store, "replicate_thread", rank, world, 30, nullptr, -1, {}, /*overlap=*/true);
    auto single = make_single_comm(*be);
    auto train = [&](Comm& shard, Comm* replicate, bool reshard, DType reduce, DeferredComm* watch) {
      ParamLayout layout(c);
      ShardPlan plan(layout, shard.world());
      Qwen2Model model(layout, *be, DType::F32, B, T);
      FsdpOptions o;
      o.reshard_after_forward = reshard;
      o.reduce_dtype = reduce;
      Fsdp f(plan, *be, shard, replicate, o);
      f.init_weights(21);
      std::vector<double> trace;
      for (int step = 0; step < 3; ++step) {
        f.zero_grads();
        for (int micro = 0; micro < 2; ++micro) {
          f.set_replica_sync(micro == 1 || step == 2);  // step 3: every micro-batch summed at once
          std::vector<int32_t> tok(B * T), tgt(B * T);
          for (int i = 0; i < B * T; ++i)
            tok[i] = (i * 31 + step * 7 + micro + rank * 13) % 256, tgt[i] = (i * 17 + 3 + step + micro * 5) % 256;
          trace.push_back(model.forward_backward(f, tok.data(), tgt.data(), 1.0f / (4 * B * T), -100).sum);
        }
        trace.push_back(f.grad_norm());
        AdamWParams p;
        p.lr = 1e-2f;
        p.weight_decay = 0.1f;
        p.step = step + 1;
        f.step(p);
        if (watch)
          ST_CHECK(watch->in_flight() == 0, "rank ", rank, ": collectives left in flight after step ", step + 1);
      }
      for (int u = 0; u < layout.num_units(); ++u)
        for (float x : f.gather_unit(u)) trace.push_back(x);
      return trace;
    };
    std::map<std::pair<bool, bool>, std::vector<double>> f32_runs;  // by (reshard, hsdp)
    for (DType reduce : {DType::F32, DType::BF16})
      for (bool reshard : {true, false})
        for (bool hsdp : {false, true}) {
          // FSDP: shard over both ranks. HSDP: shard groups of one, replicated over both.
          Comm& base_shard = hsdp ? *single : *gloo_shard;
          Comm* base_rep = hsdp ? gloo_rep.get() : nullptr;
          const std::vector<double> want = train(base_shard, base_rep, reshard, reduce, nullptr);
          const std::vector<double> threaded =
              train(hsdp ? *single : *thread_shard, hsdp ? thread_rep.get() : nullptr, reshard, reduce, nullptr);
          DeferredComm shard(base_shard), rep(*gloo_rep);
          const std::vector<double> got = train(shard, hsdp ? &rep : nullptr, reshard, reduce, &shard);
          const std::string what = std::string("rank ") + std::to_string(rank) + (hsdp ? " hsdp" : " fsdp") +
                                   (reshard ? " reshard" : " no-reshard") + " reduced in " +
                                   std::string(dtype_name(reduce)) + ": ";
          ST_CHECK(got.size() == want.size() && threaded.size() == want.size(), what, "trace sizes differ");
          size_t threaded_differ = 0;
          for (size_t i = 0; i < got.size(); ++i) threaded_differ += !(threaded[i] == want[i]);
          ST_CHECK(threaded_differ == 0, what, threaded_differ, " of ", got.size(),
                   " values differ between Gloo on its comm thread and Gloo in the call");
          size_t differ = 0;
          for (size_t i = 0; i < got.size(); ++i) differ += !(got[i] == want[i]);
          ST_CHECK(differ == 0, what, differ, " of ", got.size(), " values differ from the synchronous run");
          ST_CHECK(shard.inputs_changed + rep.inputs_changed == 0, what, "an input changed while in flight");
          ST_CHECK(shard.max_in_flight >= 2, what, "no gather was prefetched and no reduction retired late");
          ST_CHECK(!hsdp || rep.max_in_flight >= 1, what, "the replicate all-reduce never ran asynchronously");
          if (reduce == DType::F32) {
            f32_runs[{reshard, hsdp}] = want;
            continue;
          }
          // bf16 against f32: the first loss (before any reduction) the same, the later
        // losses and the gradient norms within bf16's rounding, the weights apart but
        // close (AdamW moves a weight by about lr a step, whatever its gradient's size,
        // so a tiny gradient rounded across zero can differ by 2 lr a step).
        const std::vector<double>& f32 = f32_runs.at({reshard, hsdp});
        ST_CHECK(got[0] == f32[0], what, "the first loss differs from f32's: ", got[0], " vs ", f32[0]);
        for (size_t i = 1; i < 9; ++i)  // per step: two micro-batch losses, then the grad norm
          ST_CHECK(std::abs(got[i] - f32[i]) <= 1e-2 * std::abs(f32[i]), what, "trace value ", i, ": ", got[i],
                   " vs f32's ", f32[i]);
        double diff = 0;
        for (size_t i = 9; i < got.size(); ++i) diff = std::max(diff, std::abs(got[i] - f32[i]));
        ST_CHECK(diff > 0, what, "the weights equal f32's: the gradients were not reduced in bf16");
        ST_CHECK(diff <= 3 * 2 * 1e-2, what, "weights differ from f32's by ", diff, ", more than 2 lr a step");
        }
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// dist.fp8_gather: the MLP's FP8 weights gathered as e4m3 codes, each rank casting its
// part with the scale agreed from every rank's amax, give the codes the model would
// cast from the gathered weights: the same training bit for bit (losses, gradient
// norms, final weights over three steps), with the FP8 MLP, all four kinds, down
// alone and delayed scaling. `shard` decides the world; the gathering path is taken
// even at one rank.
std::vector<double> fp8_trace(Backend& be, Comm& shard, DType dt, const Fp8Options& fp8, bool gather) {
  const ModelConfig c = cfg();
  const int B = 2, T = 8;
  ParamLayout layout(c);
  ShardPlan plan(layout, shard.world());
  Qwen2Model model(layout, be, dt, B, T, 0, Recompute::None, fp8);
  FsdpOptions o;
  o.compute_dtype = dt;
  o.in_place_when_alone = false;
  if (gather) o.fp8_gather = Qwen2Model::fp8_gather_spans(layout, fp8);
  Fsdp f(plan, be, shard, nullptr, o);
  ST_CHECK(f.fp8_gathers() == gather, "fp8_gathers() is ", f.fp8_gathers(), " with fp8_gather ", gather);
  f.init_weights(33);
  std::vector<double> trace;
  for (int step = 0; step < 3; ++step) {
    model.begin_step();
    f.zero_grads();
    std::vector<int32_t> tok(B * T), tgt(B * T);
    for (int i = 0; i < B * T; ++i)
      tok[i] = (i * 31 + step * 7 + shard.rank() * 13) % 256, tgt[i] = (i * 17 + 3 + step) % 256;
    trace.push_back(model.forward_backward(f, tok.data(), tgt.data(), 1.0f / (B * T), -100).sum);
    trace.push_back(f.grad_norm());
    AdamWParams p;
    p.lr = 2e-2f;
    p.step = step + 1;
    f.step(p);
  }
  for (int u = 0; u < layout.num_units(); ++u)
    for (float x : f.gather_unit(u)) trace.push_back(x);
  return trace;
}

std::vector<Fp8Options> fp8_gather_cases() {
  std::vector<Fp8Options> cases(4);
  for (auto& o : cases) o.on = true;
  cases[0].kinds = 0b1100;  // the MLP's (the default)
  cases[1].kinds = 0b1111;  // all four kinds
  cases[2].kinds = 0b1000;  // down alone: the tail is down only
  cases[3].kinds = 0b1100, cases[3].delayed = true;
  return cases;
}

void expect_fp8_gather_changes_no_bit(Backend& be, Comm& shard, DType dt, const std::string& who) {
  for (const Fp8Options& o : fp8_gather_cases()) {
    const std::vector<double> want = fp8_trace(be, shard, dt, o, false), got = fp8_trace(be, shard, dt, o, true);
    ST_CHECK(got.size() == want.size(), who, ": trace sizes differ");
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += !(got[i] == want[i]);
    ST_CHECK(differ == 0, who, " kinds ", o.kinds, o.delayed ? " delayed" : "", ": ", differ, " of ", got.size(),
             " values differ with the FP8 weights gathered as codes (first loss ", got[0], " vs ", want[0], ")");
  }
}

TEST(Fsdp, Fp8GatherChangesNoBitAtOneRankAndThree) {
  {
    auto be = make_cpu_backend();
    auto single = make_single_comm(*be);
    expect_fp8_gather_changes_no_bit(*be, *single, DType::F32, "one rank");
  }
  const int world = 3, port = test::free_port();  // parts of any size: 3 does not divide the units
  const auto errors = test::run_ranks(world, [&](int rank) {
    auto be = make_cpu_backend();
    auto store = std::make_shared<TcpStore>("127.0.0.1", port, rank, world, 30);
    auto shard = make_gloo_comm(store, "shard", rank, world, 30, nullptr, -1, {}, /*overlap=*/true);
    expect_fp8_gather_changes_no_bit(*be, *shard, DType::F32, "rank " + std::to_string(rank) + " of 3");
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// A tail of FP8 weights that starts off a 16-byte boundary (real models' blocks never
// do; here the down projection less its first element, one FP8 weight): the codes
// start after a gap that the rank whose slice reaches them carries in its part, and
// three ranks gather the bytes one rank does: the part before the codes and the codes.
std::pair<std::vector<float>, std::vector<uint8_t>> gathered_with_gap(Backend& be, Comm& comm) {
  const ParamLayout layout(cfg());
  const ShardPlan plan(layout, comm.world());
  const int u = layout.layer_unit(0);
  const size_t n = layout.unit(u).numel, from = layout.block().down_w + 1;
  ST_CHECK(from * 4 % 16 != 0 && from + 1 < n, "the tail must start off a 16-byte boundary");
  FsdpOptions o;
  o.in_place_when_alone = false;
  o.fp8_gather.assign(layout.num_units(), {});
  o.fp8_gather[u] = {Fp8Span{from, n - from}};
  Fsdp f(plan, be, comm, nullptr, o);
  ST_CHECK(f.fp8_gathers(), "no codes gathered");
  f.init_weights(33);
  const Tensor full = f.acquire(u, Pass::Forward);
  const Fp8Weights w = f.fp8_weights(u);
  ST_CHECK(w.from == from && w.codes.numel == n - from, "fp8_weights: from ", w.from, ", ", w.codes.numel, " codes");
  std::vector<float> head(from);
  std::vector<uint8_t> codes(n - from);
  be.download(head.data(), full.slice(0, from));
  be.download(codes.data(), w.codes);
  f.release(u, Pass::Forward);
  return {head, codes};
}

TEST(Fsdp, Fp8CodesAfterAGapGatherAsOneRankHasThem) {
  auto be = make_cpu_backend();
  auto single = make_single_comm(*be);
  const auto [head, codes] = gathered_with_gap(*be, *single);
  size_t nonzero = 0;
  for (uint8_t c : codes) nonzero += c != 0;
  ASSERT_GT(nonzero, codes.size() / 2);
  const int world = 3, port = test::free_port();
  const auto errors = test::run_ranks(world, [&](int rank) {
    auto rbe = make_cpu_backend();
    auto store = std::make_shared<TcpStore>("127.0.0.1", port, rank, world, 30);
    auto shard = make_gloo_comm(store, "shard", rank, world, 30, nullptr, -1, {}, /*overlap=*/true);
    const auto [h, c] = gathered_with_gap(*rbe, *shard);
    ST_CHECK(h == head, "rank ", rank, ": the part before the codes differs");
    size_t differ = 0;
    for (size_t i = 0; i < c.size(); ++i) differ += c[i] != codes[i];
    ST_CHECK(differ == 0, "rank ", rank, ": ", differ, " of ", c.size(), " codes differ");
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// The same on the GPU (bf16 weights, the CUDA casts and byte transpose, cuBLASLt's FP8
// GEMMs), at one rank through the gathering path.
TEST(CudaFsdp, Fp8GatherChangesNoBit) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto be = make_cuda_backend(0);
  if (const std::string why = be->fp8_unsupported_reason(); !why.empty()) GTEST_SKIP() << why;
  auto single = make_single_comm(*be);
  expect_fp8_gather_changes_no_bit(*be, *single, DType::BF16, "cuda");
}

}  // namespace
}  // namespace st

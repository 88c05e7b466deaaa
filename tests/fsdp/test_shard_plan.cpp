#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "comm/comm.h"
#include "fsdp/fsdp.h"
#include "fsdp/shard_plan.h"
#include "config/model_config.h"
#include "model/qwen2.h"

namespace st {
namespace {

ModelConfig small(bool tied) {
  ModelConfig c = model_preset("tiny");
  c.num_layers = 3;
  c.hidden_size = 32;
  c.intermediate_size = 40;
  c.vocab_size = 61;  // odd sizes, so most units need padding
  c.tie_word_embeddings = tied;
  return c;
}

TEST(ShardPlan, RangesTileThePaddedUnitAndPadLessThanAWorld) {
  for (bool tied : {true, false}) {
    const ParamLayout layout(small(tied));
    for (int world : {1, 2, 3, 4, 7}) {
      const ShardPlan plan(layout, world);
      for (int u = 0; u < plan.num_units(); ++u) {
        const size_t n = layout.unit(u).numel, padded = plan.padded_numel(u);
        EXPECT_EQ(plan.numel(u), n);
        EXPECT_EQ(padded % world, 0u);
        EXPECT_LT(padded - n, static_cast<size_t>(world));
        EXPECT_EQ(plan.shard_numel(u) * world, padded);
        size_t at = 0, valid = 0;
        for (int r = 0; r < world; ++r) {
          const ElemRange rr = plan.range_of(u, r), vr = plan.valid_range_of(u, r);
          EXPECT_EQ(rr.begin, at) << "unit " << u << " rank " << r;
          EXPECT_EQ(rr.size(), plan.shard_numel(u));
          EXPECT_EQ(vr.begin, std::min(rr.begin, n));
          EXPECT_EQ(vr.end, std::min(rr.end, n));
          at = rr.end;
          valid += vr.size();
        }
        EXPECT_EQ(at, padded);
        EXPECT_EQ(valid, n);
      }
      EXPECT_THROW(plan.range_of(0, world), Error);
    }
  }
}

TEST(ShardPlan, DecaySpansFollowTheParameters) {
  const ParamLayout layout(small(false));
  for (int world : {1, 2, 5}) {
    const ShardPlan plan(layout, world);
    for (int u = 0; u < plan.num_units(); ++u) {
      // The decay flag of every element of the padded unit (padding: none).
      std::vector<int> want(plan.padded_numel(u), -1);
      for (const ParamSpec& p : layout.unit(u).params)
        std::fill(want.begin() + p.offset, want.begin() + p.offset + p.numel, p.decay ? 1 : 0);
      for (int r = 0; r < world; ++r) {
        const ElemRange rr = plan.range_of(u, r);
        std::vector<int> got(rr.size(), -1);
        size_t last_end = 0;
        for (const DecaySpan& s : plan.decay_spans(u, r)) {
          EXPECT_GE(s.offset, last_end);
          last_end = s.offset + s.numel;
          std::fill(got.begin() + s.offset, got.begin() + s.offset + s.numel, s.decay ? 1 : 0);
        }
        EXPECT_EQ(got, std::vector<int>(want.begin() + rr.begin, want.begin() + rr.end)) << "unit " << u << " rank " << r;
      }
    }
  }
}

// Resharding by range arithmetic: shards saved at N ranks, reassembled at M ranks
// from pieces_from, equal the shards cut directly at M, element for element.
TEST(ShardPlan, PiecesReshardBetweenAnyWorldSizes) {
  const ParamLayout layout(small(true));
  for (int n : {1, 2, 3, 4})
    for (int m : {1, 2, 3, 4, 5}) {
      const ShardPlan from(layout, n), to(layout, m);
      for (int u = 0; u < layout.num_units(); ++u) {
        std::vector<float> whole(layout.unit(u).numel);
        std::iota(whole.begin(), whole.end(), 1.0f);
        auto shard = [&](const ShardPlan& plan, int r) {
          const ElemRange rr = plan.range_of(u, r), vr = plan.valid_range_of(u, r);
          std::vector<float> s(rr.size(), 0.0f);
          std::copy(whole.begin() + vr.begin, whole.begin() + vr.end, s.begin());
          return s;
        };
        for (int r = 0; r < m; ++r) {
          std::vector<float> got(to.shard_numel(u), 0.0f);
          size_t covered = 0;
          for (const ShardPiece& pc : to.pieces_from(from, u, r)) {
            const std::vector<float> src = shard(from, pc.src_rank);
            ASSERT_LE(pc.src_offset + pc.numel, src.size());
            std::copy(src.begin() + pc.src_offset, src.begin() + pc.src_offset + pc.numel, got.begin() + pc.dst_offset);
            covered += pc.numel;
          }
          EXPECT_EQ(covered, to.valid_range_of(u, r).size());
          EXPECT_EQ(got, shard(to, r)) << n << " -> " << m << " unit " << u << " rank " << r;
        }
      }
    }
}

// The memory table's gathered peak is what one step really holds: on the CPU
// backend (which counts its allocations) the step's peak is exactly the shards,
// the activations and the estimated gathered peak, tied or untied, with and
// without resharding, gradients reduced in f32 or bf16; and FSDP's own count of
// its gathered buffers never exceeds the estimate.
TEST(ShardPlan, GatheredPeakIsWhatAStepHolds) {
  for (DType reduce : {DType::F32, DType::BF16})
    for (bool tied : {true, false})
      for (bool reshard : {true, false}) {
        const ModelConfig c = small(tied);
        const ParamLayout layout(c);
        const ShardPlan plan(layout, 1);
        auto be = make_cpu_backend();
        auto comm = make_single_comm(*be);
        const int B = 2, T = 8;
        Qwen2Model model(layout, *be, DType::F32, B, T);
        FsdpOptions o;
        o.reshard_after_forward = reshard;
        o.in_place_when_alone = false;  // the gathering path, as at more ranks
        o.reduce_dtype = reduce;
        Fsdp f(plan, *be, *comm, nullptr, o);
        f.init_weights(3);
        const size_t before = be->peak_allocated_bytes();
        std::vector<int32_t> tok(B * T), tgt(B * T);
        for (int i = 0; i < B * T; ++i) tok[i] = (i * 7) % c.vocab_size, tgt[i] = (i * 5 + 1) % c.vocab_size;
        f.zero_grads();
        be->reset_peak_allocated();
        model.forward_backward(f, tok.data(), tgt.data(), 1.0f / (B * T), -100);
        f.sync_grads();
        const GatheredMemory est = plan.gathered_peak(4, reshard, dtype_size(reduce));
        const std::string what = std::string(tied ? "tied" : "untied") + (reshard ? " reshard" : " no-reshard") +
                                 ", reduced in " + std::string(dtype_name(reduce));
        EXPECT_GT(before, 0u) << what;
        EXPECT_EQ(be->peak_allocated_bytes(), before + est.total()) << what << ", peak at " << est.where;
        EXPECT_LE(f.memory().gathered_peak_bytes, est.total()) << what;
        EXPECT_GT(f.memory().gathered_peak_bytes, est.total() / 2) << what;
      }
}

}  // namespace
}  // namespace st

// Seeded initialisation (model/init.h): the same bits however a range is split across
// threads, and the backend's own fill equal to the host's.
#include "model/init.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "backend/backend.h"
#include "model/layout.h"

namespace st {
namespace {

TEST(Init, ThreadedLargeRangesGiveTheSameBits) {
  Unit u{"big"};
  ParamSpec w{"model.embed_tokens.weight", {3000, 3000}, 0, 9000000, true};
  ParamSpec n{"model.norm.weight", {3000}, 9000000, 3000, false};
  u.params = {w, n};
  u.numel = 9003000;
  std::vector<float> whole(u.numel), pieces(u.numel);
  init_unit_values(u, 42, 0.02, 0, u.numel, whole.data());  // large: split across threads
  for (size_t lo = 0; lo < u.numel; lo += 1000000)           // small: one thread each
    init_unit_values(u, 42, 0.02, lo, std::min(u.numel, lo + 1000000), pieces.data() + lo);
  EXPECT_EQ(whole, pieces);
  EXPECT_EQ(whole.back(), 1.0f);
}

// The backend's own initialisation (what Fsdp uses: nothing through the host) gives
// the host's values bit for bit, padding zeroed, over an offset range.
TEST(Init, BackendInitialisationMatchesTheHost) {
  Unit u{"big"};
  u.params = {ParamSpec{"model.layers.0.mlp.down_proj.weight", {3000, 3000}, 0, 9000000, true},
              ParamSpec{"model.layers.0.post_attention_layernorm.weight", {3000}, 9000000, 3000, false},
              ParamSpec{"model.layers.0.self_attn.q_proj.bias", {3000}, 9003000, 3000, false}};
  u.numel = 9006000;
  const size_t begin = 123457, end = u.numel + 5;  // into the padding
  std::vector<float> want(end - begin);
  init_unit_values(u, 7, 0.02, begin, end, want.data());
  auto be = make_cpu_backend();
  Tensor t = be->alloc(DType::F32, end - begin);
  be->fill(t, 3.0);  // stale values everywhere: all must be overwritten
  init_unit_tensor(*be, u, 7, 0.02, begin, end, t);
  std::vector<float> got(end - begin);
  be->download(got.data(), t);
  be->free(t);
  EXPECT_EQ(got, want);
  EXPECT_EQ(got.back(), 0.0f);
}

}  // namespace
}  // namespace st

// The FP8 scaling state as a checkpoint manifest records it: every f32 value comes back
// with its bits (NaN, infinities, subnormals, -0 included) through the JSON text, and a
// damaged record is a data error naming where and which field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "support/errors.h"
#include "train/fp8_scaling_record.h"

namespace st {
namespace {

using testing::error_of;

Fp8ScalingState sample() {
  Fp8ScalingState s;
  s.layers = 2;
  s.kinds = 0xF;
  s.bf16_end_blocks = 0;
  s.history_len = 3;
  s.rolls = 7;
  s.begun = true;
  s.dlogits_casts = 123456789012345ull;
  const float odd[] = {0.0f, -0.0f, 1.0f, 448.0f, 57344.0f, std::numeric_limits<float>::denorm_min(),
                       std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::max(), 3.1415927f};
  for (size_t i = 0; i < 2 * 2 * 4; ++i) s.amax.push_back(odd[i % std::size(odd)] * (i % 3 ? 1.0f : -1.0f));
  for (size_t i = 0; i < 2 * 2 * 4 * 3; ++i) s.history.push_back(std::ldexp(1.0f + float(i) / 64, int(i) - 20));
  return s;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Fp8ScalingRecord, EveryValueComesBackWithItsBits) {
  const Fp8ScalingState s = sample();
  const nlohmann::json j = nlohmann::json::parse(fp8_scaling_json(s).dump());
  EXPECT_EQ(j.at("amax").get<std::string>().size(), s.amax.size() * 8);
  const Fp8ScalingState t = fp8_scaling_from_json(j, "m.json: fp8_scaling");
  EXPECT_EQ(t.layers, s.layers);
  EXPECT_EQ(t.kinds, s.kinds);
  EXPECT_EQ(t.history_len, s.history_len);
  EXPECT_EQ(t.rolls, s.rolls);
  EXPECT_EQ(t.begun, s.begun);
  EXPECT_EQ(t.dlogits_casts, s.dlogits_casts);
  EXPECT_TRUE(same_bits(t.amax, s.amax));
  EXPECT_TRUE(same_bits(t.history, s.history));
  // Current scaling keeps no amax: empty arrays, nothing else needed.
  Fp8ScalingState cur;
  cur.layers = 4;
  cur.dlogits_casts = 9;
  const Fp8ScalingState u = fp8_scaling_from_json(fp8_scaling_json(cur), "x");
  EXPECT_TRUE(u.amax.empty() && u.history.empty());
  EXPECT_EQ(u.dlogits_casts, 9u);
}

TEST(Fp8ScalingRecord, ADamagedRecordIsADataErrorNamingTheField) {
  const nlohmann::json good = fp8_scaling_json(sample());
  auto refused = [&](const std::function<void(nlohmann::json&)>& damage, const std::string& want) {
    nlohmann::json j = good;
    damage(j);
    std::string e;
    bool data = false;
    try {
      fp8_scaling_from_json(j, "ckpt/step-4/manifest.json: fp8_scaling");
    } catch (const Error& err) {
      e = err.what();
      data = err.kind() == ErrorKind::Data;
    }
    EXPECT_TRUE(data) << want << ": " << e;
    EXPECT_NE(e.find("ckpt/step-4/manifest.json: fp8_scaling"), std::string::npos) << e;
    EXPECT_NE(e.find(want), std::string::npos) << e;
  };
  refused([](nlohmann::json& j) { j["amax"] = j["amax"].get<std::string>().substr(8); }, "'amax' holds");
  refused([](nlohmann::json& j) {
    std::string h = j["history"];
    h[5] = 'g';
    j["history"] = h;
  }, "not a hex digit");
  refused([](nlohmann::json& j) { j["amax"] = 3; }, "'amax' must be a string");
  refused([](nlohmann::json& j) { j.erase("rolls"); }, "rolls");
  refused([](nlohmann::json& j) { j["layers"] = -1; }, "layers");
  refused([](nlohmann::json& j) { j["history_len"] = 1 << 20; }, "out of range");
  refused([](nlohmann::json& j) { j["begun"] = "yes"; }, "'begun'");
  refused([](nlohmann::json& j) { j = nlohmann::json::array(); }, "expected an object");
}

}  // namespace
}  // namespace st

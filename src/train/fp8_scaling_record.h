// The FP8 scaling state (model/fp8_scaling_state.h) as a checkpoint manifest records it,
// under "fp8_scaling":
//   {"layers": 28, "kinds": 12, "bf16_end_blocks": 0, "history_len": 16, "rolls": 41,
//    "begun": true, "dlogits_casts": 0, "amax": "<hex>", "history": "<hex>"}
// amax and history are f32 arrays written as 8 hex digits per value (the IEEE bits,
// most significant first), so every value, NaN and infinity included, comes back
// exactly.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "model/fp8_scaling_state.h"

namespace st {

nlohmann::json fp8_scaling_json(const Fp8ScalingState& s);
// A data error (exit 3) naming `where` and the key when a field is missing, of the
// wrong type or out of range, or an array's text is not hex of the length the
// dimensions give.
Fp8ScalingState fp8_scaling_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace st

// Seeded initialisation as a pure function of (seed, tensor name, element index):
// the same values whatever the world size, shard boundaries or visiting order.
// Weights ~ N(0, std) (Hugging Face's initializer_range, 0.02), RMSNorm weights 1,
// biases 0; padding 0.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/backend.h"
#include "model/layout.h"

namespace st {

// Writes unit elements [begin, end) into out; elements at or past unit.numel (a
// shard's padding) are 0.
void init_unit_values(const Unit& unit, uint64_t seed, double std, size_t begin, size_t end, float* out);

// The same values computed by the backend straight into `out` (an F32 tensor of
// end - begin elements where it lives: nothing goes through the host).
void init_unit_tensor(Backend& backend, const Unit& unit, uint64_t seed, double std, size_t begin, size_t end,
                      Tensor out);

}  // namespace st

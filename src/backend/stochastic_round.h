// Stochastic rounding of f32 to bf16, the same bits on the host and in CUDA kernels:
// the 16 bits bf16 drops are compared with 16 random bits (added, then truncated), so
// a value rounds up with probability equal to its distance from the bf16 below, and
// the rounding is unbiased on average. With bf16 optimizer state or master weights an
// update far smaller than one bf16 step still moves the value in expectation, where
// round-to-nearest would lose it every time. NaN stays NaN, infinities stay.
#pragma once
#include <cstdint>

#include "core/rng.h"

namespace st {

ST_HOST_DEVICE inline uint16_t bf16_bits_stochastic(float f, uint32_t random16) {
#ifdef __CUDA_ARCH__
  const uint32_t u = __float_as_uint(f);
#else
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
#endif
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN, quiet
  if ((u & 0x7fffffffu) == 0x7f800000u) return static_cast<uint16_t>(u >> 16);         // +-inf
  // A carry out of the mantissa moves to the next binade, which is the right value; the
  // largest finite values may round up to infinity, as they would round to nearest.
  return static_cast<uint16_t>((u + (random16 & 0xffffu)) >> 16);
}

// AdamW's three stores per element share one 64-bit draw: bits 0-15 the parameter,
// 16-31 m, 32-47 v.
ST_HOST_DEVICE inline uint64_t adamw_round_bits(uint64_t key, uint64_t index) { return counter_bits(key, index); }

}  // namespace st

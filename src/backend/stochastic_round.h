// Stochastic rounding of f32 to bf16, the same bits on the host and in CUDA kernels:
// the 16 bits bf16 drops are compared with 16 random bits (added, then truncated), so
// a value rounds up with probability equal to its distance from the bf16 below, and
// the rounding is unbiased on average. With bf16 optimizer state or master weights an
// update far smaller than one bf16 step still moves the value in expectation, where
// round-to-nearest would lose it every time. NaN stays NaN, infinities stay.
#pragma once
#include <cmath>
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

// Stochastic rounding of a scaled value to e5m2's grid (its two mantissa bits; a fixed
// step of 2^-16 below its smallest normal, 2^-14), as a float the e5m2 conversion then
// takes exactly: up with probability (to 1/256) the value's distance from the grid
// point below over the step, from 8 random bits (u = (r8 + 1/2) / 256). |v| must not
// exceed e5m2's largest finite (57344), so the rounding never leaves the format.
// Round-to-nearest loses about 0.4% of the mass of a softmax's many small
// probabilities (the larger values in each binade round down more often than not);
// this keeps it on average. NaN and infinities pass through.
ST_HOST_DEVICE inline float e5m2_round_stochastic(float v, uint32_t r8) {
#ifdef __CUDA_ARCH__
  uint32_t u = __float_as_uint(v);
#else
  uint32_t u;
  __builtin_memcpy(&u, &v, 4);
#endif
  const uint32_t a = u & 0x7fffffffu, sign = u & 0x80000000u;
  if (a >= 0x7f800000u || a == 0) return v;
  const int e = static_cast<int>(a >> 23);  // biased f32 exponent; 112 is 2^-15
  float out;
  if (e <= 112) {  // below 2^-14: multiples of 2^-16 (the scaling by 2^16 and the sum exact)
    const float mag = (sign ? -v : v) * 65536.0f;
    const float t = floorf(mag + (static_cast<float>(r8 & 0xffu) + 0.5f) * (1.0f / 256));
    out = t * (1.0f / 65536);
    return sign ? -out : out;
  }
  // Normal in e5m2: keep the top 2 of the 23 mantissa bits; the 8 random bits (and half
  // of one more) go just below the kept ones, the carry, if any, is the next grid point.
  constexpr int kDrop = 21;
  const uint32_t r = ((r8 & 0xffu) << (kDrop - 8)) | (1u << (kDrop - 9));
  const uint32_t m = (a + r) & ~((1u << kDrop) - 1u);
  const uint32_t bits = sign | m;
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  __builtin_memcpy(&out, &bits, 4);
  return out;
#endif
}

// The 8 random bits of element g of a stream with this key: one 64-bit draw per 8
// consecutive elements (g / 8), byte g % 8 of it.
ST_HOST_DEVICE inline uint32_t random8(uint64_t key, uint64_t g) {
  return static_cast<uint32_t>(counter_bits(key, g >> 3) >> (8 * (g & 7))) & 0xffu;
}

// AdamW's three stores per element share one 64-bit draw: bits 0-15 the parameter,
// 16-31 m, 32-47 v.
ST_HOST_DEVICE inline uint64_t adamw_round_bits(uint64_t key, uint64_t index) { return counter_bits(key, index); }

}  // namespace st

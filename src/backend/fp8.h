// FP8 for the linear layers (train.matmul_dtype = "fp8"): the two OCP 8-bit float
// formats, the per-tensor scale, and the host encoding the CPU backend emulates them
// with, bit for bit what the GPU's conversion (cuda_fp8.h, __NV_SATFINITE) produces.
//
//   e4m3 (F8E4M3): 4 exponent bits (bias 7), 3 mantissa bits, no infinities; largest
//     finite 448, smallest normal 2^-6, smallest subnormal 2^-9. Weights and
//     activations: more precision where their range is known.
//   e5m2 (F8E5M2): 5 exponent bits (bias 15), 2 mantissa bits; largest finite 57344,
//     smallest normal 2^-14, smallest subnormal 2^-16. Gradients: their range is
//     wider and less predictable than their precision matters (the choice of
//     Transformer Engine's "hybrid" recipe and of torchao's float8 training).
//
// Quantizing a tensor x: s = fp8_scale(amax(|x|), max finite); q = fp8(x * s), round
// to nearest even, saturating to ± the largest finite value (NaN stays NaN). The
// scale is a power of two, so x * s is exact and 1/s (what the GEMM multiplies its
// result by) is exact too: the emulation and the GPU agree on every bit of q.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define ST_FP8_HD __host__ __device__
#else
#define ST_FP8_HD
#endif

namespace st {

enum class Fp8Format : uint8_t { E4M3, E5M2 };

struct Fp8Spec {
  int mantissa_bits;
  int bias;
  int min_exponent;  // of the smallest normal
  float max_finite;
};

ST_FP8_HD constexpr Fp8Spec fp8_spec(Fp8Format f) {
  return f == Fp8Format::E4M3 ? Fp8Spec{3, 7, -6, 448.0f} : Fp8Spec{2, 15, -14, 57344.0f};
}

// The power of two s with amax * s <= max_finite as closely as a power of two
// allows; 1 where amax is 0, negative or not finite (nothing to scale, or a NaN/inf
// that the saturating cast handles).
ST_FP8_HD inline float fp8_scale(float amax, float max_finite) {
  if (!(amax > 0.0f) || !(amax <= 3.0e38f)) return 1.0f;
  float s = max_finite / amax;
  uint32_t u;
  memcpy(&u, &s, 4);
  u = u >= 0x7f800000u ? 0x7f000000u : (u & 0xff800000u);  // 2^127 at most; the exponent alone
  memcpy(&s, &u, 4);
  return s;
}

// The larger of two amax values (non-negative, or NaN) as atomicMax on their bits
// takes it on the GPU: non-negative floats order as their bits, and a NaN (sign
// cleared) is above +inf, so a NaN sticks and its scale is then 1.
ST_FP8_HD inline float fp8_amax_max(float a, float b) {
  uint32_t ua, ub;
  memcpy(&ua, &a, 4);
  memcpy(&ub, &b, 4);
  return ua >= ub ? a : b;
}

// Host encoding of a float as fp8 bits, rounding to nearest even and saturating.
inline uint8_t fp8_encode(float v, Fp8Format f) {
  const Fp8Spec sp = fp8_spec(f);
  if (std::isnan(v)) return 0x7f;  // a NaN in both formats
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  float a = std::fabs(v);
  if (a == 0.0f) return sign;
  int e = 0;
  std::frexp(a, &e);                      // a = m * 2^e, m in [0.5, 1)
  int exp = std::max(e - 1, sp.min_exponent);
  const float ulp = std::ldexp(1.0f, exp - sp.mantissa_bits);
  float r = std::nearbyint(a / ulp) * ulp;  // ties to even in the default rounding mode
  if (!(r <= sp.max_finite)) r = sp.max_finite;  // inf too
  if (r == 0.0f) return sign;
  std::frexp(r, &e);
  exp = e - 1;
  if (exp < sp.min_exponent)  // subnormal: exponent field 0
    return sign | static_cast<uint8_t>(std::ldexp(r, sp.mantissa_bits - sp.min_exponent));
  const int mant = static_cast<int>(std::ldexp(r, sp.mantissa_bits - exp)) - (1 << sp.mantissa_bits);
  return sign | static_cast<uint8_t>(((exp + sp.bias) << sp.mantissa_bits) | mant);
}

inline float fp8_decode(uint8_t b, Fp8Format f) {
  const Fp8Spec sp = fp8_spec(f);
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  const int exp_bits = 7 - sp.mantissa_bits;
  const int ef = (b >> sp.mantissa_bits) & ((1 << exp_bits) - 1), mant = b & ((1 << sp.mantissa_bits) - 1);
  if (f == Fp8Format::E4M3 && ef == 15 && mant == 7) return NAN;
  if (f == Fp8Format::E5M2 && ef == 31) return mant ? NAN : sign * INFINITY;
  if (ef == 0) return sign * std::ldexp(float(mant), sp.min_exponent - sp.mantissa_bits);
  return sign * std::ldexp(float((1 << sp.mantissa_bits) + mant), ef - sp.bias - sp.mantissa_bits);
}

}  // namespace st

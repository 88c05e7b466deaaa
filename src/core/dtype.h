// Element types of tensors. The CPU reference computes in F32 (and F64 for gradient
// checks); the CUDA backend computes in BF16 with F32 masters.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace st {

// F8E4M3 / F8E5M2: the OCP 8-bit floats (e4m3 with no infinities, max 448; e5m2
// IEEE-like, max 57344) that FP8 matmuls read (backend/fp8.h).
enum class DType : uint8_t { F32, F64, BF16, F16, I32, I64, F8E4M3, F8E5M2 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::F8E4M3: return 1;
    case DType::F8E5M2: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::F8E4M3: return "f8e4m3";
    case DType::F8E5M2: return "f8e5m2";
  }
  return "?";
}

// bf16 <-> f32 on the host (round to nearest even; NaN kept quiet).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

}  // namespace st

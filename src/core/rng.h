// Counter-based random numbers: every value is a pure function of (seed, stream,
// index), so initialisation and data do not depend on how parameters are laid out,
// sharded or visited, and a run resumes at any step without replaying the stream.
#pragma once
#include <cmath>
#include <cstdint>
#include <string_view>

// Callable from CUDA kernels too, so a GPU computes the same values as the CPU.
#ifdef __CUDACC__
#define ST_HOST_DEVICE __host__ __device__
#else
#define ST_HOST_DEVICE
#endif

namespace st {

// SplitMix64 finaliser: a good 64-bit mixer.
ST_HOST_DEVICE constexpr uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

ST_HOST_DEVICE constexpr uint64_t hash_combine(uint64_t a, uint64_t b) { return mix64(a ^ mix64(b)); }

// The counter-based draw itself, shared by CounterRng and the GPU's initialisation.
ST_HOST_DEVICE constexpr uint64_t counter_bits(uint64_t key, uint64_t i) { return mix64(key ^ mix64(i)); }
// A standard normal from the bits of counters 2i and 2i+1 (Box-Muller); math is the
// platform's double log, sqrt and cos (correctly rounded sqrt; log and cos within an
// ulp, so a GPU's float value can differ from the CPU's in its last bit, rarely).
ST_HOST_DEVICE inline double counter_normal(uint64_t key, uint64_t i) {
  const double u1 = (static_cast<double>(counter_bits(key, 2 * i) >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(counter_bits(key, 2 * i + 1) >> 11) * 0x1.0p-53;
#ifdef __CUDA_ARCH__
  return ::sqrt(-2.0 * ::log(u1)) * ::cos(6.283185307179586 * u2);
#else
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
#endif
}

// FNV-1a of a name: a stable stream id for a named parameter.
constexpr uint64_t hash_name(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h;
}

struct CounterRng {
  uint64_t key;
  explicit constexpr CounterRng(uint64_t seed, uint64_t stream = 0) : key(hash_combine(seed, stream)) {}
  constexpr uint64_t bits(uint64_t i) const { return counter_bits(key, i); }
  // Uniform in [0, 1) with 53 bits.
  double uniform(uint64_t i) const { return static_cast<double>(bits(i) >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n) (Lemire's multiply; bias below 2^-32 for n < 2^32).
  uint64_t below(uint64_t i, uint64_t n) const {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(bits(i)) * n) >> 64);
  }
  // Standard normal by Box-Muller on two independent counters.
  double normal(uint64_t i) const { return counter_normal(key, i); }
};

}  // namespace st

// libFuzzer target for the .npy reader (st::read_npy, st::npy_as_int64) and the
// token-id files that `shardtrain score --tokens` reads (st::read_token_sequences:
// a .npy, or text with one sequence per line). The input is written to a scratch
// file under both names. An st::Error is the expected rejection; a crash, a
// sanitizer report, any other exception or an accepted file that breaks what
// acceptance promises is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "data/token_file.h"
#include "fuzz_util.h"
#include "io/npy.h"

namespace {

constexpr int kVocab = 300;
constexpr int kMaxLen = 512;

size_t element_size(const std::string& descr) {
  static const char* const kinds[] = {"i1", "u1", "i2", "u2", "i4", "u4", "f4", "i8", "u8", "f8"};
  static const size_t sizes[] = {1, 1, 2, 2, 4, 4, 4, 8, 8, 8};
  for (size_t i = 0; i < std::size(kinds); ++i)
    if (descr.substr(1) == kinds[i]) return sizes[i];
  return 0;
}

// Accepted: every dimension non-negative, the element count and byte count computed
// without overflow, and exactly that many bytes of data.
void check_array(const st::NpyArray& a) {
  uint64_t n = 1;
  for (int64_t d : a.shape) {
    if (d < 0) __builtin_trap();
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) __builtin_trap();
  }
  if (n != a.numel()) __builtin_trap();
  if (const size_t es = element_size(a.descr)) {
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(n, es, &bytes) || bytes != a.bytes.size()) __builtin_trap();
  }
}

void check_sequences(const std::vector<std::vector<int32_t>>& seqs) {
  if (seqs.empty()) __builtin_trap();
  for (const auto& s : seqs) {
    if (s.size() < 2 || s.size() > static_cast<size_t>(kMaxLen)) __builtin_trap();
    for (int32_t id : s)
      if (id < 0 || id >= kVocab) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const std::string npy = fuzz::scratch_dir() + "/tokens.npy", txt = fuzz::scratch_dir() + "/tokens.txt";
  fuzz::write_file(npy, bytes);
  try {
    const st::NpyArray a = st::read_npy(npy);
    check_array(a);
    try {
      const std::vector<int64_t> v = st::npy_as_int64(a, npy);
      if (v.size() != a.numel()) __builtin_trap();
    } catch (const st::Error& e) {
      fuzz::rejected(e);
    }
  } catch (const st::Error& e) {
    fuzz::rejected(e);
  }
  try {
    check_sequences(st::read_token_sequences(npy, kVocab, kMaxLen));
  } catch (const st::Error& e) {
    fuzz::rejected(e);
  }
  fuzz::write_file(txt, bytes);
  try {
    check_sequences(st::read_token_sequences(txt, kVocab, kMaxLen));
  } catch (const st::Error& e) {
    fuzz::rejected(e);
  }
  return 0;
}

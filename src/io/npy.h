// NumPy .npy files (format versions 1.0-3.0, little-endian, C order): enough to read
// token ids (int32/int64) and to write fp32 logits for comparison with other tools.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace st {

struct NpyArray {
  std::string descr;              // "<i4", "<i8", "<f4", ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;     // raw little-endian data, C order
  uint64_t numel() const;
};

// Errors name the file: bad magic, unsupported version, malformed header dict,
// Fortran order, big-endian data, data shorter (or longer) than the shape says.
NpyArray read_npy(const std::string& path);
// Integers of an i4/i8 (or u1/u2/i2/u4) array as int64.
std::vector<int64_t> npy_as_int64(const NpyArray& a, const std::string& path);

// Writes fp32 data of the given shape; through "<path>.tmp" + rename.
void write_npy_f32(const std::string& path, const std::vector<int64_t>& shape, const float* data);

}  // namespace st

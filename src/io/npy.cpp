#include "io/npy.h"

#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include "core/error.h"

namespace st {

uint64_t NpyArray::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);  // read_npy checked that this fits
  return n;
}

namespace {

// Bytes per element of a descr such as "<i4" or "|u1"; 0 when it is not a plain
// number type of 1, 2, 4 or 8 bytes.
size_t descr_size(const std::string& d) {
  if (d.size() < 3 || std::string("iufb").find(d[1]) == std::string::npos) return 0;
  unsigned size = 0;
  const auto r = std::from_chars(d.data() + 2, d.data() + d.size(), size);
  if (r.ec != std::errc() || r.ptr != d.data() + d.size()) return 0;
  return size == 1 || size == 2 || size == 4 || size == 8 ? size : 0;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\n"), e = s.find_last_not_of(" \t\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// The shape tuple's text ("2, 3" or "7," or ""): each dimension a non-negative integer.
std::vector<int64_t> parse_shape(const std::string& dims, const std::string& path) {
  std::vector<int64_t> shape;
  std::vector<std::string> parts;
  size_t at = 0;
  while (true) {
    const size_t comma = dims.find(',', at);
    parts.push_back(trim(dims.substr(at, comma == std::string::npos ? std::string::npos : comma - at)));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (parts.size() > 1 && parts.back().empty()) parts.pop_back();  // "(7,)"
  if (parts.size() == 1 && parts[0].empty()) return shape;           // "()": a scalar
  for (const std::string& p : parts) {
    int64_t d = 0;
    const auto r = std::from_chars(p.data(), p.data() + p.size(), d);
    if (r.ec == std::errc::result_out_of_range)
      fail_data(path, ": shape (", dims, ") has dimension ", p, ", too large for 64 bits");
    if (p.empty() || r.ec != std::errc() || r.ptr != p.data() + p.size())
      fail_data(path, ": shape (", dims, ") has '", p, "', not an integer dimension");
    if (d < 0) fail_data(path, ": shape (", dims, ") has the negative dimension ", d);
    shape.push_back(d);
  }
  return shape;
}

}  // namespace

NpyArray read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ST_CHECK_DATA(in, path, ": cannot open");
  std::vector<uint8_t> buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ST_CHECK_DATA(buf.size() >= 10 && std::memcmp(buf.data(), "\x93NUMPY", 6) == 0, path, ": not a .npy file (bad magic)");
  const int major = buf[6];
  size_t header_len, pos;
  if (major == 1) {
    header_len = buf[8] | (buf[9] << 8);
    pos = 10;
  } else if (major == 2 || major == 3) {
    ST_CHECK_DATA(buf.size() >= 12, path, ": truncated header");
    header_len = buf[8] | (buf[9] << 8) | (buf[10] << 16) | (static_cast<size_t>(buf[11]) << 24);
    pos = 12;
  } else {
    fail_data(path, ": unsupported .npy format version ", major);
  }
  ST_CHECK_DATA(pos + header_len <= buf.size(), path, ": header length ", header_len, " runs past the end of the file");
  const std::string header(buf.begin() + pos, buf.begin() + pos + header_len);

  // The header is a Python dict literal: {'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }
  std::smatch m;
  NpyArray a;
  ST_CHECK_DATA(std::regex_search(header, m, std::regex(R"('descr'\s*:\s*'([^']*)')")), path,
                ": header has no 'descr': ", header.substr(0, header.find_last_not_of(" \n") + 1).substr(0, 200));
  a.descr = m[1];
  ST_CHECK_DATA(std::regex_search(header, m, std::regex(R"('fortran_order'\s*:\s*(True|False))")), path,
                ": header has no 'fortran_order'");
  ST_CHECK_DATA(m[1] == "False", path, ": Fortran-order arrays are not supported");
  ST_CHECK_DATA(std::regex_search(header, m, std::regex(R"('shape'\s*:\s*\(([^)]*)\))")), path,
                ": header has no 'shape'");
  a.shape = parse_shape(m[1], path);
  ST_CHECK_DATA(a.descr.size() >= 3 && (a.descr[0] == '<' || a.descr[0] == '|'), path, ": dtype '", a.descr,
                "' is not little-endian");
  const size_t esize = descr_size(a.descr);
  ST_CHECK_DATA(esize > 0, path, ": unsupported dtype '", a.descr, "'");
  // Elements and bytes in checked 64-bit arithmetic: a shape whose product wraps
  // around must not pass as a small array.
  uint64_t data_bytes = esize;
  for (int64_t d : a.shape)
    if (__builtin_mul_overflow(data_bytes, static_cast<uint64_t>(d), &data_bytes))
      fail_data(path, ": shape (", m[1].str(), ") of '", a.descr, "' needs more than 2^64 bytes of data");
  const uint64_t have = buf.size() - pos - header_len;
  ST_CHECK_DATA(have == data_bytes, path, ": shape (", m[1].str(), ") of '", a.descr, "' needs ", data_bytes,
                " bytes of data but the file has ", have);
  a.bytes.assign(buf.begin() + pos + header_len, buf.end());
  return a;
}

std::vector<int64_t> npy_as_int64(const NpyArray& a, const std::string& path) {
  const std::string kind = a.descr.substr(1);
  std::vector<int64_t> out(a.numel());
  auto convert = [&](auto sample) {
    using T = decltype(sample);
    for (size_t i = 0; i < out.size(); ++i) {
      T v;
      std::memcpy(&v, a.bytes.data() + i * sizeof(T), sizeof(T));
      out[i] = static_cast<int64_t>(v);
    }
  };
  if (kind == "i4") convert(int32_t{});
  else if (kind == "i8") convert(int64_t{});
  else if (kind == "i2") convert(int16_t{});
  else if (kind == "u1") convert(uint8_t{});
  else if (kind == "u2") convert(uint16_t{});
  else if (kind == "u4") convert(uint32_t{});
  else fail_data(path, ": token ids must be an integer array (int32 or int64), got dtype '", a.descr, "'");
  return out;
}

void write_npy_f32(const std::string& path, const std::vector<int64_t>& shape, const float* data) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  uint64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? ", " : "");
    n *= static_cast<uint64_t>(shape[i]);
  }
  dict += "), }";
  // Pad with spaces so that magic + length + header is a multiple of 64, ending in \n.
  const size_t total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  const std::string tmp = path + ".tmp";
  std::error_code ec;
  try {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    ST_CHECK(out, path, ": cannot open '", tmp, "' for writing");
    const uint16_t len = static_cast<uint16_t>(dict.size());
    out.write("\x93NUMPY\x01\x00", 8);
    out.put(static_cast<char>(len & 0xff)).put(static_cast<char>(len >> 8));
    out.write(dict.data(), static_cast<std::streamsize>(dict.size()));
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(float)));
    ST_CHECK(out.flush(), path, ": write failed");
    out.close();
    std::filesystem::rename(tmp, path, ec);
    ST_CHECK(!ec, path, ": cannot rename '", tmp, "' to it: ", ec.message());
  } catch (...) {
    std::filesystem::remove(tmp, ec);  // nothing half-written stays behind
    throw;
  }
}

}  // namespace st

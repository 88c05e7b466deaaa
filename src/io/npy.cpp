#include "io/npy.h"

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
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

namespace {

size_t descr_size(const std::string& d) {
  if (d.size() < 3) return 0;
  return static_cast<size_t>(std::atoi(d.c_str() + 2));
}

}  // namespace

NpyArray read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ST_CHECK(in, path, ": cannot open");
  std::vector<uint8_t> buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ST_CHECK(buf.size() >= 10 && std::memcmp(buf.data(), "\x93NUMPY", 6) == 0, path, ": not a .npy file (bad magic)");
  const int major = buf[6];
  size_t header_len, pos;
  if (major == 1) {
    header_len = buf[8] | (buf[9] << 8);
    pos = 10;
  } else if (major == 2 || major == 3) {
    ST_CHECK(buf.size() >= 12, path, ": truncated header");
    header_len = buf[8] | (buf[9] << 8) | (buf[10] << 16) | (static_cast<size_t>(buf[11]) << 24);
    pos = 12;
  } else {
    fail(path, ": unsupported .npy format version ", major);
  }
  ST_CHECK(pos + header_len <= buf.size(), path, ": header length ", header_len, " runs past the end of the file");
  const std::string header(buf.begin() + pos, buf.begin() + pos + header_len);

  // The header is a Python dict literal: {'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }
  std::smatch m;
  NpyArray a;
  ST_CHECK(std::regex_search(header, m, std::regex(R"('descr'\s*:\s*'([^']*)')")), path,
           ": header has no 'descr': ", header);
  a.descr = m[1];
  ST_CHECK(std::regex_search(header, m, std::regex(R"('fortran_order'\s*:\s*(True|False))")), path,
           ": header has no 'fortran_order'");
  ST_CHECK(m[1] == "False", path, ": Fortran-order arrays are not supported");
  ST_CHECK(std::regex_search(header, m, std::regex(R"('shape'\s*:\s*\(([^)]*)\))")), path,
           ": header has no 'shape'");
  const std::string dims = m[1];
  const std::regex number(R"(\d+)");
  for (std::sregex_iterator it(dims.begin(), dims.end(), number), end; it != end; ++it)
    a.shape.push_back(std::stoll(it->str()));
  ST_CHECK(a.descr.size() >= 3 && (a.descr[0] == '<' || a.descr[0] == '|'), path, ": dtype '", a.descr,
           "' is not little-endian");
  const size_t esize = descr_size(a.descr);
  ST_CHECK(esize > 0, path, ": unsupported dtype '", a.descr, "'");
  const size_t data_bytes = a.numel() * esize, have = buf.size() - pos - header_len;
  ST_CHECK(have == data_bytes, path, ": shape needs ", data_bytes, " bytes of data but the file has ", have);
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
  else fail(path, ": token ids must be an integer array (int32 or int64), got dtype '", a.descr, "'");
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
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    ST_CHECK(out, path, ": cannot open '", tmp, "' for writing");
    const uint16_t len = static_cast<uint16_t>(dict.size());
    out.write("\x93NUMPY\x01\x00", 8);
    out.put(static_cast<char>(len & 0xff)).put(static_cast<char>(len >> 8));
    out.write(dict.data(), static_cast<std::streamsize>(dict.size()));
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(float)));
    ST_CHECK(out.flush(), path, ": write failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  ST_CHECK(!ec, path, ": cannot rename '", tmp, "': ", ec.message());
}

}  // namespace st

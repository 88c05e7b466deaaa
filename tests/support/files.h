// Whole files read and written by tests, byte for byte (binary mode on every
// platform), for fixtures made on the spot and outputs checked as text.
#pragma once
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace st::testing {

// The bytes of the file at `p`; "" when it cannot be opened.
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Replaces the file at `p` with `bytes`, making its directory first.
inline void write_file(const std::filesystem::path& p, const std::string& bytes) {
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace st::testing

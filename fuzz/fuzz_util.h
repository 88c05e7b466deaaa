// Helpers shared by the fuzz targets: a private scratch directory for parsers that
// read files (its own per process, removed at exit), and inputs made of several
// files ("parts") joined by a separator line.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

namespace fuzz {

// The line that separates the parts of a multi-file input (the dictionaries hold it).
inline constexpr std::string_view kPartSeparator = "\n%%\n";

// `data` cut at every separator; one part (the whole input) when there is none.
inline std::vector<std::string_view> split_parts(const uint8_t* data, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  size_t start = 0;
  for (size_t at; (at = all.find(kPartSeparator, start)) != std::string_view::npos; start = at + kPartSeparator.size())
    parts.push_back(all.substr(start, at - start));
  parts.push_back(all.substr(start));
  return parts;
}

inline std::string join_parts(const std::vector<std::string>& parts) {
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? std::string(kPartSeparator) : std::string()) + parts[i];
  return s;
}

// A directory of this process's own under $TMPDIR (or /dev/shm, which is memory, when
// it exists), created on first use and removed at exit.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    namespace fs = std::filesystem;
    std::string base = "/tmp";
    if (const char* t = std::getenv("TMPDIR"); t && *t) base = t;
    else if (std::error_code ec; fs::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0) base = "/dev/shm";
    std::string tmpl = base + "/shardtrain-fuzz-XXXXXX";
    if (!::mkdtemp(tmpl.data())) std::abort();
    static struct Remover {
      std::string d;
      ~Remover() {
        std::error_code ec;
        std::filesystem::remove_all(d, ec);
      }
    } remover{tmpl};
    return tmpl;
  }();
  return dir;
}

inline void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.flush()) std::abort();
}

inline void remove_file(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
}

// A path a loader would open that stays inside the scratch directory: a plain relative
// name, no "..", nothing absolute. Targets whose input can name other files skip
// inputs that name any other (so that a run reads nothing of the host's, and never a
// device such as /dev/zero that has no end).
inline bool confined_path(std::string_view p) {
  if (p.empty()) return true;
  if (p.front() == '/' || p.find('\0') != std::string_view::npos) return false;
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find('/', start);
    if (end == std::string_view::npos) end = p.size();
    if (p.substr(start, end - start) == "..") return false;
    start = end + 1;
  }
  return true;
}

// A rejection: silent, unless FUZZ_SHOW_ERRORS is set (to see why seeds are refused:
// FUZZ_SHOW_ERRORS=1 build-fuzz/fuzz_npy -runs=0 fuzz/corpus/npy).
inline void rejected(const std::exception& e) {
  static const bool show = std::getenv("FUZZ_SHOW_ERRORS") != nullptr;
  if (show) std::fprintf(stderr, "rejected: %s\n", e.what());
}

}  // namespace fuzz

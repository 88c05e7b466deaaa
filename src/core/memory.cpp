#include "core/memory.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

namespace st {
namespace {

// A number from a text file (cgroup files hold one; "max" is no limit): nullopt if absent.
std::optional<uint64_t> read_number(const char* path) {
  std::ifstream in(path);
  uint64_t v = 0;
  if (in >> v) return v;
  return std::nullopt;
}

}  // namespace

size_t host_memory_available_bytes() {
  uint64_t avail = 0;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    uint64_t kb = 0;
    std::string rest;
    if (!(meminfo >> kb)) break;
    std::getline(meminfo, rest);
    if (key == "MemAvailable:") {
      avail = kb * 1024;
      break;
    }
  }
  if (avail == 0) {
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) avail = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
  }
  const auto limit = read_number("/sys/fs/cgroup/memory.max"), used = read_number("/sys/fs/cgroup/memory.current");
  if (limit && used) avail = std::min<uint64_t>(avail, *limit > *used ? *limit - *used : 0);
  return static_cast<size_t>(avail);
}

}  // namespace st

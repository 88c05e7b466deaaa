#include "core/log.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace st {
namespace {
std::string g_prefix;
}

void set_log_rank(int rank, int world) {
  // Under `shardtrain launch` every line already carries the launcher's prefix.
  const char* prefixed = std::getenv("SHARDTRAIN_RANK_PREFIXED");
  const bool by_launcher = prefixed && std::string(prefixed) == "1";
  g_prefix = world > 1 && !by_launcher ? "[rank " + std::to_string(rank) + "] " : std::string();
}

void log_info(const std::string& msg) {
  std::printf("%s%s\n", g_prefix.c_str(), msg.c_str());
  std::fflush(stdout);
}

void log_warn(const std::string& msg) {
  std::fprintf(stderr, "%swarning: %s\n", g_prefix.c_str(), msg.c_str());
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

std::string human_count(double n) {
  char buf[32];
  if (n >= 1e9) std::snprintf(buf, sizeof buf, "%.2fB", n / 1e9);
  else if (n >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  else if (n >= 1e4) std::snprintf(buf, sizeof buf, "%.1fK", n / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}

double seconds_since_process_start() {
  // Field 22 of /proc/self/stat: start time in clock ticks after boot (CLOCK_BOOTTIME).
  std::FILE* f = std::fopen("/proc/self/stat", "r");
  if (!f) return -1;
  char buf[1024] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces
  if (!p || n == 0) return -1;
  unsigned long long start = 0;
  int field = 2;
  for (const char* q = p + 1; *q && field < 22; ++q)
    if (*q == ' ') {
      ++field;
      if (field == 22 && std::sscanf(q + 1, "%llu", &start) != 1) return -1;
    }
  if (field != 22) return -1;
  timespec now{};
  clock_gettime(CLOCK_BOOTTIME, &now);
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  return now.tv_sec + now.tv_nsec * 1e-9 - static_cast<double>(start) / tick;
}

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace st

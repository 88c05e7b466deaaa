#include "core/log.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

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

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace st

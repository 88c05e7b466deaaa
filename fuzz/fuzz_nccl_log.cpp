// libFuzzer target for the NCCL INFO log parser (st::parse_nccl_log, and
// st::parse_channel_line on each line). The parser takes any text and never throws:
// a crash, a sanitizer report, any exception or a summary that contradicts itself
// is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fabric/nccl_log.h"

namespace {

void check_summary(const st::TransportSummary& s) {
  if (!s.log_found) __builtin_trap();
  if (s.intra + s.inter != s.channel_lines || s.intra < 0 || s.inter < 0) __builtin_trap();
  int counted = 0;
  for (const st::PathCount& p : s.paths) {
    if (p.count < 1 || (p.locality != "intra" && p.locality != "inter") || p.kind.empty()) __builtin_trap();
    counted += p.count;
  }
  if (counted != s.channel_lines) __builtin_trap();
  if (s.warnings.size() > 5 || s.plugin_notes.size() > 5) __builtin_trap();
  if (s.nodes < 0 || s.max_ranks < 0) __builtin_trap();
  if (s.count_kind("nvlink") + s.count_kind("shm") > s.channel_lines) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  check_summary(st::parse_nccl_log(text));
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    if (auto p = st::parse_channel_line(text.substr(start, end - start))) {
      if (p->channel < 0 || p->from_rank < 0 || p->to_rank < 0 || p->from_dev < 0 || p->to_dev < 0) __builtin_trap();
      if (p->via.empty() || p->kind.empty()) __builtin_trap();
    }
    start = end + 1;
  }
  return 0;
}

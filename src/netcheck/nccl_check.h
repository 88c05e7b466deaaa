// `shardtrain nccl-check`: a collective-bandwidth preflight over the same NCCL
// profile, communicators and transport report a training run uses. The numbers
// follow nccl-tests (PERFORMANCE.md):
//   bytes   the full buffer: all_reduce its buffer; all_gather the gathered
//           (receive) buffer = n x per-rank; reduce_scatter the send buffer =
//           n x per-rank
//   algbw   bytes / time
//   busbw   all_reduce algbw x 2(n-1)/n; all_gather, reduce_scatter algbw x (n-1)/n
// so busbw is comparable with the link speed whatever the rank count.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace st {

enum class Collective { AllGather, ReduceScatter, AllReduce };

const char* collective_name(Collective c);  // "all_gather", "reduce_scatter", "all_reduce"

// The bus-bandwidth factor of a collective over n ranks: 2(n-1)/n or (n-1)/n.
double busbw_factor(Collective c, int nranks);

struct Bandwidth {
  double algbw_gbps = 0, busbw_gbps = 0;  // GB/s, 1e9 bytes
};
// bytes: the full buffer size as above; seconds: one operation's mean time.
Bandwidth collective_bandwidth(Collective c, double bytes, double seconds, int nranks);

// Sizes from min_bytes to max_bytes (both included when reachable), times `factor`,
// each rounded down to a multiple of `align` (a multiple of the rank count x element
// size, so every rank gets an equal whole slice), none below align.
std::vector<size_t> sweep_sizes(size_t min_bytes, size_t max_bytes, size_t factor, size_t align);

struct NcclCheckOptions {
  size_t min_bytes = 1 << 20, max_bytes = size_t(1) << 30, factor = 4;
  int iters = 20, warmup = 5;
  bool json = false;
};

struct NcclCheckRow {
  Collective op = Collective::AllReduce;
  size_t bytes = 0;
  double time_us = 0;  // mean over iters
  Bandwidth bw;
};

nlohmann::json to_json(const NcclCheckRow& r);

class Backend;
class Comm;

// The sweep: for each size and each collective, `warmup` untimed then `iters` timed
// operations on `comm` (f32 buffers of the backend), timed with CUDA events on the
// backend's stream; the time is the mean over ranks of each rank's mean. Needs the
// CUDA backend and an NCCL comm (a build without CUDA throws). Collective.
std::vector<NcclCheckRow> run_nccl_sweep(Comm& comm, Backend& backend, const NcclCheckOptions& o);
// One table line ("all_reduce      1048576 B   12.3 us  85.2 GB/s  127.8 GB/s").
std::string format_check_row(const NcclCheckRow& r);
std::string check_table_header();

}  // namespace st

#include "netcheck/nccl_check.h"

#include <algorithm>
#include <cstdio>

#include "backend/backend.h"
#include "core/error.h"
#include "comm/comm.h"

#ifdef SHARDTRAIN_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace st {

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::AllGather: return "all_gather";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::AllReduce: return "all_reduce";
  }
  return "?";
}

double busbw_factor(Collective c, int n) {
  ST_CHECK(n >= 1, "nccl-check: rank count must be positive, got ", n);
  const double f = static_cast<double>(n - 1) / n;
  return c == Collective::AllReduce ? 2 * f : f;
}

Bandwidth collective_bandwidth(Collective c, double bytes, double seconds, int nranks) {
  Bandwidth b;
  if (seconds <= 0) return b;
  b.algbw_gbps = bytes / seconds / 1e9;
  b.busbw_gbps = b.algbw_gbps * busbw_factor(c, nranks);
  return b;
}

std::vector<size_t> sweep_sizes(size_t min_bytes, size_t max_bytes, size_t factor, size_t align) {
  ST_CHECK(align > 0 && factor >= 2, "nccl-check: bad sweep (factor ", factor, ", align ", align, ")");
  ST_CHECK(min_bytes <= max_bytes, "nccl-check: --min-bytes ", min_bytes, " exceeds --max-bytes ", max_bytes);
  std::vector<size_t> out;
  for (size_t b = std::max<size_t>(min_bytes, 1);; b *= factor) {
    size_t s = std::max(align, b / align * align);
    if (out.empty() || out.back() != s) out.push_back(s);
    if (b > max_bytes / factor) break;
  }
  return out;
}

nlohmann::json to_json(const NcclCheckRow& r) {
  return {{"op", collective_name(r.op)},
          {"bytes", r.bytes},
          {"time_us", r.time_us},
          {"algbw_gbps", r.bw.algbw_gbps},
          {"busbw_gbps", r.bw.busbw_gbps}};
}

std::string check_table_header() {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%-15s %14s %12s %12s %12s", "collective", "size (B)", "time (us)", "algbw GB/s",
                "busbw GB/s");
  return buf;
}

std::string format_check_row(const NcclCheckRow& r) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%-15s %14zu %12.1f %12.2f %12.2f", collective_name(r.op), r.bytes, r.time_us,
                r.bw.algbw_gbps, r.bw.busbw_gbps);
  return buf;
}

#ifdef SHARDTRAIN_HAVE_CUDA

namespace {

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("nccl-check: ", what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

}  // namespace

std::vector<NcclCheckRow> run_nccl_sweep(Comm& comm, Backend& backend, const NcclCheckOptions& o) {
  ST_CHECK(backend.device() == Device::CUDA && backend.native_stream(), "nccl-check needs the CUDA backend, got ",
           backend.name());
  ST_CHECK(o.iters >= 1 && o.warmup >= 0, "nccl-check: --iters must be >= 1 and --warmup >= 0");
  const int n = comm.world();
  const size_t elt = sizeof(float);
  const std::vector<size_t> sizes = sweep_sizes(o.min_bytes, o.max_bytes, o.factor, elt * n);
  const size_t max_numel = sizes.back() / elt;
  Tensor big = backend.alloc(DType::F32, max_numel), small = backend.alloc(DType::F32, max_numel / n);
  auto stream = static_cast<cudaStream_t>(backend.native_stream());
  cudaEvent_t start = nullptr, stop = nullptr;
  cuda_ok(cudaEventCreate(&start), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<NcclCheckRow> rows;
  try {
    for (size_t bytes : sizes) {
      const size_t numel = bytes / elt, per_rank = numel / n;
      for (Collective c : {Collective::AllGather, Collective::ReduceScatter, Collective::AllReduce}) {
        auto once = [&] {
          switch (c) {
            case Collective::AllGather: comm.all_gather(big, small, per_rank); break;  // gathers `bytes`
            case Collective::ReduceScatter: comm.reduce_scatter(small, big, per_rank); break;  // scatters `bytes`
            case Collective::AllReduce: comm.all_reduce(big, numel); break;
          }
        };
        for (int i = 0; i < o.warmup; ++i) once();
        comm.barrier();  // everyone starts together (bounded wait)
        cuda_ok(cudaEventRecord(start, stream), "cudaEventRecord");
        for (int i = 0; i < o.iters; ++i) once();
        cuda_ok(cudaEventRecord(stop, stream), "cudaEventRecord");
        cuda_ok(cudaEventSynchronize(stop), "cudaEventSynchronize");
        float ms = 0;
        cuda_ok(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
        const double mine = ms / 1e3 / o.iters;
        const double seconds = comm.all_reduce_sum(mine) / n;
        NcclCheckRow row;
        row.op = c;
        row.bytes = bytes;
        row.time_us = seconds * 1e6;
        row.bw = collective_bandwidth(c, static_cast<double>(bytes), seconds, n);
        rows.push_back(row);
      }
    }
  } catch (...) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    backend.free(big);
    backend.free(small);
    throw;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  backend.free(big);
  backend.free(small);
  return rows;
}

#else

std::vector<NcclCheckRow> run_nccl_sweep(Comm&, Backend&, const NcclCheckOptions&) {
  fail("nccl-check needs NCCL on GPUs: this build has no CUDA (nvcc was not found at configure time)");
}

#endif

}  // namespace st

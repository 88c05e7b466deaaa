// Seeded initialisation on the GPU: the counter-based normal draw of core/rng.h,
// computed where the weights live, so a 1.5B-parameter model starts without
// generating and uploading 6 GB from the host. Same formula and double math as the
// CPU (log and cos may differ from glibc's in the last bit of a double, so a rare
// float can differ by one ulp).
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_utils.cuh"
#include "core/rng.h"

namespace st::cuda {
namespace {

constexpr unsigned kThreads = 256;

template <class D>
__global__ void fill_normal_kernel(D* out, size_t n, uint64_t key, uint64_t first, double stddev) {
  for (size_t i = global_thread(); i < n; i += grid_threads()) out[i] = D(stddev * counter_normal(key, first + i));
}

}  // namespace

void fill_normal(void* out, DType dt, size_t n, uint64_t key, uint64_t first, double stddev, cudaStream_t stream) {
  if (n == 0) return;
  if (dt == DType::F32)
    fill_normal_kernel<float><<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<float*>(out), n, key,
                                                                               first, stddev);
  else
    fill_normal_kernel<double><<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<double*>(out), n, key,
                                                                                first, stddev);
  ST_CUDA_LAUNCHED("fill_normal_kernel");
}

}  // namespace st::cuda

// Error checking for CUDA runtime and cuBLASLt calls, and a stream-ordered scratch
// buffer. Host-only: included by the .cpp files of this directory and the .cu ones.
// Every failure becomes an st::Error naming the call and CUDA's own message.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "core/error.h"

namespace st::cuda {

inline void check(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess)
    fail("CUDA error: ", call, " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ") at ", file, ":",
         line);
}

}  // namespace st::cuda

// ST_CUDA(cudaMemcpyAsync(...)) throws st::Error when the call fails.
#define ST_CUDA(call) ::st::cuda::check((call), #call, __FILE__, __LINE__)
// After a kernel launch: catches bad launch configurations at once. Faults inside
// the kernel surface at the next synchronising call (download, synchronize).
#define ST_CUDA_LAUNCHED(kernel_name) ::st::cuda::check(cudaGetLastError(), "launch of " kernel_name, __FILE__, __LINE__)

namespace st::cuda {

// Temporary device memory for one op (partial sums, row statistics). Allocated and
// freed in stream order from the device's memory pool, which the backend sets to
// keep freed memory cached, so a scratch buffer per call costs no cudaMalloc.
class Scratch {
 public:
  Scratch(size_t bytes, cudaStream_t stream) : stream_(stream) {
    if (bytes) ST_CUDA(cudaMallocAsync(&ptr_, bytes, stream));
  }
  ~Scratch() {
    if (ptr_) (void)cudaFreeAsync(ptr_, stream_);  // a destructor must not throw
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

// Blocks for a grid-stride loop over n elements: enough to fill the GPU, no more.
inline unsigned grid_for(size_t n, unsigned threads, unsigned max_blocks = 65535 * 4) {
  size_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > max_blocks) b = max_blocks;
  return static_cast<unsigned>(b);
}

}  // namespace st::cuda

// Reductions: the sum of squares for the gradient norm (double, deterministic) and
// the matmul bias gradient / bias broadcast.
#include <algorithm>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/reduce.cuh"

namespace st::cuda {
namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kMaxBlocks = 1024;  // partials of stage 1; a fixed count keeps the sum order fixed

// partial (gridDim.x) = Σ x² over this block's grid-stride share, in double.
template <class T>
__global__ void sum_squares_partial_kernel(double* partial, const T* x, size_t n) {
  __shared__ double shared[32];
  double s = 0;
  for (size_t i = global_thread(); i < n; i += grid_threads()) {
    const double v = to_float(x[i]);
    s += v * v;
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// *result = Σ partial (count), one block.
__global__ void sum_partials_kernel(double* result, const double* partial, int count) {
  __shared__ double shared[32];
  double s = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) *result = s;
}

template <class T>
struct ColumnOf {  // f(r, c) = x[r][c] of x (N, C)
  const T* x;
  int C;
  __device__ float operator()(int r, int c) const { return to_float(x[size_t(r) * C + c]); }
};

// out (N, C) += bias (C)
template <class T>
__global__ void add_bias_kernel(T* out, const T* bias, int N, int C) {
  const size_t n = size_t(N) * C;
  for (size_t i = global_thread(); i < n; i += grid_threads())
    out[i] = from_float<T>(to_float(out[i]) + to_float(bias[i % C]));
}

}  // namespace

template <class T>
void sum_squares(double* result, const T* x, size_t n, cudaStream_t stream) {
  const unsigned blocks = grid_for(n, kThreads, kMaxBlocks);
  Scratch partial(blocks * sizeof(double), stream);
  sum_squares_partial_kernel<<<blocks, kThreads, 0, stream>>>(partial.as<double>(), x, n);
  ST_CUDA_LAUNCHED("sum_squares_partial_kernel");
  sum_partials_kernel<<<1, kThreads, 0, stream>>>(result, partial.as<double>(), int(blocks));
  ST_CUDA_LAUNCHED("sum_partials_kernel");
}

template <class T>
void column_sums_add(float* out, const T* x, int N, int C, cudaStream_t stream) {
  column_reduce_add(out, ColumnOf<T>{x, C}, N, C, stream);
}

template <class T>
void add_bias(T* out, const T* bias, int N, int C, cudaStream_t stream) {
  add_bias_kernel<<<grid_for(size_t(N) * C, kThreads), kThreads, 0, stream>>>(out, bias, N, C);
  ST_CUDA_LAUNCHED("add_bias_kernel");
}

#define ST_CUDA_REDUCE(T)                                                   \
  template void sum_squares<T>(double*, const T*, size_t, cudaStream_t);    \
  template void column_sums_add<T>(float*, const T*, int, int, cudaStream_t); \
  template void add_bias<T>(T*, const T*, int, int, cudaStream_t);
ST_CUDA_REDUCE(float)
ST_CUDA_REDUCE(bf16)
#undef ST_CUDA_REDUCE

namespace {

__device__ __forceinline__ unsigned long long mix64(unsigned long long x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void fingerprint_kernel(unsigned long long* result, const unsigned long long* w, size_t n) {
  unsigned long long s = 0;
  for (size_t i = global_thread(); i < n; i += grid_threads()) s += mix64(w[i] ^ mix64(i + 0x9e3779b97f4a7c15ull));
  for (int o = 16; o > 0; o /= 2) s += __shfl_down_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(result, s);  // integer sums: the order does not matter
}

}  // namespace

void fingerprint_add(unsigned long long* result, const void* p, size_t bytes, cudaStream_t stream) {
  const size_t n = bytes / 8;
  if (n == 0) return;
  const unsigned blocks = unsigned(std::min<size_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
  fingerprint_kernel<<<blocks, kThreads, 0, stream>>>(result, static_cast<const unsigned long long*>(p), n);
  ST_CUDA_LAUNCHED("fingerprint_kernel");
}

}  // namespace st::cuda

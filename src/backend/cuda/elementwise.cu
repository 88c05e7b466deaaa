// Element-wise kernels: fill, dtype conversion, add/accumulate, embedding gather and
// scatter, SwiGLU, and the token-id range check. All are memory-bound grid-stride
// loops; math in float. add, accumulate and SwiGLU move 16-byte packs when the
// pointers allow it (checked at launch: tensors are often slices at arbitrary element
// offsets) and fall back to scalar loads otherwise; both paths compute each element
// with the same float expression, so the result does not depend on the path.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/swiglu.cuh"

namespace st::cuda {
namespace {

constexpr unsigned kThreads = 256;

// ---- fill and convert -------------------------------------------------------------

template <class D>
__global__ void fill_kernel(D* p, size_t n, D value) {
  for (size_t i = global_thread(); i < n; i += grid_threads()) p[i] = value;
}

// Load any supported element as double (exact for every source type but I64 > 2^53).
__device__ __forceinline__ double load_as_double(const float* p, size_t i) { return p[i]; }
__device__ __forceinline__ double load_as_double(const double* p, size_t i) { return p[i]; }
__device__ __forceinline__ double load_as_double(const bf16* p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ double load_as_double(const int32_t* p, size_t i) { return p[i]; }
__device__ __forceinline__ double load_as_double(const int64_t* p, size_t i) { return double(p[i]); }

template <class D>
__device__ __forceinline__ D store_from(double x);
template <>
__device__ __forceinline__ float store_from<float>(double x) { return float(x); }
template <>
__device__ __forceinline__ double store_from<double>(double x) { return x; }
// Through float first, as the CPU backend does (f64 -> f32 -> bf16), so F32 -> BF16 is
// one round-to-nearest-even of the float and matches f32_to_bf16 bit for bit.
template <>
__device__ __forceinline__ bf16 store_from<bf16>(double x) { return __float2bfloat16_rn(float(x)); }
template <>
__device__ __forceinline__ int32_t store_from<int32_t>(double x) { return int32_t(x); }  // truncates, saturates
template <>
__device__ __forceinline__ int64_t store_from<int64_t>(double x) { return int64_t(x); }

template <class D, class S>
__global__ void convert_kernel(D* dst, const S* src, size_t n) {
  for (size_t i = global_thread(); i < n; i += grid_threads()) dst[i] = store_from<D>(load_as_double(src, i));
}

// Calls fn(X{}) with X the C++ type of dt.
template <class Fn>
void with_type(DType dt, Fn&& fn) {
  switch (dt) {
    case DType::F32: fn(float{}); return;
    case DType::F64: fn(double{}); return;
    case DType::BF16: fn(bf16{}); return;
    case DType::I32: fn(int32_t{}); return;
    case DType::I64: fn(int64_t{}); return;
    case DType::F16:
    case DType::F8E4M3:
    case DType::F8E5M2: break;
  }
  fail("cuda backend: ", dtype_name(dt), " tensors are not supported");
}

// ---- add / accumulate -------------------------------------------------------------
// Elements [head, head + packs * P) go in 16-byte packs (aligned in every array), the
// `head` before them and the tail after them one by one; packs = 0 is the scalar path.
// out may be a or b (in place): each element is read before it is written, by the
// same thread.

template <class T>
__global__ void add_kernel(T* out, const T* a, const T* b, size_t n, size_t head, size_t packs) {
  constexpr int P = kPack<T>;
  for (size_t k = global_thread(); k < packs; k += grid_threads()) {
    const size_t i = head + k * P;
    const Pack<T> x = load_pack(a + i), y = load_pack(b + i);
    Pack<T> z;
#pragma unroll
    for (int e = 0; e < P; ++e) z.v[e] = from_float<T>(to_float(x.v[e]) + to_float(y.v[e]));
    store_pack(out + i, z);
  }
  const size_t rest = n - packs * P;
  for (size_t k = global_thread(); k < rest; k += grid_threads()) {
    const size_t i = k < head ? k : k + packs * P;
    out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
  }
}

template <class T>
__global__ void accumulate_kernel(T* acc, const T* x, size_t n, size_t head, size_t packs) {
  constexpr int P = kPack<T>;
  for (size_t k = global_thread(); k < packs; k += grid_threads()) {
    const size_t i = head + k * P;
    Pack<T> s = load_pack(acc + i);
    const Pack<T> y = load_pack(x + i);
#pragma unroll
    for (int e = 0; e < P; ++e) s.v[e] = from_float<T>(to_float(s.v[e]) + to_float(y.v[e]));
    store_pack(acc + i, s);
  }
  const size_t rest = n - packs * P;
  for (size_t k = global_thread(); k < rest; k += grid_threads()) {
    const size_t i = k < head ? k : k + packs * P;
    acc[i] = from_float<T>(to_float(acc[i]) + to_float(x[i]));
  }
}

// The split of n elements of T arrays into a scalar head, whole 16-byte packs and a
// scalar tail: packs only where every array sits at the same offset within 16 bytes
// (then one scalar head brings all of them to a 16-byte boundary at once).
template <class T>
void split_packs(std::initializer_list<const void*> arrays, size_t n, size_t* head, size_t* packs) {
  *head = 0, *packs = 0;
  const uintptr_t mis = reinterpret_cast<uintptr_t>(*arrays.begin()) % 16;
  for (const void* p : arrays)
    if (reinterpret_cast<uintptr_t>(p) % 16 != mis) return;
  if (mis % sizeof(T) != 0) return;
  const size_t h = mis == 0 ? 0 : (16 - mis) / sizeof(T);
  if (h >= n) return;
  *head = h, *packs = (n - h) / kPack<T>;
}

// ---- ids and embedding ------------------------------------------------------------

__global__ void find_bad_id_kernel(int* first_bad, const int32_t* ids, int N, int V, bool has_ignore, int ignore) {
  for (size_t r = global_thread(); r < size_t(N); r += grid_threads()) {
    const int id = ids[r];
    if (has_ignore && id == ignore) continue;
    if (id < 0 || id >= V) atomicMin(first_bad, int(r));  // the lowest row, as the CPU reports
  }
}

// out (N, C) = wte (V, C)[tokens (N)]
template <class T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* wte, int N, int C) {
  const size_t n = size_t(N) * C;
  for (size_t i = global_thread(); i < n; i += grid_threads()) {
    const size_t r = i / C, c = i % C;
    out[i] = wte[size_t(tokens[r]) * C + c];
  }
}

// dwte (V, C) += scatter of dout (N, C), deterministic: the rows arrive sorted by token
// (a stable sort, so rows of one token keep their order); block i starts the run of
// token keys[i] when keys[i-1] differs, sums the run's rows in that order, and adds the
// sum to the token's row once. No atomics, so the bits do not depend on scheduling.
__global__ void iota_kernel(int32_t* v, int n) {
  for (size_t i = global_thread(); i < size_t(n); i += grid_threads()) v[i] = int32_t(i);
}

template <class T>
__global__ void embedding_backward_sorted_kernel(float* dwte, const T* dout, const int32_t* keys,
                                                 const int32_t* rows, int N, int C) {
  const int i = blockIdx.x;
  const int32_t tok = keys[i];
  if (i > 0 && keys[i - 1] == tok) return;  // not the start of a run
  int end = i + 1;
  while (end < N && keys[end] == tok) ++end;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = i; j < end; ++j) acc += to_float(dout[size_t(rows[j]) * C + c]);
    dwte[size_t(tok) * C + c] += acc;
  }
}

// ---- SwiGLU -------------------------------------------------------------------------


// out (N, F) = silu(gate) * up, gu (N, 2F) = [gate | up] per row. Scalar path.
template <class T>
__global__ void swiglu_forward_kernel(T* out, const T* gu, int N, int F) {
  const size_t n = size_t(N) * F;
  for (size_t i = global_thread(); i < n; i += grid_threads()) {
    const size_t r = i / F, j = i % F;
    const float g = to_float(gu[r * 2 * F + j]), u = to_float(gu[r * 2 * F + F + j]);
    out[i] = from_float<T>(swiglu_value(g, u));
  }
}

// The same in 16-byte packs: F % P == 0 and out, gu 16-byte aligned, so every row's
// gate, up and out parts start on a 16-byte boundary. One pack of out per iteration.
template <class T>
__global__ void swiglu_forward_vec_kernel(T* out, const T* gu, int N, int F) {
  constexpr int P = kPack<T>;
  const size_t row_packs = size_t(F / P), n = size_t(N) * row_packs;
  for (size_t k = global_thread(); k < n; k += grid_threads()) {
    const size_t r = k / row_packs, j = (k % row_packs) * P;
    const T* g = gu + r * 2 * F + j;
    const Pack<T> gp = load_pack(g), up = load_pack(g + F);
    Pack<T> y;
#pragma unroll
    for (int e = 0; e < P; ++e) {
      const float gv = to_float(gp.v[e]), u = to_float(up.v[e]);
      y.v[e] = from_float<T>(swiglu_value(gv, u));
    }
    store_pack(out + r * F + j, y);
  }
}


template <class T>
__global__ void swiglu_backward_kernel(T* dgu, const T* dout, const T* gu, int N, int F) {
  const size_t n = size_t(N) * F;
  for (size_t i = global_thread(); i < n; i += grid_threads()) {
    const size_t r = i / F, j = i % F;
    const float g = to_float(gu[r * 2 * F + j]), u = to_float(gu[r * 2 * F + F + j]);
    float dg, du;
    swiglu_grads(g, u, to_float(dout[i]), &dg, &du);
    dgu[r * 2 * F + j] = from_float<T>(dg);
    dgu[r * 2 * F + F + j] = from_float<T>(du);
  }
}

// The same in 16-byte packs (F % P == 0; dgu, dout, gu 16-byte aligned). dgu may be
// gu (in place): each pack is read before it is written, by the same thread.
template <class T>
__global__ void swiglu_backward_vec_kernel(T* dgu, const T* dout, const T* gu, int N, int F) {
  constexpr int P = kPack<T>;
  const size_t row_packs = size_t(F / P), n = size_t(N) * row_packs;
  for (size_t k = global_thread(); k < n; k += grid_threads()) {
    const size_t r = k / row_packs, j = (k % row_packs) * P;
    const size_t gi = r * 2 * F + j;
    const Pack<T> gp = load_pack(gu + gi), up = load_pack(gu + gi + F), dp = load_pack(dout + r * F + j);
    Pack<T> dg, du;
#pragma unroll
    for (int e = 0; e < P; ++e) {
      float a, b;
      swiglu_grads(to_float(gp.v[e]), to_float(up.v[e]), to_float(dp.v[e]), &a, &b);
      dg.v[e] = from_float<T>(a);
      du.v[e] = from_float<T>(b);
    }
    store_pack(dgu + gi, dg);
    store_pack(dgu + gi + F, du);
  }
}

}  // namespace

// ---- launchers ------------------------------------------------------------------------

void fill(void* p, DType dt, size_t n, double value, cudaStream_t stream) {
  if (n == 0) return;
  with_type(dt, [&](auto tag) {
    using D = decltype(tag);
    D v;
    if constexpr (std::is_same_v<D, bf16>)
      v = __float2bfloat16_rn(float(value));
    else
      v = static_cast<D>(value);
    fill_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<D*>(p), n, v);
  });
  ST_CUDA_LAUNCHED("fill_kernel");
}

void convert(void* dst, DType dst_dt, const void* src, DType src_dt, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  with_type(dst_dt, [&](auto dtag) {
    with_type(src_dt, [&](auto stag) {
      using D = decltype(dtag);
      using S = decltype(stag);
      convert_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<D*>(dst),
                                                                      static_cast<const S*>(src), n);
    });
  });
  ST_CUDA_LAUNCHED("convert_kernel");
}

template <class T>
void add(T* out, const T* a, const T* b, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  size_t head, packs;
  split_packs<T>({out, a, b}, n, &head, &packs);
  const size_t work = std::max(packs, n - packs * kPack<T>);
  add_kernel<<<grid_for(work, kThreads), kThreads, 0, stream>>>(out, a, b, n, head, packs);
  ST_CUDA_LAUNCHED("add_kernel");
}

template <class T>
void accumulate(T* acc, const T* x, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  size_t head, packs;
  split_packs<T>({acc, x}, n, &head, &packs);
  const size_t work = std::max(packs, n - packs * kPack<T>);
  accumulate_kernel<<<grid_for(work, kThreads), kThreads, 0, stream>>>(acc, x, n, head, packs);
  ST_CUDA_LAUNCHED("accumulate_kernel");
}

void find_bad_id(int* first_bad, const int32_t* ids, int N, int V, bool has_ignore, int ignore,
                 cudaStream_t stream) {
  find_bad_id_kernel<<<grid_for(N, kThreads), kThreads, 0, stream>>>(first_bad, ids, N, V, has_ignore, ignore);
  ST_CUDA_LAUNCHED("find_bad_id_kernel");
}

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int N, int C, cudaStream_t stream) {
  embedding_forward_kernel<<<grid_for(size_t(N) * C, kThreads), kThreads, 0, stream>>>(out, tokens, wte, N, C);
  ST_CUDA_LAUNCHED("embedding_forward_kernel");
}

template <class T>
void embedding_backward(float* dwte, const T* dout, const int32_t* tokens, int N, int C, int V, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  int bits = 1;
  while (bits < 31 && (int64_t(1) << bits) < V) ++bits;  // ids are in [0, V)
  // One stream-ordered allocation: sorted keys, row indices in and out, sort scratch.
  size_t scratch = 0;
  ST_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, scratch, tokens, static_cast<int32_t*>(nullptr),
                                          static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), N, 0,
                                          bits, stream));
  const size_t ints = (3 * size_t(N) + 63) / 64 * 64;
  void* mem = nullptr;
  ST_CUDA(cudaMallocAsync(&mem, ints * sizeof(int32_t) + scratch, stream));
  int32_t* keys = static_cast<int32_t*>(mem);
  int32_t* rows_in = keys + N;
  int32_t* rows = rows_in + N;
  void* tmp = static_cast<int32_t*>(mem) + ints;
  try {
    iota_kernel<<<grid_for(size_t(N), kThreads), kThreads, 0, stream>>>(rows_in, N);
    ST_CUDA_LAUNCHED("iota_kernel");
    ST_CUDA(cub::DeviceRadixSort::SortPairs(tmp, scratch, tokens, keys, rows_in, rows, N, 0, bits, stream));
    embedding_backward_sorted_kernel<<<N, kThreads, 0, stream>>>(dwte, dout, keys, rows, N, C);
    ST_CUDA_LAUNCHED("embedding_backward_sorted_kernel");
  } catch (...) {
    (void)cudaFreeAsync(mem, stream);
    throw;
  }
  ST_CUDA(cudaFreeAsync(mem, stream));
}

template <class T>
void swiglu_forward(T* out, const T* gu, int N, int F, cudaStream_t stream) {
  if (F % kPack<T> == 0 && aligned16(out) && aligned16(gu)) {
    const size_t packs = size_t(N) * (F / kPack<T>);
    swiglu_forward_vec_kernel<<<grid_for(packs, kThreads), kThreads, 0, stream>>>(out, gu, N, F);
    ST_CUDA_LAUNCHED("swiglu_forward_vec_kernel");
    return;
  }
  swiglu_forward_kernel<<<grid_for(size_t(N) * F, kThreads), kThreads, 0, stream>>>(out, gu, N, F);
  ST_CUDA_LAUNCHED("swiglu_forward_kernel");
}

template <class T>
void swiglu_backward(T* dgu, const T* dout, const T* gu, int N, int F, cudaStream_t stream) {
  if (F % kPack<T> == 0 && aligned16(dgu) && aligned16(dout) && aligned16(gu)) {
    const size_t packs = size_t(N) * (F / kPack<T>);
    swiglu_backward_vec_kernel<<<grid_for(packs, kThreads), kThreads, 0, stream>>>(dgu, dout, gu, N, F);
    ST_CUDA_LAUNCHED("swiglu_backward_vec_kernel");
    return;
  }
  swiglu_backward_kernel<<<grid_for(size_t(N) * F, kThreads), kThreads, 0, stream>>>(dgu, dout, gu, N, F);
  ST_CUDA_LAUNCHED("swiglu_backward_kernel");
}

#define ST_CUDA_ELEMENTWISE(T)                                                                    \
  template void add<T>(T*, const T*, const T*, size_t, cudaStream_t);                            \
  template void accumulate<T>(T*, const T*, size_t, cudaStream_t);                               \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int, int, cudaStream_t);      \
  template void embedding_backward<T>(float*, const T*, const int32_t*, int, int, int, cudaStream_t); \
  template void swiglu_forward<T>(T*, const T*, int, int, cudaStream_t);                         \
  template void swiglu_backward<T>(T*, const T*, const T*, int, int, cudaStream_t);
ST_CUDA_ELEMENTWISE(float)
ST_CUDA_ELEMENTWISE(bf16)
#undef ST_CUDA_ELEMENTWISE

}  // namespace st::cuda

#include "backend/factory.h"

#include "backend/op_checks.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/rng.h"

#ifdef SHARDTRAIN_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace st {

bool cuda_available() {
#ifdef SHARDTRAIN_HAVE_CUDA
  return cuda::device_count(nullptr) > 0;
#else
  return false;
#endif
}

#ifndef SHARDTRAIN_HAVE_CUDA
// Without nvcc at configure time there is no CUDA backend; callers check
// cuda_available() first, so this only names the reason if one does not.
std::unique_ptr<Backend> make_cuda_backend(int) {
  fail("this build has no CUDA backend (nvcc was not found at configure time)");
}
#endif

int visible_devices(const std::string& device, std::string* why) {
  if (device == "cpu") return 1;
#ifdef SHARDTRAIN_HAVE_CUDA
  if (device == "cuda") return cuda::device_count(why);
#else
  if (device == "cuda" && why) *why = "this build has no CUDA backend (nvcc was not found at configure time)";
#endif
  return 0;
}

std::unique_ptr<Backend> make_backend(const std::string& device, int device_index, const std::string& option) {
  // "train.device = cuda" for a config key, "--device cuda" for a command's own flag.
  const bool flag = option.rfind("--", 0) == 0;
  const std::string asked = option + (flag ? " " : " = ") + device;
  if (device == "cpu") return make_cpu_backend();
  if (device == "cuda") {
#ifdef SHARDTRAIN_HAVE_CUDA
    std::string why;
    if (cuda::device_count(&why) == 0) fail_config(asked, ": no CUDA device found (cudaGetDeviceCount: ", why, ")");
    return make_cuda_backend(device_index);
#else
    fail_config(asked, ": this build has no CUDA backend (nvcc was not found at configure time); use ",
                flag ? option + " cpu" : "--" + option + "=cpu");
#endif
  }
  fail_config(option, ": unknown device '", device, "' (expected cpu or cuda)");
}

// The default seeded fill: computed on the host in pieces, each uploaded into place.
void Backend::fill_normal(Tensor t, uint64_t key, uint64_t first, double stddev) {
  ST_CHECK(t.dtype == DType::F32 || t.dtype == DType::F64, "fill_normal: ", dtype_name(t.dtype),
           " tensors are not supported (F32, F64)");
  constexpr size_t kPiece = size_t{1} << 20;
  std::vector<double> d;
  std::vector<float> f;
  for (size_t at = 0; at < t.numel; at += kPiece) {
    const size_t n = std::min(kPiece, t.numel - at);
    d.resize(n);
    for (size_t i = 0; i < n; ++i) d[i] = stddev * counter_normal(key, first + at + i);
    if (t.dtype == DType::F64) {
      upload(t.slice(at, n), d.data());
    } else {
      f.assign(d.begin(), d.end());
      upload(t.slice(at, n), f.data());
    }
  }
}

void check_ids_on_host(const int32_t* ids, size_t n, int V, bool has_ignore, int ignore, const char* what,
                       const char* op) {
  for (size_t r = 0; r < n; ++r) {
    const int32_t id = ids[r];
    if (has_ignore && id == ignore) continue;
    ST_CHECK(id >= 0 && id < V, op ? op : "", op ? ": " : "", what, " ", id, " at row ", r, " is outside [0, V=", V,
             ")");
  }
}

void Backend::upload_ids(Tensor dst, const int32_t* host, int V, bool has_ignore, int ignore, const char* what) {
  ST_CHECK(dst.dtype == DType::I32, "upload_ids: ", what, " tensor is ", dtype_name(dst.dtype), ", expected i32");
  check_ids_on_host(host, dst.numel, V, has_ignore, ignore, what);
  upload(dst, host);
}

}  // namespace st

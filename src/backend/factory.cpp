// Picks the backend for a device name, and says what a build and a host can run
// (factory.h).
#include "backend/factory.h"

#include <vector>

#include "core/error.h"

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
    if (cuda::device_count(&why) == 0)
      fail_config(asked, ": no CUDA device found (cudaGetDeviceCount: ", why, "); to run on the CPU instead, use ",
                  flag ? option + " cpu" : "--" + option + "=cpu");
    return make_cuda_backend(device_index);
#else
    fail_config(asked, ": this build has no CUDA backend (nvcc was not found at configure time); use ",
                flag ? option + " cpu" : "--" + option + "=cpu");
#endif
  }
  fail_config(option, ": unknown device '", device, "' (expected cpu or cuda)");
}

}  // namespace st

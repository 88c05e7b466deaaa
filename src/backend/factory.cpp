#include "backend/factory.h"

#include "core/error.h"

namespace st {

std::unique_ptr<Backend> make_backend(const std::string& device) {
  if (device == "cpu") return make_cpu_backend();
  if (device == "cuda")
    fail("train.device = \"cuda\": this build has no CUDA backend yet; use --train.device=cpu");
  fail("train.device: unknown device '", device, "' (expected cpu or cuda)");
}

}  // namespace st

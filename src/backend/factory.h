// Picks the backend for `train.device`.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"

namespace st {

// "cpu" -> the fp32 reference; "cuda" -> the GPU backend where this build has one,
// on CUDA device `device_index` (a rank passes its LOCAL_RANK modulo the device
// count, so the ranks of one host each get their own GPU). The CPU ignores it.
std::unique_ptr<Backend> make_backend(const std::string& device, int device_index = 0);

}  // namespace st

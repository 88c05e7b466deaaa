// Picks the backend for `train.device`.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"

namespace st {

// "cpu" -> the fp32 reference; "cuda" -> the GPU backend where this build has one.
std::unique_ptr<Backend> make_backend(const std::string& device);

}  // namespace st

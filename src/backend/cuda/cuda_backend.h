// What the rest of the library needs from the CUDA backend beyond backend.h:
// a device probe that never throws (factory.cpp, cuda_available()).
#pragma once
#include <string>

namespace st::cuda {

// Number of CUDA devices; 0 with *error set to CUDA's message when the runtime
// reports none (no driver, no device, ...).
int device_count(std::string* error);

}  // namespace st::cuda

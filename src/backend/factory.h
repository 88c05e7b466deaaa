// Picks the backend for `train.device`.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace st {

// "cpu" -> the fp32 reference; "cuda" -> the GPU backend where this build has one,
// on CUDA device `device_index` (a rank passes its LOCAL_RANK modulo the device
// count, so the ranks of one host each get their own GPU). The CPU ignores it.
// `option` names the setting that chose the device in errors ("train.device", or a
// command's own flag such as "--device").
std::unique_ptr<Backend> make_backend(const std::string& device, int device_index = 0,
                                      const std::string& option = "train.device");

// How many devices of that kind this process can see: 1 for the CPU; for CUDA the
// visible GPUs (0 in a build without CUDA, or when none is found; `why` then says
// why where it can).
int visible_devices(const std::string& device, std::string* why = nullptr);

}  // namespace st

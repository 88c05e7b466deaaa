// How much host memory a new allocation can still have, for the checks that refuse a
// run before it allocates (train/memory_check.h, the CPU backend).
#pragma once
#include <cstddef>

namespace st {

// MemAvailable from /proc/meminfo (the kernel's estimate of what can be allocated
// without swapping; the free pages from sysconf where it is missing), capped by a
// cgroup v2 memory limit (a container) when there is one. 0 when nothing says.
size_t host_memory_available_bytes();

}  // namespace st

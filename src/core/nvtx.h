// NVTX ranges for Nsight Systems: a step, its micro-batches, the model's layers and
// ops (attention, mlp, norm, loss), FSDP's gathers and reductions, the optimizer.
// They mark what the host was doing (enqueueing GPU work, or waiting for it) on
// the timeline, beside the CUDA kernels each range launched.
//
//   ST_NVTX_RANGE("optimizer step");          // to the end of the scope
//   ST_NVTX_RANGE("step", 12);                // "step 12"
//   ST_NVTX_RANGE("all-gather", unit.name);   // "all-gather layers.3"
//   st::NvtxRange r("norm"); ...; r.next("attention"); ...; r.end();
//
// Ranges are pushed only while a tool is attached: NVTX's injection variable
// (NVTX_INJECTION64_PATH, which nsys and ncu set) is read once, and without it a
// range is one test of a static bool, with no string built. Builds without CUDA
// (SHARDTRAIN_CUDA=OFF, or a room that does not link the backend) compile every
// range to nothing. NVTX 3 is header-only (<nvtx3/nvToolsExt.h> in the CUDA
// toolkit); it loads the tool with dlopen.
#pragma once
#include <string>

#if defined(SHARDTRAIN_HAVE_CUDA) && __has_include(<nvtx3/nvToolsExt.h>)
#define SHARDTRAIN_NVTX 1
#include <nvtx3/nvToolsExt.h>

#include <cstdlib>
#endif

namespace st {

#if SHARDTRAIN_NVTX
// Its own inline namespace, so a translation unit built without NVTX (a different
// class of the same name) can never be confused with this one at link time.
inline namespace nvtx_on {

inline bool nvtx_enabled() {
  static const bool on = [] {
    const char* p = std::getenv("NVTX_INJECTION64_PATH");
    return p && *p;
  }();
  return on;
}

inline nvtxDomainHandle_t nvtx_domain() {
  static const nvtxDomainHandle_t d = nvtxDomainCreateA("shardtrain");
  return d;
}

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) {
    if (nvtx_enabled()) push(name);
  }
  NvtxRange(const char* name, const std::string& detail) {
    if (nvtx_enabled()) push((std::string(name) + " " + detail).c_str());
  }
  NvtxRange(const char* name, long long index) {
    if (nvtx_enabled()) push((std::string(name) + " " + std::to_string(index)).c_str());
  }
  ~NvtxRange() { end(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;

  // Ends this range and starts `name` in its place (one op after another).
  void next(const char* name) {
    end();
    if (nvtx_enabled()) push(name);
  }
  void end() {
    if (pushed_) nvtxDomainRangePop(nvtx_domain());
    pushed_ = false;
  }

 private:
  void push(const char* message) {
    nvtxEventAttributes_t a{};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = message;  // copied by the tool during the call
    nvtxDomainRangePushEx(nvtx_domain(), &a);
    pushed_ = true;
  }
  bool pushed_ = false;
};

}  // namespace nvtx_on
#else
inline namespace nvtx_off {

inline bool nvtx_enabled() { return false; }

class NvtxRange {
 public:
  explicit NvtxRange(const char*) {}
  NvtxRange(const char*, const std::string&) {}
  NvtxRange(const char*, long long) {}
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
  void next(const char*) {}
  void end() {}
};

}  // namespace nvtx_off
#endif

}  // namespace st

#define ST_NVTX_CONCAT_(a, b) a##b
#define ST_NVTX_CONCAT(a, b) ST_NVTX_CONCAT_(a, b)
// A range from here to the end of the enclosing scope.
#define ST_NVTX_RANGE(...) ::st::NvtxRange ST_NVTX_CONCAT(st_nvtx_range_, __COUNTER__)(__VA_ARGS__)

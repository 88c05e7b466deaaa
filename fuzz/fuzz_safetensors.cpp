// libFuzzer target for the safetensors header parser (and the index parser, which
// reads the same kind of untrusted JSON). An st::Error is the expected rejection;
// a crash, a sanitizer report, any other exception, or a broken invariant on an
// accepted input is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "io/safetensors.h"

namespace {

// What acceptance promises to callers: spans inside the buffer, tiling the data area
// in order, each exactly shape x dtype bytes.
void check_accepted(const st::SafetensorsHeader& h, const uint8_t* data, size_t size) {
  if (h.data_start + h.data_size != size) __builtin_trap();
  uint64_t pos = 0;
  for (const auto& t : h.tensors) {
    if (t.begin != pos || t.end < t.begin || t.end > h.data_size) __builtin_trap();
    if (t.numel() * st::dtype_size(t.dtype) != t.nbytes()) __builtin_trap();
    pos = t.end;
    // Touch every byte, so that ASan sees any span reaching past the buffer.
    if (t.dtype != st::DType::I32 && t.dtype != st::DType::I64)
      (void)st::to_f32(data + h.data_start + t.begin, t.dtype, t.numel(), t.name);
  }
  if (pos != h.data_size) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    check_accepted(st::parse_safetensors_header(data, size, "fuzz"), data, size);
  } catch (const st::Error&) {
  }
  try {
    (void)st::parse_safetensors_index(std::string(reinterpret_cast<const char*>(data), size),
                                      "fuzz");
  } catch (const st::Error&) {
  }
  return 0;
}

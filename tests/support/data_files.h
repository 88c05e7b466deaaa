// Files for the data room's tests (tests/data/): the shared scratch directories, file
// and error helpers (temp_dir.h, files.h, errors.h), files patched in place, and `data
// prepare` options with a byte-level encoder (id = byte, eos = 256), so that prepared
// directories can be made without a real tokenizer.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"
#include "data/prepare.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/temp_dir.h"

namespace st::testing {

// Overwrites n bytes of `p` at `offset`.
inline void patch(const std::filesystem::path& p, size_t offset, const void* bytes, size_t n) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(n));
}

// Options for preparing `inputs` into `out` with the byte-level encoder.
inline PrepareOptions byte_options(const std::filesystem::path& out, std::vector<std::string> inputs) {
  PrepareOptions o;
  o.inputs = std::move(inputs);
  o.out = out.string();
  o.encode = [](std::string_view s) {
    std::vector<int32_t> ids;
    for (unsigned char c : s) ids.push_back(c);
    return ids;
  };
  o.tokenizer = "bytes";
  o.tokenizer_dir = "/nowhere";
  o.vocab_size = 257;
  o.eos_id = 256;
  return o;
}

}  // namespace st::testing

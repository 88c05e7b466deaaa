// Files for the data room's tests (tests/data/): a scratch directory per test and
// process, removed when the process ends; whole files read, written and patched in
// place; the message of the st::Error a call throws; and `data prepare` options with a
// byte-level encoder (id = byte, eos = 256), so that prepared directories can be made
// without a real tokenizer.
#pragma once
#include <unistd.h>

#include <gtest/gtest.h>

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

namespace st::testing {

// Removes the test directories when the process ends.
class TempDirs : public ::testing::Environment {
 public:
  static std::vector<std::filesystem::path>& made() {
    static std::vector<std::filesystem::path> v;
    return v;
  }
  void TearDown() override {
    std::error_code ec;
    for (const auto& p : made()) std::filesystem::remove_all(p, ec);
  }
};
inline const auto* const kTempDirs = ::testing::AddGlobalTestEnvironment(new TempDirs);

// An empty directory named after `name`.
inline std::filesystem::path temp_dir(const std::string& name) {
  namespace fs = std::filesystem;
  // One directory per process: ctest runs the tests of a file in parallel.
  fs::path p = fs::path(::testing::TempDir()) / ("st_data_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  TempDirs::made().push_back(p);
  return p;
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Writes `s` to `p`, making its directory first.
inline void spit(const std::filesystem::path& p, const std::string& s) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << s;
}

// Overwrites n bytes of `p` at `offset`.
inline void patch(const std::filesystem::path& p, size_t offset, const void* bytes, size_t n) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(n));
}

// The message of the st::Error that f throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Expects `f` to throw st::Error whose message holds every one of `parts`.
template <class F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << "\nmissing: " << p;
  }
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

// Scratch paths for tests, under gtest's TempDir(): st_<pid>_<name>. The pid keeps test
// processes that run side by side (ctest -j) apart; the name keeps the tests of one
// process apart and ends the path as given (a ".npy" stays the extension). A directory
// is emptied when a test asks for it, not removed afterwards: a failed test's files
// stay for a look.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace st::testing {

// The path alone: nothing is created or removed (for naming again what a test made).
inline std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::path(::testing::TempDir()) / ("st_" + std::to_string(::getpid()) + "_" + name);
}

// temp_path(name) with nothing there: for a file, or a directory the code under test
// must create itself.
inline std::filesystem::path fresh_path(const std::string& name) {
  const std::filesystem::path p = temp_path(name);
  std::filesystem::remove_all(p);
  return p;
}

// temp_path(name) as a new, empty directory.
inline std::filesystem::path temp_dir(const std::string& name) {
  const std::filesystem::path p = fresh_path(name);
  std::filesystem::create_directories(p);
  return p;
}

}  // namespace st::testing

// Scratch paths for tests, under gtest's TempDir(): st_<pid>_<name>. The pid keeps test
// processes that run side by side (ctest -j) apart; the name keeps the tests of one
// process apart and ends the path as given (a ".npy" stays the extension). A directory
// is emptied when a test asks for it. What a test named is removed when the test
// passes (what is named outside a test, when the whole program passes); a failed
// test's files stay for a look.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <set>
#include <string>

namespace st::testing {

// The paths temp_path named: those of the running test, and those named outside any
// test (a suite's set-up), each removed once it is known that nothing failed.
class TempPaths : public ::testing::EmptyTestEventListener {
 public:
  static TempPaths& get() {
    static TempPaths* const paths = [] {
      auto* p = new TempPaths;  // owned by gtest's listener list once appended
      ::testing::UnitTest::GetInstance()->listeners().Append(p);
      return p;
    }();
    return *paths;
  }
  void note(const std::filesystem::path& p) {
    const std::lock_guard<std::mutex> lock(mu_);
    (::testing::UnitTest::GetInstance()->current_test_info() ? in_test_ : outside_).insert(p);
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    std::set<std::filesystem::path> paths;
    {
      const std::lock_guard<std::mutex> lock(mu_);
      paths.swap(in_test_);
    }
    if (info.result() && !info.result()->Failed()) remove(paths);
  }
  void OnTestProgramEnd(const ::testing::UnitTest& unit) override {
    if (unit.Passed()) remove(outside_);
  }

 private:
  static void remove(const std::set<std::filesystem::path>& paths) {
    std::error_code ec;  // best effort: a path a child process still holds stays
    for (const auto& p : paths) std::filesystem::remove_all(p, ec);
  }
  std::mutex mu_;
  std::set<std::filesystem::path> in_test_, outside_;
};

// The path alone: nothing is created or removed (for naming again what a test made).
inline std::filesystem::path temp_path(const std::string& name) {
  const std::filesystem::path p =
      std::filesystem::path(::testing::TempDir()) / ("st_" + std::to_string(::getpid()) + "_" + name);
  TempPaths::get().note(p);
  return p;
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

#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "core/error.h"
#include "data/source.h"
#include "support/data_files.h"

namespace st {
namespace {
namespace fs = std::filesystem;

Batch make(int B, int T) {
  Batch b;
  b.B = B;
  b.T = T;
  return b;
}

TEST(RandomSource, DeterministicInRangeAndShifted) {
  auto src = make_random_source(1000, 5);
  Batch a = make(3, 16), b = make(3, 16), c = make(3, 16);
  src->fill(a, {2, 0, 1, 0, 1});
  src->fill(b, {2, 0, 1, 0, 1});
  src->fill(c, {3, 0, 1, 0, 1});
  EXPECT_EQ(a.inputs, b.inputs);
  EXPECT_NE(a.inputs, c.inputs);
  for (int r = 0; r < 3; ++r)
    for (int t = 0; t + 1 < 16; ++t) EXPECT_EQ(a.targets[r * 16 + t], a.inputs[r * 16 + t + 1]);
  for (int32_t id : a.inputs) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 1000);
  }
  // A different seed gives different data.
  Batch d = make(3, 16);
  make_random_source(1000, 6)->fill(d, {2, 0, 1, 0, 1});
  EXPECT_NE(a.inputs, d.inputs);
}

TEST(RandomSource, GlobalBatchIsTheSameAtAnyWorldSize) {
  // One rank with 4 micro-batches of 2 == two ranks with 2 micro-batches of 2 each
  // == four ranks with one micro-batch each: the same 8 sequences.
  auto src = make_random_source(97, 1);
  std::multiset<std::vector<int32_t>> one, two, four;
  auto rows = [](const Batch& b, std::multiset<std::vector<int32_t>>& out) {
    for (int r = 0; r < b.B; ++r) out.insert({b.inputs.begin() + r * b.T, b.inputs.begin() + (r + 1) * b.T});
  };
  for (int m = 0; m < 4; ++m) {
    Batch b = make(2, 8);
    src->fill(b, {5, m, 4, 0, 1});
    rows(b, one);
  }
  for (int rank = 0; rank < 2; ++rank)
    for (int m = 0; m < 2; ++m) {
      Batch b = make(2, 8);
      src->fill(b, {5, m, 2, rank, 2});
      rows(b, two);
    }
  for (int rank = 0; rank < 4; ++rank) {
    Batch b = make(2, 8);
    src->fill(b, {5, 0, 1, rank, 4});
    rows(b, four);
  }
  EXPECT_EQ(one, two);
  EXPECT_EQ(one, four);
}

class TextSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // One directory per process: ctest runs the tests of this fixture in parallel.
    dir = fs::path(::testing::TempDir()) / ("st_text_source_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir / "sub");
    std::ofstream(dir / "a.txt") << "abcdefghijklmnopqrstuvwxyz";
    std::ofstream(dir / "sub" / "b.txt") << "0123456789";
  }
  void TearDown() override { fs::remove_all(dir); }
  fs::path dir;
};

TEST_F(TextSourceTest, WindowsComeFromTheCorpus) {
  auto src = make_text_source({dir.string()}, 256, 3, 8);
  EXPECT_NE(src->describe().find("2 files"), std::string::npos) << src->describe();
  const std::string corpus = "abcdefghijklmnopqrstuvwxyz\n0123456789\n";
  Batch b = make(4, 8);
  src->fill(b, {0, 0, 1, 0, 1});
  for (int r = 0; r < 4; ++r) {
    std::string in, tg;
    for (int t = 0; t < 8; ++t) in += static_cast<char>(b.inputs[r * 8 + t]), tg += static_cast<char>(b.targets[r * 8 + t]);
    const size_t at = corpus.find(in);
    ASSERT_NE(at, std::string::npos) << in;
    EXPECT_EQ(corpus.substr(at + 1, 8), tg);
  }
}

TEST_F(TextSourceTest, ClearErrors) {
  try {
    make_text_source({(dir / "missing").string()}, 256, 1, 8);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_text_source({dir.string()}, 100, 1, 8), Error);   // vocab too small for bytes
  EXPECT_THROW(make_text_source({dir.string()}, 256, 1, 100), Error);  // corpus shorter than a sequence
}

template <class F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no error thrown";
  return Error("");
}

// A symbolic link loop is named as one, with the link, not reported as a missing file
// 40 directories deep; a data error (exit 3).
TEST_F(TextSourceTest, SymbolicLinkLoopsAreNamed) {
  fs::create_directory_symlink(dir, dir / "sub" / "back");  // sub/back -> the top: a cycle
  Error e = error_of([&] { make_text_source({dir.string()}, 256, 1, 8); });
  std::string msg = e.what();
  EXPECT_NE(msg.find("'" + (dir / "sub" / "back").string() + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("symbolic link loop"), std::string::npos) << msg;
  EXPECT_NE(msg.find("back to '" + fs::canonical(dir).string() + "'"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("does not exist"), std::string::npos) << msg;
  EXPECT_EQ(e.kind(), ErrorKind::Data);
  fs::remove(dir / "sub" / "back");

  fs::create_symlink(dir / "self", dir / "self");  // a link to itself: ELOOP from the system
  e = error_of([&] { make_text_source({dir.string()}, 256, 1, 8); });
  msg = e.what();
  EXPECT_NE(msg.find("'" + (dir / "self").string() + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("symbolic link loop"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("does not exist"), std::string::npos) << msg;
  EXPECT_EQ(e.kind(), ErrorKind::Data);
  fs::remove(dir / "self");

  // A link to a sibling directory is no loop: its files are read once.
  fs::create_directory_symlink(dir / "sub", dir / "again");
  EXPECT_NE(make_text_source({dir.string()}, 256, 1, 8)->describe().find("2 files"), std::string::npos);
  // A missing path is a data error too.
  EXPECT_EQ(error_of([&] { make_text_source({(dir / "missing").string()}, 256, 1, 8); }).kind(), ErrorKind::Data);
}

// A directory that `data prepare` wrote, given as text (the default data.source): a
// usage error that says how to train on it, for the directory, a folder holding it,
// and a shard file named on its own. Not its bytes as text.
TEST_F(TextSourceTest, APreparedTokenDirectoryIsNotText) {
  const fs::path tokens = dir / "tokens";
  prepare_token_shards(testing::byte_options(tokens, {(dir / "a.txt").string()}));
  for (const fs::path& p : {tokens, dir, tokens / "shard-00000.bin"}) {
    const Error e = error_of([&] { make_text_source({p.string()}, 256, 1, 8); });
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--data.source=tokens"), std::string::npos) << p << ": " << msg;
    EXPECT_NE(msg.find("prepared tokens"), std::string::npos) << p << ": " << msg;
    EXPECT_EQ(e.kind(), ErrorKind::Usage) << p;
  }
}

}  // namespace
}  // namespace st

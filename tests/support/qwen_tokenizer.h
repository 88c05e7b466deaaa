// The real Qwen2.5 tokenizer for the data room's tests: its files come from ../shared
// (shared/tokenizers/qwen2.5), which is not always there, so every test that needs them
// starts with SKIP_WITHOUT_QWEN() and skips with a message where they are absent.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>

#include "data/tokenizer.h"

namespace st::testing {

inline const std::filesystem::path kQwenDir = std::filesystem::path(SHARDTRAIN_SHARED_DIR) / "tokenizers" / "qwen2.5";

inline bool have_qwen() { return std::filesystem::exists(kQwenDir / "tokenizer.json"); }

// One load for the whole test process (about half a second each).
inline const Tokenizer& qwen() {
  static const Tokenizer t = Tokenizer::load(kQwenDir.string());
  return t;
}

}  // namespace st::testing

#define SKIP_WITHOUT_QWEN()            \
  if (!::st::testing::have_qwen())     \
  GTEST_SKIP() << ::st::testing::kQwenDir.string() << " is absent: the Qwen2.5 tokenizer files are not here"

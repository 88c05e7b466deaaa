// libFuzzer target for prepared token data (`shardtrain data prepare`'s output): the
// token-shard reader (st::TokenShard::open: the 64-byte header and the ids) and
// index.json (st::read_token_index, st::TokenDataset::open). The input is a prepared
// directory, its files joined by "\n%%\n" lines:
//   index.json %% shard-00000.bin %% shard-00001.bin ...
// Each shard is also opened alone, with and without a vocab limit and the checksum.
// An st::Error is the expected rejection; a crash, a sanitizer report, any other
// exception, or an accepted shard or directory that breaks what acceptance promises
// (sizes agree, every id below the vocabulary, the whole stream readable) is a bug.
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "data/token_shards.h"
#include "fuzz_util.h"

namespace {

void check_shard(const st::TokenShard& s, uint64_t file_bytes, int64_t limit, bool verified) {
  if (s.size() * 4 + st::kTokenShardHeaderBytes != file_bytes || s.vocab_size() == 0) __builtin_trap();
  const uint64_t bound = limit > 0 ? std::min<uint64_t>(limit, s.vocab_size()) : s.vocab_size();
  for (uint64_t i = 0; i < s.size(); ++i)
    if (static_cast<uint32_t>(s.at(i)) >= bound) __builtin_trap();
  if (verified && s.compute_checksum() != s.checksum()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fuzz::split_parts(data, size);
  const std::string dir = fuzz::scratch_dir() + "/tokens";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir);
  fuzz::write_file(dir + "/" + st::kTokenIndexName, parts[0]);
  for (size_t i = 1; i < parts.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "/shard-%05zu.bin", i - 1);
    const std::string path = dir + name;
    fuzz::write_file(path, parts[i]);
    for (const int64_t limit : {int64_t{0}, int64_t{300}})
      for (const bool verify : {false, true}) {
        try {
          check_shard(st::TokenShard::open(path, limit, verify), parts[i].size(), limit, verify);
        } catch (const st::Error& e) {
          fuzz::rejected(e);
        }
      }
  }
  try {
    const st::TokenIndex x = st::read_token_index(dir);
    if (x.vocab_size <= 0 || x.eos_id < 0 || x.eos_id >= x.vocab_size) __builtin_trap();
    for (const auto& s : x.shards)
      if (s.file.empty() || s.file.find('/') != std::string::npos || s.file == "." || s.file == "..")
        __builtin_trap();
  } catch (const st::Error& e) {
    fuzz::rejected(e);
  }
  for (const bool verify : {false, true}) {
    try {
      const st::TokenDataset d = st::TokenDataset::open(dir, 0, verify);
      uint64_t total = 0;
      for (size_t i = 0; i < d.shards.size(); ++i) {
        if (d.shards[i].size() != d.index.shards[i].tokens) __builtin_trap();
        total += d.shards[i].size();
      }
      if (total != d.index.tokens || total != d.tokens()) __builtin_trap();
      const std::vector<int32_t> all = d.read(0, total);
      for (int32_t id : all)
        if (id < 0 || id >= d.index.vocab_size) __builtin_trap();
    } catch (const st::Error& e) {
      fuzz::rejected(e);
    }
  }
  return 0;
}

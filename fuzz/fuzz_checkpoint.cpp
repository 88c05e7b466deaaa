// libFuzzer target for checkpoint manifests (st::read_checkpoint,
// st::CheckpointManifest::from_json). The input is a checkpoint directory, its files
// joined by "\n%%\n" lines:
//   manifest.json %% shard-00000-of-0000N.safetensors %% ...     (N = the parts after the manifest)
// read_checkpoint runs with and without hash verification. An st::Error is the
// expected rejection; a crash, a sanitizer report, any other exception, or an
// accepted manifest that breaks what acceptance promises is a bug: values in range,
// every listed file a plain name inside the checkpoint directory with the listed size
// (and hash), and to_json() reading back to the same manifest.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fuzz_util.h"
#include "io/checkpoint.h"

namespace {

namespace fs = std::filesystem;

void check_manifest(const st::CheckpointManifest& m, const std::string& dir, bool on_disk) {
  if (m.step < 0 || m.shard_world < 1 || m.replicas < 1) __builtin_trap();
  for (const st::CheckpointFile& f : m.files) {
    if (f.name.empty() || f.name.find('/') != std::string::npos || f.name == "." || f.name == "..") __builtin_trap();
    if (on_disk) {
      std::error_code ec;
      if (fs::file_size(fs::path(dir) / f.name, ec) != f.bytes || ec) __builtin_trap();
    }
  }
  const nlohmann::json j = m.to_json();
  if (st::CheckpointManifest::from_json(j, "again").to_json() != j) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fuzz::split_parts(data, size);
  const std::string dir = fuzz::scratch_dir() + "/step-7";
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir);
  fuzz::write_file(dir + "/manifest.json", parts[0]);
  const int world = static_cast<int>(parts.size()) - 1;
  for (int r = 0; r < world; ++r) fuzz::write_file(dir + "/" + st::checkpoint_shard_file(r, world), parts[r + 1]);

  // The manifest alone first, as the JSON it is: an accepted manifest naming a file
  // outside the directory stops here, before read_checkpoint would open it.
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(parts[0]);
  } catch (const nlohmann::json::exception&) {
    return 0;  // read_checkpoint refuses it the same way
  }
  try {
    check_manifest(st::CheckpointManifest::from_json(j, "manifest"), dir, false);
  } catch (const st::Error& e) {
    fuzz::rejected(e);
    return 0;  // read_checkpoint refuses it the same way
  }
  for (const bool verify : {false, true}) {
    try {
      check_manifest(st::read_checkpoint(dir, verify), dir, true);
    } catch (const st::Error& e) {
      fuzz::rejected(e);
    }
  }
  return 0;
}

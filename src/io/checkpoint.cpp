#include "io/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <xxhash.h>

#include "core/error.h"
#include "core/files.h"
#include "io/json_integer.h"

namespace st {
namespace {

namespace fs = std::filesystem;

int step_of(const std::string& name) {
  if (name.rfind("step-", 0) != 0) return -1;
  const std::string n = name.substr(5);
  if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::atoi(n.c_str());
}

}  // namespace

nlohmann::json CheckpointManifest::to_json() const {
  nlohmann::json units_j = nlohmann::json::array(), files_j = nlohmann::json::array();
  for (const CheckpointUnit& u : units)
    units_j.push_back({{"name", u.name}, {"numel", u.numel}, {"padded_numel", u.padded_numel},
                       {"shard_numel", u.shard_numel}});
  for (const CheckpointFile& f : files) files_j.push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh3_128", f.xxh3}});
  nlohmann::json j = {{"format", "shardtrain-checkpoint"},
          {"version", 1},
          {"step", step},
          {"shard_world", shard_world},
          {"replicas", replicas},
          {"units", units_j},
          {"model", model},
          {"seed", seed},
          {"tokens_seen", tokens_seen},
          {"files", files_j},
          {"run_config", run_config}};
  if (!fp8_scaling.is_null()) j["fp8_scaling"] = fp8_scaling;
  return j;
}

CheckpointManifest CheckpointManifest::from_json(const nlohmann::json& j, const std::string& where) {
  try {
    if (j.value("format", "") != "shardtrain-checkpoint")
      fail(where, ": not a shardtrain checkpoint manifest (format '", j.value("format", ""), "')");
    const nlohmann::json version = j.value("version", nlohmann::json(0));
    if (version != 1) fail(where, ": manifest version ", version.dump(), " (this build reads 1)");
    CheckpointManifest m;
    m.step = integer_at<int>(j, "step", where);
    m.shard_world = integer_at<int>(j, "shard_world", where);
    m.replicas = integer_at<int>(j, "replicas", where);
    for (const auto& u : j.at("units"))
      m.units.push_back({u.at("name").get<std::string>(), integer_at<uint64_t>(u, "numel", where),
                         integer_at<uint64_t>(u, "padded_numel", where), integer_at<uint64_t>(u, "shard_numel", where)});
    m.model = j.at("model");
    m.seed = integer_at<uint64_t>(j, "seed", where);
    m.tokens_seen = integer_at<uint64_t>(j, "tokens_seen", where);
    for (const auto& f : j.at("files")) {
      m.files.push_back({f.at("name").get<std::string>(), integer_at<uint64_t>(f, "bytes", where),
                         f.at("xxh3_128").get<std::string>()});
      // read_checkpoint checks these files: only names inside the checkpoint directory.
      const std::string& name = m.files.back().name;
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
        fail(where, ": file name '", name, "' is not a plain name inside the checkpoint directory");
    }
    m.run_config = j.value("run_config", "");
    if (j.contains("fp8_scaling")) m.fp8_scaling = j.at("fp8_scaling");
    if (m.step < 0 || m.shard_world < 1 || m.replicas < 1) fail(where, ": step, shard_world or replicas out of range");
    return m;
  } catch (const nlohmann::json::exception& e) {
    fail(where, ": malformed manifest: ", e.what());
  }
}

std::string checkpoint_shard_file(int shard_rank, int shard_world) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard-%05d-of-%05d.safetensors", shard_rank, shard_world);
  return buf;
}

std::string checkpoint_step_dir(const std::string& dir, int step) {
  return (fs::path(dir) / ("step-" + std::to_string(step))).string();
}

std::string file_xxh3(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail(path, ": cannot read: ", std::strerror(errno));
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  std::vector<char> buf(8 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) XXH3_128bits_update(state, buf.data(), n);
  const bool bad = std::ferror(f);
  std::fclose(f);
  const XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  if (bad) fail(path, ": read error");
  char hex[40];
  std::snprintf(hex, sizeof hex, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return hex;
}

void commit_checkpoint(const std::string& tmp_dir, const CheckpointManifest& m) {
  ST_CHECK(tmp_dir.size() > 4 && tmp_dir.compare(tmp_dir.size() - 4, 4, ".tmp") == 0, "checkpoint: '", tmp_dir,
           "' does not end in .tmp");
  for (const CheckpointFile& f : m.files) fsync_path((fs::path(tmp_dir) / f.name).string(), false);
  write_text_atomic((fs::path(tmp_dir) / "manifest.json").string(), m.to_json().dump(1) + "\n");
  fsync_path(tmp_dir, true);
  const std::string final_dir = tmp_dir.substr(0, tmp_dir.size() - 4);
  std::error_code ec;
  if (fs::exists(final_dir)) fs::remove_all(final_dir, ec);  // a step saved again (a rerun from an older one)
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) fail("checkpoint: cannot rename ", tmp_dir, " to ", final_dir, ": ", ec.message());
  const std::string parent = fs::path(final_dir).parent_path().string();
  fsync_path(parent, true);
  write_text_atomic((fs::path(parent) / "latest").string(), fs::path(final_dir).filename().string() + "\n");
  fsync_path(parent, true);
}

std::optional<std::string> find_latest_checkpoint(const std::string& dir, std::vector<std::string>* passed_over) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::nullopt;
  auto complete = [](const fs::path& p) { return fs::is_regular_file(p / "manifest.json"); };
  std::vector<std::pair<int, fs::path>> steps;  // every step-N directory
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int s = step_of(e.path().filename().string());
    if (s >= 0 && e.is_directory(ec)) steps.emplace_back(s, e.path());
  }
  std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::optional<std::string> found;
  int found_step = -1;
  std::ifstream latest(fs::path(dir) / "latest");
  std::string name;
  if (latest >> name && step_of(name) >= 0 && complete(fs::path(dir) / name)) {
    found = (fs::path(dir) / name).string();
    found_step = step_of(name);
  } else {
    for (const auto& [s, p] : steps)
      if (complete(p)) {
        found = checkpoint_step_dir(dir, s);
        found_step = s;
        break;
      }
  }
  if (passed_over)
    for (const auto& [s, p] : steps)
      if (s > found_step && !complete(p)) passed_over->push_back(p.string());
  return found;
}

static CheckpointManifest read_checkpoint_unclassified(const std::string& step_dir, bool verify_hashes) {
  const std::string mpath = (fs::path(step_dir) / "manifest.json").string();
  std::ifstream in(mpath);
  if (!in) fail(step_dir, ": no manifest.json (an incomplete or foreign checkpoint)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail(mpath, ": not valid JSON: ", e.what());
  }
  CheckpointManifest m = CheckpointManifest::from_json(j, mpath);
  for (const CheckpointFile& f : m.files) {
    const fs::path p = fs::path(step_dir) / f.name;
    std::error_code ec;
    const uint64_t size = fs::file_size(p, ec);
    if (ec) fail(p.string(), ": missing (listed in ", mpath, ")");
    if (size != f.bytes) fail(p.string(), ": ", size, " bytes, the manifest says ", f.bytes, " (truncated or replaced)");
    if (verify_hashes) {
      const std::string h = file_xxh3(p.string());
      if (h != f.xxh3) fail(p.string(), ": XXH3-128 ", h, " differs from the manifest's ", f.xxh3, " (corrupt)");
    }
  }
  return m;
}

CheckpointManifest read_checkpoint(const std::string& step_dir, bool verify_hashes) {
  // A checkpoint that is incomplete, damaged or malformed is a data error (exit 3).
  return classify_errors(ErrorKind::Data, [&] { return read_checkpoint_unclassified(step_dir, verify_hashes); });
}

void prune_checkpoints(const std::string& dir, int keep) {
  std::error_code ec;
  std::vector<std::pair<int, fs::path>> done;
  auto stale = [](const std::string& name, const std::string& suffix) {  // step-N<suffix>
    return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
           step_of(name.substr(0, name.size() - suffix.size())) >= 0;
  };
  std::vector<fs::path> entries;
  for (const auto& e : fs::directory_iterator(dir, ec)) entries.push_back(e.path());
  for (const fs::path& p : entries) {
    const std::string name = p.filename().string();
    if (stale(name, ".tmp") || stale(name, ".deleting")) {
      fs::remove_all(p, ec);  // a save that was killed, or a removal that was
      continue;
    }
    const int s = step_of(name);
    if (s >= 0 && fs::is_regular_file(p / "manifest.json")) done.emplace_back(s, p);
  }
  std::sort(done.begin(), done.end());
  for (size_t i = 0; keep > 0 && i + static_cast<size_t>(keep) < done.size(); ++i) {
    // Out of the way first (one rename, which a kill cannot cut in half), then removed.
    fs::path gone = done[i].second;
    gone += ".deleting";
    fs::remove_all(gone, ec);
    fs::rename(done[i].second, gone, ec);
    if (ec) continue;  // left complete, tried again at the next save
    fs::remove_all(gone, ec);
  }
}

}  // namespace st

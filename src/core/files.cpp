#include "core/files.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace st {

void fsync_path(const std::string& path, bool dir) {
  const int fd = ::open(path.c_str(), dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) fail(path, ": cannot open to fsync: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail(path, ": fsync failed: ", std::strerror(err));
}

void check_output_file(const std::string& path, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  ST_CHECK_CONFIG(!path.empty(), what, ": no file name given");
  const auto st = fs::status(path, ec);
  if (fs::exists(st)) {
    ST_CHECK_CONFIG(!fs::is_directory(st), what, " '", path, "' is a directory; give a file name");
    ST_CHECK_CONFIG(fs::is_regular_file(st), what, " '", path, "' exists and is not a regular file");
  }
  const fs::path parent = fs::absolute(path, ec).parent_path();
  ST_CHECK_CONFIG(fs::is_directory(parent, ec), what, " '", path, "': the directory '", parent.string(),
                  "' does not exist");
  ST_CHECK_CONFIG(::access(parent.c_str(), W_OK | X_OK) == 0, what, " '", path, "': the directory '",
                  parent.string(), "' is not writable (", std::strerror(errno), ")");
}

void replace_directory(const std::string& dir, const std::string& what,
                       const std::function<void(const std::string& stage)>& write) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path final_dir = fs::absolute(dir, ec).lexically_normal();
  const std::string stage = final_dir.string() + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(stage, ec);
  fs::create_directories(stage, ec);
  ST_CHECK(!ec, what, ": cannot create '", stage, "': ", ec.message());
  try {
    write(stage);
    fsync_path(stage, true);
  } catch (...) {
    fs::remove_all(stage, ec);
    throw;
  }
  const std::string old = final_dir.string() + ".old-" + std::to_string(::getpid());
  const bool had = fs::exists(final_dir, ec);
  if (had) {
    fs::rename(final_dir, old, ec);
    if (ec) {
      const std::string msg = ec.message();
      fs::remove_all(stage, ec);
      fail(what, ": cannot move the old '", dir, "' aside: ", msg);
    }
  }
  fs::rename(stage, final_dir, ec);
  if (ec) {
    const std::string msg = ec.message();
    if (had) fs::rename(old, final_dir, ec);
    fs::remove_all(stage, ec);
    fail(what, ": cannot move '", stage, "' to '", dir, "': ", msg);
  }
  if (had) fs::remove_all(old, ec);
  if (final_dir.has_parent_path()) {
    try {
      fsync_path(final_dir.parent_path().string(), true);
    } catch (const Error&) {  // the rename is done; a directory that cannot be fsynced is not an error
    }
  }
}

void write_text_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) fail(tmp, ": cannot write: ", std::strerror(errno));
  try {
    out << text;
    out.flush();
    if (!out) fail(tmp, ": write failed (disk full?)");
    out.close();
    fsync_path(tmp, false);
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      fail(path, ": cannot rename ", tmp, " into place: ", std::strerror(errno));
  } catch (...) {
    // A failed write leaves nothing behind: not the partial file under its .tmp name.
    ::unlink(tmp.c_str());
    throw;
  }
}

bool path_within(const std::string& path, const std::string& dir) {
  const std::filesystem::path p(path), d(dir);
  auto c = p.begin();
  for (const std::filesystem::path& part : d) {
    if (part.empty()) continue;  // a trailing separator
    if (c == p.end() || *c != part) return false;
    ++c;
  }
  return true;
}

void clean_stale_stages(const std::string& dir, std::vector<std::string>& removed, std::vector<std::string>& live) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path final_dir = fs::absolute(dir, ec).lexically_normal();
  const fs::path parent = final_dir.parent_path();
  const std::string prefix = final_dir.filename().string() + ".tmp-";
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) continue;
    found.push_back(e.path());
  }
  std::sort(found.begin(), found.end());
  for (const fs::path& p : found) {
    const long pid = std::stol(p.filename().string().substr(prefix.size()));
    if (pid == ::getpid() || !fs::is_directory(fs::symlink_status(p, ec))) continue;
    // Alive: kill(pid, 0) succeeds, or fails only for want of permission.
    if (pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM)) {
      live.push_back(p.string());
      continue;
    }
    fs::remove_all(p, ec);
    if (!ec) removed.push_back(p.string());
  }
}

}  // namespace st

#include "train/run_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <thread>

#include "core/error.h"
#include "core/log.h"

namespace st {
namespace {

namespace fs = std::filesystem;

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

// "pid 4242 on host node-3, since 2026-12-03 10:00:00 UTC"
std::string holder_line() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &utc);
  return "pid " + std::to_string(::getpid()) + " on host " + host_name() + ", since " + when;
}

// What the holder wrote into the lock file: its first line. It writes right after
// locking, so a reader that comes in between waits for it a little.
std::string read_holder(int fd) {
  for (int i = 0; i < 50; ++i) {
    char buf[512];
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    if (n > 0) {
      std::string s(buf, static_cast<size_t>(n));
      if (const size_t nl = s.find('\n'); nl != std::string::npos) return s.substr(0, nl);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return "a process that has not written its pid";
}

bool same_file(int fd, const std::string& path) {
  struct stat a {}, b {};
  return ::fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

}  // namespace

RunDirLock::RunDirLock(const std::string& dir, const std::string& what) : dir_(dir) {
  const std::string path = (fs::path(dir) / kRunDirLockName).string();
  // A run that ends removes the directory it created when it holds only the lock file
  // (see the destructor): the file or the directory may vanish between our steps, and
  // a lock taken on a file already unlinked locks nothing. Try again then.
  for (int attempt = 0;; ++attempt) {
    std::error_code ec;
    const auto st = fs::status(dir, ec);
    if (!fs::exists(st)) {
      const bool made = fs::create_directories(dir, ec);
      ST_CHECK(!ec, what, ": cannot create '", dir, "': ", ec.message());
      created_dir_ = created_dir_ || made;
    } else {
      ST_CHECK(fs::is_directory(st), what, ": '", dir, "' exists and is not a directory");
    }
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      const int err = errno;
      if (err == ENOENT && attempt < 100) continue;
      fail(what, ": cannot open the lock file '", path, "': ", std::strerror(err));
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) {
        const std::string holder = read_holder(fd);
        ::close(fd);
        fail_config(what, " '", dir, "' is in use by another run (", holder, "; its lock file is ", path,
                    "): wait for that run to end or stop it, or choose another ", what);
      }
      ::close(fd);
      if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS || err == EINVAL) {
        log_warn(what + " '" + dir + "': the file system does not lock files (" + std::strerror(err) +
                 "); a second run started in this directory at the same time would not be refused");
        return;
      }
      fail(what, ": cannot lock '", path, "': ", std::strerror(err));
    }
    if (!same_file(fd, path)) {  // unlinked by a run that ended between our open and flock
      ::close(fd);
      ST_CHECK(attempt < 100, what, ": cannot lock '", path, "': it keeps being replaced");
      continue;
    }
    fd_ = fd;
    break;
  }
  const std::string line = holder_line() + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size()))
    log_warn(what + ": cannot write this run's pid into '" + path + "': " + std::strerror(errno));
}

RunDirLock::~RunDirLock() {
  if (fd_ < 0) return;
  if (created_dir_) {
    // Still locked: no other run can be using the directory while it goes.
    std::error_code ec;
    bool only_lock = true;
    for (const auto& e : fs::directory_iterator(dir_, ec))
      if (e.path().filename() != kRunDirLockName) only_lock = false;
    if (!ec && only_lock) {
      fs::remove(fs::path(dir_) / kRunDirLockName, ec);
      if (!ec) fs::remove(dir_, ec);
    }
  }
  ::close(fd_);  // releases the lock
}

}  // namespace st

// One run at a time in a run directory: an exclusive flock(2) on `<dir>/.lock`, held
// for the life of the process that took it and released by the kernel when that
// process ends, however it ends (a SIGKILL included), so a lock is never stale. The
// holder writes its pid, host and start time into the file after locking, so that a
// run refused the lock can name it.
#pragma once
#include <string>

namespace st {

inline constexpr const char* kRunDirLockName = ".lock";

class RunDirLock {
 public:
  // Creates `dir` when it does not exist (an error naming `what`, exit 1, when it
  // cannot be) and locks it. A directory locked by another process is a usage error
  // (exit 2) naming that process: "<what> '<dir>' is in use by another run (pid P on
  // host H, since T; ...)". A file system without flock support (some network file
  // systems) gets a warning and no lock.
  RunDirLock(const std::string& dir, const std::string& what);
  // Unlocks. A directory this lock created that still holds nothing but the lock file
  // (the run stopped before writing anything) is removed again.
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

  bool locked() const { return fd_ >= 0; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  int fd_ = -1;
  bool created_dir_ = false;
};

}  // namespace st

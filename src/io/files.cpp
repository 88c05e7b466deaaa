#include "io/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
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

void write_text_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail(tmp, ": cannot write: ", std::strerror(errno));
    out << text;
    out.flush();
    if (!out) fail(tmp, ": write failed (disk full?)");
  }
  fsync_path(tmp, false);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail(path, ": cannot rename ", tmp, " into place: ", std::strerror(errno));
}

}  // namespace st

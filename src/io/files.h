// Small files written so that a reader sees the old content or the new, never a part:
// path.tmp, fsync, rename, with every error checked and naming the path.
#pragma once
#include <string>

namespace st {

void write_text_atomic(const std::string& path, const std::string& text);
// fsync of a file or directory; st::Error naming it on failure.
void fsync_path(const std::string& path, bool directory);

}  // namespace st

// Small files written so that a reader sees the old content or the new, never a part:
// path.tmp, fsync, rename, with every error checked and naming the path.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace st {

void write_text_atomic(const std::string& path, const std::string& text);
// Refuses (a usage error naming `what` and the path) a file path that cannot be
// written: an existing directory or non-regular file, or a directory that does not
// exist or cannot take a new file. For outputs, before the work that produces them.
void check_output_file(const std::string& path, const std::string& what);
// fsync of a file or directory; st::Error naming it on failure.
void fsync_path(const std::string& path, bool directory);

// Writes a whole directory so that a reader sees the old one or the new one, never a
// mix, and no file of the old one survives: write(stage) fills a new directory beside
// `dir` (removed if it throws), which is fsynced and then takes dir's place; the old
// one is moved aside and deleted. Errors start with `what` ("export: ...").
void replace_directory(const std::string& dir, const std::string& what,
                       const std::function<void(const std::string& stage)>& write);

// The stage directories (<dir>.tmp-<pid>) that a replace_directory of `dir` killed
// half way (kill -9) left beside it, other than this process's own: those whose process
// no longer runs on this host are removed and listed in `removed`; those of a process
// that still runs are left, and listed in `live`. (A pid is this host's: a stage that
// another host's process writes on a shared file system looks dead here.)
void clean_stale_stages(const std::string& dir, std::vector<std::string>& removed, std::vector<std::string>& live);

// Whether `path` is `dir` or lies below it, component by component (a trailing
// separator of `dir` ignored). Nothing is resolved: give both canonical.
bool path_within(const std::string& path, const std::string& dir);

}  // namespace st

// One exception type for every failure a user can cause or see. The message carries
// its own context (file, key, tensor, rank) so the CLI can print it as is, and its
// kind says which exit code the process ends with (docs/operations.md, "Errors and
// exit codes"):
//   0   success
//   1   runtime / I/O: a write failed, the disk is full, not enough memory (kind Runtime,
//       every st::Error not classified otherwise)
//   2   usage / configuration: a bad command line, config key or value (kind Usage)
//   3   input data or model files: corrupt or malformed safetensors, config.json,
//       .npy, token files or shards, checkpoints (kind Data)
//   4   distributed: rendezvous, a peer unreachable or gone, a foreign job, NCCL/Gloo
//       (kind Distributed)
//   70  internal error: an exception that is not an st::Error (a bug; EX_SOFTWARE)
//   128 + N  stopped by signal N (st::Interrupted)
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace st {

enum class ErrorKind { Runtime, Usage, Data, Distributed };

// The exit codes above.
inline constexpr int kExitOk = 0;
inline constexpr int kExitRuntime = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitData = 3;
inline constexpr int kExitDistributed = 4;
inline constexpr int kExitInternal = 70;

inline int exit_code(ErrorKind k) {
  switch (k) {
    case ErrorKind::Usage: return kExitUsage;
    case ErrorKind::Data: return kExitData;
    case ErrorKind::Distributed: return kExitDistributed;
    default: return kExitRuntime;
  }
}

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, ErrorKind kind = ErrorKind::Runtime)
      : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// A run stopped by a signal (SIGTERM, SIGINT) after saving what it could: the CLI
// exits with 128 + signal, as a process killed by it would.
class Interrupted : public Error {
 public:
  Interrupted(const std::string& what, int signal) : Error(what), signal_(signal) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  return os.str();
}

template <class... Parts>
[[noreturn]] void fail_as(ErrorKind kind, Parts&&... parts) {
  throw Error(concat(std::forward<Parts>(parts)...), kind);
}

// fail: unclassified (runtime, exit 1). The others classify the error by its cause.
template <class... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  fail_as(ErrorKind::Runtime, std::forward<Parts>(parts)...);
}
template <class... Parts>
[[noreturn]] void fail_config(Parts&&... parts) {
  fail_as(ErrorKind::Usage, std::forward<Parts>(parts)...);
}
template <class... Parts>
[[noreturn]] void fail_data(Parts&&... parts) {
  fail_as(ErrorKind::Data, std::forward<Parts>(parts)...);
}
template <class... Parts>
[[noreturn]] void fail_dist(Parts&&... parts) {
  fail_as(ErrorKind::Distributed, std::forward<Parts>(parts)...);
}

// Runs f(); an unclassified st::Error it throws becomes one of `kind` (a file reader
// whose every check is about the file's content, say). Classified errors pass as they are.
template <class F>
decltype(auto) classify_errors(ErrorKind kind, F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const Interrupted&) {
    throw;
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::Runtime) throw;
    throw Error(e.what(), kind);
  }
}

}  // namespace st

// ST_CHECK(cond, parts...) throws st::Error built from parts when cond is false;
// ST_CHECK_CONFIG / _DATA / _DIST throw one of that kind.
#define ST_CHECK(cond, ...)          \
  do {                               \
    if (!(cond)) ::st::fail(__VA_ARGS__); \
  } while (0)
#define ST_CHECK_CONFIG(cond, ...)                  \
  do {                                              \
    if (!(cond)) ::st::fail_config(__VA_ARGS__);    \
  } while (0)
#define ST_CHECK_DATA(cond, ...)                  \
  do {                                            \
    if (!(cond)) ::st::fail_data(__VA_ARGS__);    \
  } while (0)
#define ST_CHECK_DIST(cond, ...)                  \
  do {                                            \
    if (!(cond)) ::st::fail_dist(__VA_ARGS__);    \
  } while (0)

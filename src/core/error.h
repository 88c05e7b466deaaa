// One exception type for every failure a user can cause or see. The message carries
// its own context (file, key, tensor, rank) so the CLI can print it as is.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace st {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
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
[[noreturn]] void fail(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  throw Error(os.str());
}

}  // namespace st

// ST_CHECK(cond, parts...) throws st::Error built from parts when cond is false.
#define ST_CHECK(cond, ...)          \
  do {                               \
    if (!(cond)) ::st::fail(__VA_ARGS__); \
  } while (0)

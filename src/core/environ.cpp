#include "core/environ.h"

extern char** environ;

namespace st {

std::map<std::string, std::string> environ_map() {
  std::map<std::string, std::string> env;
  for (char** p = environ; p && *p; ++p) {
    const std::string kv = *p;
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

}  // namespace st

// The process environment as a map (a snapshot; later setenv calls are not seen).
#pragma once
#include <map>
#include <string>

namespace st {

std::map<std::string, std::string> environ_map();

}  // namespace st

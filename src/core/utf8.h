// UTF-8 checks that any room may need (the run configuration refuses text that is not
// UTF-8; the tokenizer builds on the same rules).
#pragma once
#include <string>
#include <string_view>

namespace st {

// `bytes` with every maximal ill-formed UTF-8 subsequence replaced by U+FFFD, as
// Python's bytes.decode("utf-8", errors="replace") does; valid input comes back as is.
std::string utf8_replace_invalid(std::string_view bytes);

}  // namespace st

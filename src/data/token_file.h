// Token ids given by a user for scoring: a .npy of int32/int64 (1-D: one sequence;
// 2-D: one sequence per row) or a text file of integers, one sequence per line
// (blank lines and lines starting with '#' are skipped).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace st {

// Every id must lie in [0, vocab_size) and every sequence hold at least 2 and at most
// max_len tokens; errors name the file, the sequence (line) and the position.
std::vector<std::vector<int32_t>> read_token_sequences(const std::string& path, int vocab_size, int max_len);

}  // namespace st

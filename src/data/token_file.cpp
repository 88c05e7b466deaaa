#include "data/token_file.h"

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/npy.h"

namespace st {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void check_id(int64_t id, int vocab, const std::string& path, const std::string& where, size_t pos) {
  ST_CHECK_DATA(id >= 0 && id < vocab, path, ": ", where, ", position ", pos, ": token id ", id, " is outside [0, ",
           vocab, ") of the model's vocabulary");
}

}  // namespace

std::vector<std::vector<int32_t>> read_token_sequences(const std::string& path, int vocab_size, int max_len) {
  std::vector<std::vector<int32_t>> seqs;
  std::vector<std::string> where;  // "sequence i" or "line n", for messages
  if (ends_with(path, ".npy")) {
    const NpyArray a = read_npy(path);
    ST_CHECK_DATA(a.shape.size() == 1 || a.shape.size() == 2, path, ": token ids must be 1-D or 2-D, got ",
             a.shape.size(), " dimensions");
    const std::vector<int64_t> ids = npy_as_int64(a, path);
    const size_t rows = a.shape.size() == 1 ? 1 : static_cast<size_t>(a.shape[0]);
    const size_t cols = a.shape.back();
    for (size_t r = 0; r < rows; ++r) {
      where.push_back("sequence " + std::to_string(r));
      std::vector<int32_t> s(cols);
      for (size_t c = 0; c < cols; ++c) {
        check_id(ids[r * cols + c], vocab_size, path, where.back(), c);
        s[c] = static_cast<int32_t>(ids[r * cols + c]);
      }
      seqs.push_back(std::move(s));
    }
  } else {
    std::ifstream in(path);
    ST_CHECK_DATA(in, path, ": cannot open");
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      const size_t first = line.find_first_not_of(" \t\r");
      if (first == std::string::npos || line[first] == '#') continue;
      where.push_back("line " + std::to_string(n));
      std::istringstream ls(line);
      std::vector<int32_t> s;
      std::string tok;
      while (ls >> tok) {
        size_t used = 0;
        long long id = 0;
        try {
          id = std::stoll(tok, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        ST_CHECK_DATA(used == tok.size(), path, ": line ", n, ", position ", s.size(), ": '", tok,
                 "' is not an integer token id");
        check_id(id, vocab_size, path, where.back(), s.size());
        s.push_back(static_cast<int32_t>(id));
      }
      seqs.push_back(std::move(s));
    }
  }
  ST_CHECK_DATA(!seqs.empty(), path, ": no token sequences");
  for (size_t i = 0; i < seqs.size(); ++i) {
    ST_CHECK_DATA(seqs[i].size() >= 2, path, ": ", where[i], " has ", seqs[i].size(),
             " tokens; scoring needs at least 2 (one to predict)");
    ST_CHECK_DATA(seqs[i].size() <= static_cast<size_t>(max_len), path, ": ", where[i], " has ", seqs[i].size(),
             " tokens, more than the model's max_position_embeddings (", max_len, ")");
  }
  return seqs;
}

}  // namespace st

// libFuzzer target for the tokenizer loader (st::Tokenizer::load) and, when the
// files load, encoding with them. The input is a tokenizer directory, its files
// joined by "\n%%\n" lines:
//   one or two parts:      tokenizer.json [%% text]
//   three or more parts:   vocab.json %% merges.txt %% tokenizer_config.json [%% text]
// An st::Error from load is the expected rejection. A crash, a sanitizer report, any
// other exception, an exception from encode (which takes any bytes), or an id that
// encode returns and decode does not know is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "data/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fuzz::split_parts(data, size);
  const std::string dir = fuzz::scratch_dir();
  for (const char* f : {"tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json"})
    fuzz::remove_file(dir + "/" + f);
  std::string_view text = "Hello world, the <|endoftext|> 12 ä½ł e\xCC\x81\xFF";
  if (parts.size() < 3) {
    fuzz::write_file(dir + "/tokenizer.json", parts[0]);
    if (parts.size() == 2) text = parts[1];
  } else {
    fuzz::write_file(dir + "/vocab.json", parts[0]);
    fuzz::write_file(dir + "/merges.txt", parts[1]);
    fuzz::write_file(dir + "/tokenizer_config.json", parts[2]);
    if (parts.size() >= 4) text = parts[3];
  }
  try {
    const st::Tokenizer t = st::Tokenizer::load(dir);
    if (t.vocab_size() <= 0 || t.eos_id() < 0 || t.eos_id() >= t.vocab_size()) __builtin_trap();
    (void)t.describe();
    const std::vector<int32_t> ids = t.encode(text);
    for (int32_t id : ids)
      if (id < 0 || id >= t.vocab_size()) __builtin_trap();
    (void)t.decode(ids);  // every id encode gives is assigned: an st::Error here escapes
    return 0;
  } catch (const st::Error& e) {
    fuzz::rejected(e);
    return 0;
  }
}

// libFuzzer target for Tokenizer::encode over arbitrary bytes, with a tiny synthetic
// Qwen2-style tokenizer (tests/support/tiny_tokenizer.h: byte-level BPE, a few merges, added tokens),
// loaded twice: with the NFC normalizer as Qwen2's, and without one. encode never
// throws; for any bytes x (tokenizer.h, "Invalid UTF-8"):
//   without a normalizer  decode(encode(x)) == utf8_replace_invalid(x)
//   with NFC              encode(decode(encode(x))) == encode(x)   (NFC is idempotent)
// and every id is below vocab_size(). A crash, a sanitizer report, an exception or a
// broken equation is a bug.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "core/utf8.h"
#include "data/tokenizer.h"
#include "fuzz_util.h"
#include "tiny_tokenizer.h"

namespace {

const st::Tokenizer& tokenizer(bool nfc) {
  static const auto load = [](bool with_nfc) {
    const std::string dir = fuzz::scratch_dir() + (with_nfc ? "/nfc" : "/plain");
    std::filesystem::create_directories(dir);
    fuzz::write_file(dir + "/tokenizer.json", st::testing::tokenizer_json(st::testing::tiny_tokenizer(), with_nfc));
    return st::Tokenizer::load(dir);
  };
  static const st::Tokenizer with = load(true), without = load(false);
  return nfc ? with : without;
}

void check_ids(const st::Tokenizer& t, const std::vector<int32_t>& ids) {
  for (int32_t id : ids)
    if (id < 0 || id >= t.vocab_size()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view x(reinterpret_cast<const char*>(data), size);
  const st::Tokenizer& plain = tokenizer(false);
  const std::vector<int32_t> ids = plain.encode(x);
  check_ids(plain, ids);
  if (plain.decode(ids) != st::utf8_replace_invalid(x)) __builtin_trap();

  const st::Tokenizer& nfc = tokenizer(true);
  const std::vector<int32_t> n1 = nfc.encode(x);
  check_ids(nfc, n1);
  const std::string y = nfc.decode(n1);
  if (nfc.encode(y) != n1) __builtin_trap();
  return 0;
}

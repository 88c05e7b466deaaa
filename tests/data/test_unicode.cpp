// UTF-8 (core/utf8.h) and NFC as the reference tokenizer computes it (data/unicode.h):
// invalid bytes replaced as Python does, and the Qwen2.5 tokenizer's normalizer (NFC, not
// NFKC). The Qwen test needs ../shared and skips with a message where it is absent; the
// rest run everywhere. Parity with the reference is test_tokenizer.cpp's fixture test.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "core/utf8.h"
#include "data/tokenizer.h"
#include "data/unicode.h"
#include "support/qwen_tokenizer.h"

namespace st {
namespace {

using namespace st::testing;  // the helpers of support/

TEST(Utf8, InvalidIsReplacedAsPythonDoes) {
  // bytes.decode("utf-8", errors="replace"): one U+FFFD per maximal ill-formed subpart.
  const std::string R = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_replace_invalid("abc"), "abc");
  EXPECT_EQ(utf8_replace_invalid("\xff"), R);
  EXPECT_EQ(utf8_replace_invalid("abc\xe2\x82"), "abc" + R);
  EXPECT_EQ(utf8_replace_invalid("\xe2\x82" "A"), R + "A");
  EXPECT_EQ(utf8_replace_invalid("\xc0\xaf"), R + R);
  EXPECT_EQ(utf8_replace_invalid("\xed\xa0\x80"), R + R + R);          // a surrogate
  EXPECT_EQ(utf8_replace_invalid("\xf4\x90\x80\x80"), R + R + R + R);  // above U+10FFFF
  EXPECT_EQ(utf8_replace_invalid("\xf0\x9f\x98"), R);                  // a cut emoji
  EXPECT_EQ(utf8_replace_invalid("\xe0\x80\x80"), R + R + R);          // overlong
  EXPECT_EQ(utf8_replace_invalid("caf\xe9!"), "caf" + R + "!");
  EXPECT_EQ(utf8_replace_invalid(std::string("a\0b", 3)), std::string("a\0b", 3));
}

TEST(Utf8, FirstInvalidAndOneCodePointEachWay) {
  EXPECT_EQ(utf8_first_invalid("plain ascii, long enough for the 8-byte steps"), 45u);
  EXPECT_EQ(utf8_first_invalid("caf\xC3\xA9 \xff"), 6u);
  EXPECT_EQ(utf8_first_invalid("0123456789\xe2\x82"), 10u);  // a cut sequence at the end
  for (uint32_t cp : {0x41u, 0xE9u, 0x7FFu, 0x800u, 0x20ACu, 0xFFFFu, 0x10000u, 0x1F600u, 0x10FFFFu}) {
    std::string s;
    utf8_append(s, cp);
    int sub = 0;
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    const int len = utf8_seq(p, 0, s.size(), &sub);
    ASSERT_EQ(len, static_cast<int>(s.size())) << cp;
    EXPECT_EQ(utf8_decode(p, len), cp);
  }
}

TEST(Nfc, QuickCheckAndNormalization) {
  EXPECT_TRUE(nfc_quick_yes("plain ascii"));
  EXPECT_TRUE(nfc_quick_yes("caf\xC3\xA9"));     // é precomposed
  EXPECT_FALSE(nfc_quick_yes("cafe\xCC\x81"));   // e + U+0301 composes
  EXPECT_FALSE(nfc_quick_yes("\xE2\x84\xAB"));   // U+212B, a singleton
  EXPECT_EQ(nfc_like_reference("cafe\xCC\x81"), "caf\xC3\xA9");
  EXPECT_EQ(nfc_like_reference("\xE2\x84\xAB"), "\xC3\x85");                                // -> Å
  EXPECT_EQ(nfc_like_reference("a\xCC\x81\xCC\xA7"), nfc_like_reference("a\xCC\xA7\xCC\x81"));  // canonical order
  EXPECT_EQ(nfc_like_reference("\xEF\xAC\x81"), "\xEF\xAC\x81");                           // ﬁ stays (not NFKC)
}

TEST(Nfc, QwenNormalizesNfcNotNfkc) {
  SKIP_WITHOUT_QWEN();
  const Tokenizer& t = qwen();
  EXPECT_EQ(t.encode("cafe\xCC\x81"), t.encode("caf\xC3\xA9"));   // e + U+0301 -> é
  EXPECT_EQ(t.encode("\xE2\x84\xAB"), t.encode("\xC3\x85"));      // U+212B -> Å
  EXPECT_EQ(t.encode("a\xCC\x81\xCC\xA7"), t.encode("a\xCC\xA7\xCC\x81"));  // canonical order
  EXPECT_NE(t.encode("\xEF\xAC\x81"), t.encode("fi"));            // ﬁ stays (not NFKC)
  EXPECT_NE(t.encode("\xEF\xBC\xA1"), t.encode("A"));             // full-width A stays
  EXPECT_EQ(t.decode(t.encode("cafe\xCC\x81")), "caf\xC3\xA9");  // decode gives the normalized text
}

}  // namespace
}  // namespace st

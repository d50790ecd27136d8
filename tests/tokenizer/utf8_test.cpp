#include "pagoda/tokenizer/utf8.h"

#include <gtest/gtest.h>

#include "pagoda/tokenizer/byte_unicode.h"

namespace pagoda {
namespace {

TEST(Utf8, ScanTellsValidInvalidAndTruncated) {
  EXPECT_EQ(scan_utf8("a", 0).length, 1u);
  const Utf8Scan euro = scan_utf8("\xE2\x82\xAC", 0);
  EXPECT_EQ(euro.status, Utf8Status::kValid);
  EXPECT_EQ(euro.length, 3u);
  EXPECT_EQ(scan_utf8("\xE2\x82", 0).status, Utf8Status::kTruncated);
  EXPECT_EQ(scan_utf8("\x80", 0).status, Utf8Status::kInvalid);
  EXPECT_EQ(scan_utf8("\xC0\x80", 0).status, Utf8Status::kInvalid);    // overlong
  EXPECT_EQ(scan_utf8("\xED\xA0\x80", 0).status, Utf8Status::kInvalid);  // surrogate
  EXPECT_EQ(scan_utf8("\xF4\x90\x80\x80", 0).status, Utf8Status::kInvalid);  // > U+10FFFF
}

// The replacements Python's bytes.decode("utf-8", "replace") makes.
TEST(Utf8, ReplacesMaximalInvalidSubparts) {
  EXPECT_EQ(to_valid_utf8("ok"), "ok");
  EXPECT_EQ(to_valid_utf8("a\xE2\x82z"), "a\xEF\xBF\xBDz");            // one U+FFFD for E2 82
  EXPECT_EQ(to_valid_utf8("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // one per byte
  EXPECT_EQ(to_valid_utf8("\xF0\x9F\x98"), "\xEF\xBF\xBD");            // truncated at the end
  EXPECT_EQ(to_valid_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(Utf8, HoldsBackATruncatedCharacter) {
  std::string out;
  EXPECT_EQ(append_valid_utf8(out, "ab\xF0\x9F", /*hold_truncated=*/true), 2u);
  EXPECT_EQ(out, "ab");
}

TEST(ByteUnicode, MapsEveryByteReversibly) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  const std::string mapped = bytes_to_unicode_text(all);
  EXPECT_EQ(unicode_text_to_bytes(mapped), all);
  EXPECT_EQ(bytes_to_unicode_text(" the"), "\xC4\xA0the");  // "Ġthe"
  EXPECT_EQ(bytes_to_unicode_text("\n"), "\xC4\x8A");       // "Ċ"
  EXPECT_EQ(unicode_text_to_bytes("\xE2\x96\x81"), std::nullopt);  // "▁" is not in the table
}

}  // namespace
}  // namespace pagoda

#include "pagoda/tokenizer/utf8.h"

#include <algorithm>

namespace pagoda {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

bool is_continuation(uint8_t byte) { return (byte & 0xC0) == 0x80; }

}  // namespace

Utf8Scan scan_utf8(std::string_view text, size_t pos) {
  const auto lead = static_cast<uint8_t>(text[pos]);
  if (lead < 0x80) return {Utf8Status::kValid, 1};
  // The second byte's range excludes overlong forms, surrogates and code points > U+10FFFF.
  size_t length = 0;
  uint8_t low = 0x80, high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return {Utf8Status::kInvalid, 1};  // a stray continuation byte, C0/C1 or F5..FF
  }
  for (size_t k = 1; k < length; ++k) {
    if (pos + k >= text.size()) return {Utf8Status::kTruncated, k};
    const auto byte = static_cast<uint8_t>(text[pos + k]);
    const bool ok = k == 1 ? (byte >= low && byte <= high) : is_continuation(byte);
    if (!ok) return {Utf8Status::kInvalid, k};
  }
  return {Utf8Status::kValid, length};
}

size_t utf8_char_length(std::string_view text, size_t pos) {
  const Utf8Scan scan = scan_utf8(text, pos);
  return scan.status == Utf8Status::kValid ? scan.length : 1;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t decode_utf8(std::string_view text, size_t pos, size_t length) {
  const auto byte = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(text[pos + k])); };
  switch (length) {
    case 1: return byte(0);
    case 2: return ((byte(0) & 0x1F) << 6) | (byte(1) & 0x3F);
    case 3: return ((byte(0) & 0x0F) << 12) | ((byte(1) & 0x3F) << 6) | (byte(2) & 0x3F);
    default:
      return ((byte(0) & 0x07) << 18) | ((byte(1) & 0x3F) << 12) | ((byte(2) & 0x3F) << 6) |
             (byte(3) & 0x3F);
  }
}

size_t append_valid_utf8(std::string& out, std::string_view text, bool hold_truncated) {
  size_t pos = 0;
  while (pos < text.size()) {
    const Utf8Scan scan = scan_utf8(text, pos);
    if (scan.status == Utf8Status::kValid) {
      out.append(text.substr(pos, scan.length));
    } else if (scan.status == Utf8Status::kTruncated && hold_truncated) {
      return pos;
    } else {
      out.append(kReplacement);
    }
    pos += scan.length;
  }
  return pos;
}

std::string to_valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  append_valid_utf8(out, text, /*hold_truncated=*/false);
  return out;
}

size_t count_code_points(std::string_view text) {
  return size_t(std::count_if(text.begin(), text.end(), [](char c) { return (uint8_t(c) & 0xC0) != 0x80; }));
}

}  // namespace pagoda

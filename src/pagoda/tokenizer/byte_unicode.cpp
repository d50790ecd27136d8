#include "pagoda/tokenizer/byte_unicode.h"

#include <array>
#include <cstdint>

#include "pagoda/tokenizer/utf8.h"

namespace pagoda {
namespace {

bool maps_to_itself(uint32_t byte) {
  return (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE && byte <= 0xFF);
}

struct ByteUnicodeTable {
  std::array<uint32_t, 256> code_point_of_byte{};
  std::array<int16_t, 0x200> byte_of_code_point{};  // every mapped code point is < U+0200

  ByteUnicodeTable() {
    byte_of_code_point.fill(-1);
    uint32_t next = 0x100;
    for (uint32_t byte = 0; byte < 256; ++byte) {
      const uint32_t cp = maps_to_itself(byte) ? byte : next++;
      code_point_of_byte[byte] = cp;
      byte_of_code_point[cp] = static_cast<int16_t>(byte);
    }
  }
};

const ByteUnicodeTable& table() {
  static const ByteUnicodeTable instance;
  return instance;
}

}  // namespace

std::string bytes_to_unicode_text(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_utf8(out, table().code_point_of_byte[static_cast<uint8_t>(c)]);
  return out;
}

std::optional<std::string> unicode_text_to_bytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const Utf8Scan scan = scan_utf8(text, pos);
    if (scan.status != Utf8Status::kValid) return std::nullopt;
    const uint32_t cp = decode_utf8(text, pos, scan.length);
    if (cp >= table().byte_of_code_point.size() || table().byte_of_code_point[cp] < 0) return std::nullopt;
    out += static_cast<char>(table().byte_of_code_point[cp]);
    pos += scan.length;
  }
  return out;
}

}  // namespace pagoda

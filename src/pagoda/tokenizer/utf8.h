// UTF-8 helpers for the tokenizer: splitting text into characters, and making byte strings
// valid. Invalid bytes are replaced the way Python's "replace" and Rust's from_utf8_lossy do it
// (one U+FFFD per maximal invalid subpart), so decode() agrees with Hugging Face byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace pagoda {

enum class Utf8Status { kValid, kInvalid, kTruncated };

// What starts at text[pos]: a valid character of `length` bytes; `length` invalid bytes (the
// maximal subpart of a sequence that went wrong); or a valid start cut off by the end of text.
struct Utf8Scan {
  Utf8Status status;
  size_t length;
};
Utf8Scan scan_utf8(std::string_view text, size_t pos);

// Byte length of the character at text[pos]; an invalid or truncated sequence counts as its
// bytes taken one at a time, so every byte string splits into "characters".
size_t utf8_char_length(std::string_view text, size_t pos);

// Appends the UTF-8 encoding of a code point (must be <= 0x10FFFF).
void append_utf8(std::string& out, uint32_t code_point);
// The code point of a valid character of `length` bytes at text[pos].
uint32_t decode_utf8(std::string_view text, size_t pos, size_t length);

// Appends `text` with invalid sequences replaced by U+FFFD. When `hold_truncated` is set, a
// truncated character at the end is not written; the return value is how many bytes of `text`
// were consumed (all of them otherwise).
size_t append_valid_utf8(std::string& out, std::string_view text, bool hold_truncated);
std::string to_valid_utf8(std::string_view text);

// Code points in valid UTF-8 text (the bytes that are not continuation bytes): what OpenAI's
// text_offset counts.
size_t count_code_points(std::string_view text);

}  // namespace pagoda

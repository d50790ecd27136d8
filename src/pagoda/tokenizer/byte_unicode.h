// GPT-2's reversible byte <-> Unicode mapping. Byte-level BPE vocabularies are written in
// printable characters: bytes that are printable Latin-1 map to themselves, the other 68 bytes
// (controls, space, 0x7F..0xA0, 0xAD) map to U+0100 onwards, so " the" is stored as "Ġthe".
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace pagoda {

// Each byte of `bytes` replaced by its character.
std::string bytes_to_unicode_text(std::string_view bytes);
// The inverse; nullopt when `text` holds a character outside the mapping (e.g. an added token
// written in plain text such as "<|fim prefix|>").
std::optional<std::string> unicode_text_to_bytes(std::string_view text);

}  // namespace pagoda

// The token table shared by both BPE flavours: piece text, score and kind per id, and the
// reverse lookup from piece text to id.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace pagoda {

// GGUF's tokenizer.ggml.token_type values.
enum class TokenKind : uint8_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // special tokens: <s>, <|im_start|>, ... (skipped by decode on request)
  kUserDefined = 4,  // added tokens that are plain text: always matched whole, never merged into
  kUnused = 5,
  kByte = 6,         // SentencePiece byte fallback <0xXX>
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};

struct Vocabulary {
  std::vector<std::string> pieces;  // [n] as stored (byte-level text for GPT-2 style models)
  std::vector<float> scores;        // [n] SentencePiece merge priority; 0 when the model has none
  std::vector<TokenKind> kinds;     // [n]
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> id_of_piece;

  int32_t size() const { return static_cast<int32_t>(pieces.size()); }
  std::optional<int32_t> find(std::string_view piece) const {
    const auto it = id_of_piece.find(piece);
    if (it == id_of_piece.end()) return std::nullopt;
    return it->second;
  }
  // Rebuilds id_of_piece; when a piece repeats, its first id wins.
  void index();
};

}  // namespace pagoda

#include "pagoda/tokenizer/sentencepiece_bpe.h"

#include <cmath>
#include <cstdio>

#include "pagoda/tokenizer/bpe_merge.h"
#include "pagoda/tokenizer/utf8.h"

namespace pagoda {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581 "▁"

std::string byte_piece(uint8_t byte) {
  char text[8];
  std::snprintf(text, sizeof(text), "<0x%02X>", byte);
  return text;
}

// The byte of a "<0xXX>" piece, or -1.
int parse_byte_piece(std::string_view piece) {
  if (piece.size() != 6 || !piece.starts_with("<0x") || piece[5] != '>') return -1;
  int value = 0;
  for (char c : piece.substr(3, 2)) {
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

}  // namespace

SentencePieceBpe::SentencePieceBpe(const Vocabulary& vocab, MergeTable merges, SentencePieceOptions options)
    : merges_(std::move(merges)), options_(options) {
  for (int byte = 0; byte < 256; ++byte) byte_token_[byte] = vocab.find(byte_piece(byte)).value_or(-1);
}

bool SentencePieceBpe::mergeable(const Vocabulary& vocab, int32_t id) const {
  // SentencePiece only builds normal and user-defined pieces; control, unknown, byte and unused
  // ones are never the result of a merge even when their text could be spelled out.
  const TokenKind kind = vocab.kinds[id];
  return kind == TokenKind::kNormal || kind == TokenKind::kUserDefined;
}

void SentencePieceBpe::encode(const Vocabulary& vocab, std::string_view text, bool at_input_start,
                              std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string normalized;
  normalized.reserve(text.size() + 8);
  // As Hugging Face's Metaspace: no extra "▁" when the text already starts with a space.
  if (options_.add_dummy_prefix && (at_input_start || options_.prefix_every_segment) && text.front() != ' ') normalized += kSpaceMark;
  for (char c : text) {
    if (c == ' ') {
      normalized += kSpaceMark;
    } else {
      normalized += c;
    }
  }
  if (!options_.split_on_space) {
    encode_word(vocab, normalized, out);
    return;
  }
  // Split before each "▁": "a▁▁b" -> "a", "▁", "▁b".
  const std::string_view all = normalized;
  size_t begin = 0;
  for (size_t pos = all.find(kSpaceMark, 1); pos != std::string_view::npos; pos = all.find(kSpaceMark, pos + 1)) {
    encode_word(vocab, all.substr(begin, pos - begin), out);
    begin = pos;
  }
  encode_word(vocab, all.substr(begin), out);
}

void SentencePieceBpe::encode_word(const Vocabulary& vocab, std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  const auto mergeable_id = [&](std::string_view piece) -> std::optional<int32_t> {
    const std::optional<int32_t> id = vocab.find(piece);
    if (!id || !mergeable(vocab, *id)) return std::nullopt;
    return id;
  };
  const auto rank = [&](std::string_view left, std::string_view right) -> std::optional<double> {
    if (!merges_.empty()) {
      const std::optional<int32_t> a = mergeable_id(left), b = mergeable_id(right);
      if (!a || !b) return std::nullopt;
      const std::optional<MergeResult> merge = merges_.find(*a, *b);
      if (!merge) return std::nullopt;
      return merge->rank;
    }
    // Left and right are adjacent in `word`, so their concatenation is a view of it.
    const std::optional<int32_t> merged = mergeable_id(std::string_view(left.data(), left.size() + right.size()));
    if (!merged) return std::nullopt;
    // Higher score merges first; a NaN score would break the queue's ordering.
    const float score = vocab.scores[*merged];
    if (std::isnan(score)) return std::nullopt;
    return -static_cast<double>(score);
  };
  for (std::string_view piece : bpe_merge(word, rank)) {
    if (const std::optional<int32_t> id = mergeable_id(piece)) {
      out.push_back(*id);
      continue;
    }
    // An unmerged character without a token: its bytes, or one unknown token.
    bool all_bytes = options_.byte_fallback;
    for (char byte : piece) all_bytes = all_bytes && byte_token_[static_cast<uint8_t>(byte)] >= 0;
    if (all_bytes) {
      for (char byte : piece) out.push_back(byte_token_[static_cast<uint8_t>(byte)]);
    } else if (options_.unk_id >= 0) {
      out.push_back(options_.unk_id);
    }
  }
}

std::string SentencePieceBpe::token_bytes(const Vocabulary& vocab, int32_t id) const {
  const std::string& piece = vocab.pieces[id];
  if (vocab.kinds[id] == TokenKind::kByte) {
    const int byte = parse_byte_piece(piece);
    if (byte >= 0) return std::string(1, static_cast<char>(byte));
  }
  if (vocab.kinds[id] != TokenKind::kNormal) return piece;
  std::string bytes;
  bytes.reserve(piece.size());
  for (size_t pos = 0; pos < piece.size();) {
    if (std::string_view(piece).substr(pos).starts_with(kSpaceMark)) {
      bytes += ' ';
      pos += kSpaceMark.size();
    } else {
      bytes += piece[pos++];
    }
  }
  return bytes;
}

}  // namespace pagoda

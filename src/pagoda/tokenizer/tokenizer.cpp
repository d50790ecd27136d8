#include "pagoda/tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <variant>

#include "pagoda/core/error.h"
#include "pagoda/tokenizer/special_tokens.h"
#include "pagoda/tokenizer/utf8.h"

namespace pagoda {
namespace {

// Tokens that end a turn in the chat formats pagoda knows; generation stops on any of them.
constexpr std::array<std::string_view, 8> kEndOfTurnPieces = {
    "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>",
    "<|eom_id|>", "<|end|>", "<end_of_turn>", "</s>",
};

}  // namespace

struct Tokenizer::Impl {
  Vocabulary vocab;
  std::variant<ByteLevelBpe, SentencePieceBpe> model;
  SpecialTokenMatcher specials;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  bool add_bos = false;
  std::string chat_template;

  std::string token_bytes(int32_t id) const {
    return std::visit([&](const auto& m) { return m.token_bytes(vocab, id); }, model);
  }
  bool strips_leading_space() const {
    const auto* spm = std::get_if<SentencePieceBpe>(&model);
    return spm != nullptr && spm->strips_leading_space();
  }
};

namespace {

std::variant<ByteLevelBpe, SentencePieceBpe> make_model(const TokenizerConfig& config, const Vocabulary& vocab) {
  if (config.model == TokenizerModel::kByteLevelBpe) {
    if (config.merges.empty() && vocab.size() > 256) {
      fail(ErrorKind::kCorrupt, "{}: byte-level BPE tokenizer has no merges", config.origin);
    }
    return ByteLevelBpe(vocab, MergeTable(vocab, config.merges), config.pre_tokenizer, config.byte_level);
  }
  return SentencePieceBpe(vocab, MergeTable(vocab, config.merges), config.sentencepiece);
}

void check_id(const Vocabulary& vocab, int32_t id, std::string_view what, const std::string& origin) {
  if (id < -1 || id >= vocab.size()) {
    fail(ErrorKind::kCorrupt, "{}: {} token id {} is outside the vocabulary of {}", origin, what, id, vocab.size());
  }
}

}  // namespace

Tokenizer Tokenizer::from_config(TokenizerConfig config) {
  Vocabulary& vocab = config.vocab;
  const size_t n = vocab.pieces.size();
  if (n == 0) fail(ErrorKind::kCorrupt, "{}: the vocabulary is empty", config.origin);
  if (n > static_cast<size_t>(INT32_MAX)) fail(ErrorKind::kCorrupt, "{}: vocabulary too large", config.origin);
  if (vocab.scores.empty()) vocab.scores.assign(n, 0.0f);
  if (vocab.kinds.empty()) vocab.kinds.assign(n, TokenKind::kNormal);
  if (vocab.scores.size() != n || vocab.kinds.size() != n) {
    fail(ErrorKind::kCorrupt, "{}: {} tokens but {} scores and {} token types", config.origin, n,
         vocab.scores.size(), vocab.kinds.size());
  }
  vocab.index();
  check_id(vocab, config.bos_id, "bos", config.origin);
  check_id(vocab, config.eos_id, "eos", config.origin);
  check_id(vocab, config.sentencepiece.unk_id, "unknown", config.origin);

  auto impl = std::make_shared<Impl>(Impl{
      .vocab = {},
      .model = make_model(config, vocab),
      .specials = {},
      .bos_id = config.bos_id,
      .eos_id = config.eos_id,
      .add_bos = config.add_bos && config.bos_id >= 0,
      .chat_template = std::move(config.chat_template),
  });
  std::vector<SpecialTokenMatcher::Entry> entries;
  for (int32_t id = 0; id < vocab.size(); ++id) {
    const TokenKind kind = vocab.kinds[id];
    if (kind == TokenKind::kControl || kind == TokenKind::kUnknown || kind == TokenKind::kUserDefined) {
      entries.push_back({vocab.pieces[id], id, kind != TokenKind::kUserDefined});
    }
  }
  impl->specials = SpecialTokenMatcher(std::move(entries));
  impl->vocab = std::move(vocab);
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (add_bos && impl_->bos_id >= 0) ids.push_back(impl_->bos_id);
  for (const TextSegment& segment : impl_->specials.split(text, parse_special)) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
    } else if (const auto* bpe = std::get_if<ByteLevelBpe>(&impl_->model)) {
      bpe->encode(impl_->vocab, segment.text, ids);
    } else {
      std::get<SentencePieceBpe>(impl_->model).encode(impl_->vocab, segment.text, segment.offset == 0, ids);
    }
  }
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  bool at_start = true;
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    std::string piece = token_bytes(id);
    if (at_start && strips_leading_space() && piece.starts_with(' ')) piece.erase(0, 1);
    at_start = false;
    bytes += piece;
  }
  return to_valid_utf8(bytes);
}

std::string Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    fail(ErrorKind::kInvalidArgument, "token id {} is outside the vocabulary of {}", id, vocab_size());
  }
  return impl_->token_bytes(id);
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab.size(); }
int32_t Tokenizer::bos_id() const { return impl_->bos_id; }
int32_t Tokenizer::eos_id() const { return impl_->eos_id; }
bool Tokenizer::add_bos_by_default() const { return impl_->add_bos; }
const std::string& Tokenizer::chat_template_text() const { return impl_->chat_template; }
bool Tokenizer::strips_leading_space() const { return impl_->strips_leading_space(); }

bool Tokenizer::is_special(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return false;
  const TokenKind kind = impl_->vocab.kinds[id];
  return kind == TokenKind::kControl || kind == TokenKind::kUnknown;
}

std::optional<int32_t> Tokenizer::token_id(std::string_view piece) const { return impl_->vocab.find(piece); }

std::vector<int32_t> Tokenizer::stop_ids() const {
  std::vector<int32_t> ids;
  if (impl_->eos_id >= 0) ids.push_back(impl_->eos_id);
  for (std::string_view piece : kEndOfTurnPieces) {
    const std::optional<int32_t> id = impl_->vocab.find(piece);
    // Only as a whole special token: a normal "</s>" spelled in text is not an end of turn.
    if (id && is_special(*id) && std::find(ids.begin(), ids.end(), *id) == ids.end()) ids.push_back(*id);
  }
  return ids;
}

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(&tokenizer), skip_special_(skip_special) {}

std::string IncrementalDecoder::push(int32_t id) {
  if (skip_special_ && tokenizer_->is_special(id)) return {};
  std::string piece = tokenizer_->token_bytes(id);
  if (at_start_ && tokenizer_->strips_leading_space() && piece.starts_with(' ')) piece.erase(0, 1);
  at_start_ = false;
  pending_ += piece;
  std::string text;
  const size_t consumed = append_valid_utf8(text, pending_, /*hold_truncated=*/true);
  pending_.erase(0, consumed);
  return text;
}

std::string IncrementalDecoder::flush() {
  std::string text = to_valid_utf8(pending_);
  pending_.clear();
  return text;
}

}  // namespace pagoda

#include "pagoda/tokenizer/byte_level_bpe.h"

#include "pagoda/tokenizer/bpe_merge.h"
#include "pagoda/tokenizer/byte_unicode.h"

namespace pagoda {
namespace {

// What an entry costs beyond its word's bytes and its ids: the map node, the string and vector
// headers, the bucket (about 64 bytes with libstdc++ on 64-bit).
constexpr size_t kCacheEntryOverhead = 64;

size_t cache_entry_bytes(std::string_view word, const std::vector<int32_t>& ids) {
  return kCacheEntryOverhead + word.size() + ids.size() * sizeof(int32_t);
}

}  // namespace

ByteLevelBpe::ByteLevelBpe(const Vocabulary& vocab, MergeTable merges, PreTokenizer pre_tokenizer,
                           ByteLevelOptions options)
    : merges_(std::move(merges)), pre_tokenizer_(std::move(pre_tokenizer)), options_(options) {
  for (int byte = 0; byte < 256; ++byte) {
    const std::optional<int32_t> id = vocab.find(bytes_to_unicode_text(std::string(1, static_cast<char>(byte))));
    byte_token_[byte] = id.value_or(-1);
  }
}

void ByteLevelBpe::encode(const Vocabulary& vocab, std::string_view text, std::vector<int32_t>& out) const {
  std::string prefixed;
  if (options_.add_prefix_space && !text.empty() && text.front() != ' ') {
    prefixed = " ";
    prefixed += text;
    text = prefixed;
  }
  if (pre_tokenizer_.empty()) {
    if (!text.empty()) encode_word(vocab, text, out);
    return;
  }
  for (std::string_view word : pre_tokenizer_.split(text)) encode_word(vocab, word, out);
}

void ByteLevelBpe::encode_word(const Vocabulary& vocab, std::string_view word, std::vector<int32_t>& out) const {
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard lock(cache_->mutex);
    if (const auto it = cache_->ids.find(word); it != cache_->ids.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const std::string mapped = bytes_to_unicode_text(word);
  std::vector<int32_t> ids;
  const std::optional<int32_t> whole = options_.ignore_merges ? vocab.find(mapped) : std::nullopt;
  if (whole) {
    ids.push_back(*whole);
  } else {
    const auto rank = [&](std::string_view left, std::string_view right) -> std::optional<double> {
      const std::optional<int32_t> a = vocab.find(left), b = vocab.find(right);
      if (!a || !b) return std::nullopt;
      const std::optional<MergeResult> merge = merges_.find(*a, *b);
      if (!merge) return std::nullopt;
      return merge->rank;
    };
    for (std::string_view piece : bpe_merge(mapped, rank)) {
      if (const std::optional<int32_t> id = vocab.find(piece)) {
        ids.push_back(*id);
        continue;
      }
      // A piece that is not a token is an unmerged character whose byte has no token of its
      // own (a vocabulary without the full byte alphabet): emit the bytes that do have one.
      const std::string bytes = unicode_text_to_bytes(piece).value_or("");
      for (char byte : bytes) {
        if (byte_token_[static_cast<uint8_t>(byte)] >= 0) ids.push_back(byte_token_[static_cast<uint8_t>(byte)]);
      }
    }
  }
  out.insert(out.end(), ids.begin(), ids.end());
  if (!cacheable) return;
  const size_t entry_bytes = cache_entry_bytes(word, ids);
  std::lock_guard lock(cache_->mutex);
  // Full: start afresh rather than track recency; the common words come back quickly.
  if (cache_->bytes + entry_bytes > kMaxCacheBytes) {
    cache_->ids.clear();
    cache_->bytes = 0;
  }
  if (cache_->ids.emplace(std::string(word), std::move(ids)).second) cache_->bytes += entry_bytes;
}

size_t ByteLevelBpe::cached_bytes() const {
  std::lock_guard lock(cache_->mutex);
  return cache_->bytes;
}

std::string ByteLevelBpe::token_bytes(const Vocabulary& vocab, int32_t id) const {
  const std::string& piece = vocab.pieces[id];
  if (vocab.kinds[id] == TokenKind::kNormal || vocab.kinds[id] == TokenKind::kByte) {
    if (std::optional<std::string> bytes = unicode_text_to_bytes(piece)) return *bytes;
  }
  return piece;
}

}  // namespace pagoda

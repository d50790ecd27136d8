// GPT-2 style byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM2): the pre-tokenizer cuts text into
// words, each word's bytes are written as GPT-2's printable characters, and merges apply by
// rank. Every byte has a base token, so any byte string encodes and decodes back exactly.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pagoda/tokenizer/merge_table.h"
#include "pagoda/tokenizer/pre_tokenizer.h"
#include "pagoda/tokenizer/vocabulary.h"

namespace pagoda {

struct ByteLevelOptions {
  bool add_prefix_space = false;  // a space before text that starts without one (ByteLevel's flag)
  bool ignore_merges = false;     // a word that is itself a token is taken whole (Llama 3)
};

class ByteLevelBpe {
 public:
  ByteLevelBpe(const Vocabulary& vocab, MergeTable merges, PreTokenizer pre_tokenizer, ByteLevelOptions options);

  // Appends the ids of `text` (plain text, no special tokens in it).
  void encode(const Vocabulary& vocab, std::string_view text, std::vector<int32_t>& out) const;
  // The bytes a token stands for; its piece as is when that is not in the byte alphabet.
  std::string token_bytes(const Vocabulary& vocab, int32_t id) const;

  // The word cache's bound: its words' bytes and ids plus a per-entry overhead. The cache
  // outlives every request, so text a client sends must not be able to grow it without end.
  static constexpr size_t kMaxCacheBytes = 8 << 20;
  // Longer words are not cached: they rarely repeat, and one request could fill the cache.
  static constexpr size_t kMaxCachedWordBytes = 256;
  size_t cached_bytes() const;

 private:
  void encode_word(const Vocabulary& vocab, std::string_view word, std::vector<int32_t>& out) const;

  MergeTable merges_;
  PreTokenizer pre_tokenizer_;
  ByteLevelOptions options_;
  int32_t byte_token_[256];  // id of each byte's one-character token, -1 when the vocab lacks it

  // Words repeat a lot in text; their ids are cached. Shared by copies, guarded for threads.
  struct WordCache {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> ids;
    size_t bytes = 0;  // as cached_bytes() counts them
  };
  std::shared_ptr<WordCache> cache_ = std::make_shared<WordCache>();
};

}  // namespace pagoda

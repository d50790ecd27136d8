// SentencePiece-style BPE (Llama 2, Mistral): spaces become "▁" (U+2581), a "▁" is put before
// the text (add_dummy_prefix), and the whole text is merged as one word. Merges go by the
// score of the piece they make (GGUF: tokenizer.ggml.scores) or, for tokenizer.json models, by
// the rank in the merge list. A character with no token falls back to its bytes' <0xXX> tokens,
// or to the unknown token when the vocabulary has no byte tokens.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/tokenizer/merge_table.h"
#include "pagoda/tokenizer/vocabulary.h"

namespace pagoda {

struct SentencePieceOptions {
  bool add_dummy_prefix = true;  // "▁" before text at the start of the input
  // ...and also before text that follows a special token (llama.cpp, Hugging Face's "legacy"
  // normalizer and Metaspace prepend_scheme "always").
  bool prefix_every_segment = false;
  bool split_on_space = false;   // Metaspace(split=true): merge within "▁word" pieces only
  bool byte_fallback = true;
  int32_t unk_id = -1;
};

class SentencePieceBpe {
 public:
  // `merges` empty: merge by score.
  SentencePieceBpe(const Vocabulary& vocab, MergeTable merges, SentencePieceOptions options);

  // Appends the ids of `text`; `at_input_start` says whether text begins the whole input (by
  // default the dummy prefix goes only there, as Hugging Face's Metaspace "first" does).
  void encode(const Vocabulary& vocab, std::string_view text, bool at_input_start, std::vector<int32_t>& out) const;
  std::string token_bytes(const Vocabulary& vocab, int32_t id) const;
  bool strips_leading_space() const { return options_.add_dummy_prefix; }

 private:
  void encode_word(const Vocabulary& vocab, std::string_view word, std::vector<int32_t>& out) const;
  bool mergeable(const Vocabulary& vocab, int32_t id) const;

  MergeTable merges_;
  SentencePieceOptions options_;
  std::array<int32_t, 256> byte_token_{};  // id of <0xXX>, -1 when absent
};

}  // namespace pagoda

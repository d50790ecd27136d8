// Text <-> token ids for Llama-family models: GPT-2 style byte-level BPE (Llama 3, Qwen2,
// SmolLM2) and SentencePiece-style BPE (Llama 2, Mistral), loaded from GGUF metadata or a
// Hugging Face tokenizer.json. A Tokenizer is immutable after loading, cheap to copy (copies
// share the tables) and safe to use from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/tokenizer/tokenizer_config.h"

namespace pagoda {

class GgufFile;

class Tokenizer {
 public:
  // Reads tokenizer.ggml.* and tokenizer.chat_template. Throws Error(kNotFound) when the
  // tokens are missing, kCorrupt when arrays disagree or a merge names an unknown token,
  // kUnsupported for a tokenizer model or pre-tokenizer pagoda does not implement.
  static Tokenizer from_gguf(const GgufFile& file);
  // A Hugging Face tokenizer.json. When a tokenizer_config.json sits next to it, its bos/eos
  // tokens, add_bos_token and chat_template are read too.
  static Tokenizer from_json_file(const std::string& path);
  // tokenizer.json text (and optionally tokenizer_config.json text). Throws kCorrupt for bad
  // JSON or a missing vocab, kUnsupported naming an unknown model type or pre-tokenizer.
  static Tokenizer from_json(std::string_view tokenizer_json, std::string_view tokenizer_config_json = {},
                             std::string_view origin = "tokenizer.json");
  static Tokenizer from_config(TokenizerConfig config);

  // With parse_special, special tokens written in the text ("<|im_start|>") become their ids;
  // without it they are tokenized as text. Added tokens that are not special always match.
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special = true) const;
  // Valid UTF-8 (invalid byte sequences become U+FFFD). Throws kInvalidArgument for an id
  // outside the vocabulary.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  std::string token_bytes(int32_t id) const;  // the raw bytes this token stands for

  int32_t vocab_size() const;
  int32_t bos_id() const;  // -1 when none
  int32_t eos_id() const;  // -1 when none
  bool add_bos_by_default() const;
  bool is_special(int32_t id) const;  // control and unknown tokens: what skip_special drops
  std::optional<int32_t> token_id(std::string_view piece) const;  // exact piece lookup
  const std::string& chat_template_text() const;  // "" when the model has none
  // eos plus the end-of-turn tokens (<|im_end|>, <|eot_id|>, <|end_of_text|>...) in the vocab.
  std::vector<int32_t> stop_ids() const;

  // Whether decoding drops one space at the very start (SentencePiece's dummy prefix).
  bool strips_leading_space() const;

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Turns a stream of token ids into text pieces that are always valid UTF-8: bytes of a
// character split across tokens are held back until complete (invalid sequences become U+FFFD).
// The concatenation of everything push() and flush() return equals decode() of all the ids.
// It refers to the tokenizer, which must outlive it.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special = true);
  std::string push(int32_t id);  // new complete text, possibly ""
  std::string flush();           // whatever is held back, made valid

 private:
  const Tokenizer* tokenizer_;  // a pointer so decoders can be moved and assigned
  bool skip_special_;
  bool at_start_ = true;  // no text emitted yet: the leading-space strip still applies
  std::string pending_;   // bytes of an incomplete character
};

}  // namespace pagoda

// Everything a Tokenizer is built from, as plain data. The GGUF and tokenizer.json loaders fill
// it; tests build it from vectors directly.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "pagoda/tokenizer/byte_level_bpe.h"
#include "pagoda/tokenizer/pre_tokenizer.h"
#include "pagoda/tokenizer/sentencepiece_bpe.h"
#include "pagoda/tokenizer/vocabulary.h"

namespace pagoda {

enum class TokenizerModel { kByteLevelBpe, kSentencePieceBpe };

struct TokenizerConfig {
  TokenizerModel model = TokenizerModel::kByteLevelBpe;
  Vocabulary vocab;  // pieces, scores and kinds; index() is called by the Tokenizer
  // By rank. Byte-level BPE needs them; SentencePiece-style BPE merges by score without them.
  std::vector<std::pair<std::string, std::string>> merges;
  PreTokenizer pre_tokenizer;  // byte-level only
  ByteLevelOptions byte_level;
  SentencePieceOptions sentencepiece;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  bool add_bos = false;
  std::string chat_template;  // the model's Jinja text, "" when none
  std::string origin;         // the file it came from, for error messages
};

}  // namespace pagoda

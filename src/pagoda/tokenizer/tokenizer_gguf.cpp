// Tokenizer::from_gguf: the tokenizer.ggml.* metadata that llama.cpp's converters write.
#include <cstdint>

#include "pagoda/core/error.h"
#include "pagoda/format/gguf.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda {
namespace {

int32_t optional_id(const GgufFile& file, std::string_view key) {
  const GgufValue* value = file.find(key);
  if (value == nullptr) return -1;
  const int64_t id = value->as_int();
  if (id < -1 || id > INT32_MAX) fail(ErrorKind::kCorrupt, "{}: {} = {} is not a token id", file.origin(), key, id);
  return static_cast<int32_t>(id);
}

bool optional_bool(const GgufFile& file, std::string_view key, bool fallback) {
  const GgufValue* value = file.find(key);
  return value == nullptr ? fallback : value->as_bool();
}

std::vector<std::pair<std::string, std::string>> split_merges(const GgufFile& file) {
  std::vector<std::pair<std::string, std::string>> merges;
  if (file.find("tokenizer.ggml.merges") == nullptr) return merges;
  const std::vector<std::string> lines = file.get_string_array("tokenizer.ggml.merges");
  merges.reserve(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    // Byte-level pieces never contain a plain space (it is written "Ġ"), so the first space
    // separates the two halves.
    const size_t space = lines[i].find(' ', 1);
    if (space == std::string::npos) {
      fail(ErrorKind::kCorrupt, "{}: tokenizer.ggml.merges[{}] = '{}' is not two pieces", file.origin(), i, lines[i]);
    }
    merges.emplace_back(lines[i].substr(0, space), lines[i].substr(space + 1));
  }
  return merges;
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const GgufFile& file) {
  TokenizerConfig config;
  config.origin = file.origin();
  const std::string model = file.get_string("tokenizer.ggml.model");
  if (model == "gpt2") {
    config.model = TokenizerModel::kByteLevelBpe;
  } else if (model == "llama") {
    config.model = TokenizerModel::kSentencePieceBpe;
  } else {
    fail(ErrorKind::kUnsupported, "{}: unsupported tokenizer model '{}' (known: gpt2, llama)", file.origin(), model);
  }

  Vocabulary& vocab = config.vocab;
  vocab.pieces = file.get_string_array("tokenizer.ggml.tokens");
  if (file.find("tokenizer.ggml.scores") != nullptr) vocab.scores = file.get_float_array("tokenizer.ggml.scores");
  if (file.find("tokenizer.ggml.token_type") != nullptr) {
    const std::vector<int64_t> types = file.get_int_array("tokenizer.ggml.token_type");
    vocab.kinds.reserve(types.size());
    for (size_t id = 0; id < types.size(); ++id) {
      if (types[id] < 1 || types[id] > 6) {
        fail(ErrorKind::kCorrupt, "{}: tokenizer.ggml.token_type[{}] = {} is not a token type", file.origin(), id,
             types[id]);
      }
      vocab.kinds.push_back(static_cast<TokenKind>(types[id]));
    }
  }
  if (config.model == TokenizerModel::kSentencePieceBpe && vocab.scores.empty()) {
    fail(ErrorKind::kCorrupt, "{}: a llama tokenizer needs tokenizer.ggml.scores", file.origin());
  }

  config.bos_id = optional_id(file, "tokenizer.ggml.bos_token_id");
  config.eos_id = optional_id(file, "tokenizer.ggml.eos_token_id");
  config.chat_template = file.find("tokenizer.chat_template") ? file.get_string("tokenizer.chat_template") : "";
  if (config.model == TokenizerModel::kByteLevelBpe) {
    config.merges = split_merges(file);
    const GgufValue* pre = file.find("tokenizer.ggml.pre");
    config.pre_tokenizer = PreTokenizer::for_gguf_name(pre ? pre->as_string() : "default");
    config.byte_level.add_prefix_space = optional_bool(file, "tokenizer.ggml.add_space_prefix", false);
    config.add_bos = optional_bool(file, "tokenizer.ggml.add_bos_token", false);
  } else {
    config.sentencepiece.add_dummy_prefix = optional_bool(file, "tokenizer.ggml.add_space_prefix", true);
    config.sentencepiece.unk_id = optional_id(file, "tokenizer.ggml.unknown_token_id");
    config.add_bos = optional_bool(file, "tokenizer.ggml.add_bos_token", true);
  }
  return from_config(std::move(config));
}

}  // namespace pagoda

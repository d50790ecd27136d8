// Tokenizer::from_json: Hugging Face tokenizer.json (model type BPE) plus, when present,
// tokenizer_config.json. Only what changes the ids is interpreted; every normalizer,
// pre-tokenizer and decoder type is either implemented or refused with kUnsupported.
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda {
namespace {

using nlohmann::json;

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581 "▁"
// Vocabularies are dense; ids this far past the number of entries are taken as corruption
// rather than allocated.
constexpr int64_t kMaxIdGap = 1 << 16;

// What the pre-tokenizer and normalizer say about the model's text handling.
struct TextHandling {
  PreTokenizer pre_tokenizer;
  bool byte_level = false;
  bool byte_level_prefix_space = false;
  bool metaspace = false;
  bool metaspace_split = false;
  std::string prepend_scheme = "always";  // Metaspace: always, first, never
  bool legacy_normalizer = false;         // Prepend("▁") + Replace(" ", "▁")
};

const json& member(const json& object, const char* key, std::string_view where) {
  if (!object.is_object() || !object.contains(key)) fail(ErrorKind::kCorrupt, "{}: missing '{}'", where, key);
  return object.at(key);
}

std::string type_of(const json& node, std::string_view where) {
  const json& type = member(node, "type", where);
  if (!type.is_string()) fail(ErrorKind::kCorrupt, "{}: 'type' is not a string", where);
  return type.get<std::string>();
}

SplitBehavior split_behavior(const std::string& name, std::string_view where) {
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  fail(ErrorKind::kUnsupported, "{}: unsupported Split behavior '{}'", where, name);
}

void read_pre_tokenizer(const json& node, TextHandling& text, std::string_view where) {
  if (node.is_null()) return;
  const std::string type = type_of(node, where);
  if (type == "Sequence") {
    for (const json& child : member(node, "pretokenizers", where)) read_pre_tokenizer(child, text, where);
  } else if (type == "ByteLevel") {
    text.byte_level = true;
    text.byte_level_prefix_space = node.value("add_prefix_space", false);
    if (text.byte_level_prefix_space && !text.pre_tokenizer.empty()) {
      fail(ErrorKind::kUnsupported, "{}: ByteLevel with add_prefix_space after another pre-tokenizer", where);
    }
    if (node.value("use_regex", true)) {
      text.pre_tokenizer.add_split(Regex::compile(kGpt2Pattern), SplitBehavior::kIsolated);
    }
  } else if (type == "Split") {
    if (node.value("invert", false)) fail(ErrorKind::kUnsupported, "{}: Split with invert", where);
    const json& pattern = member(node, "pattern", where);
    const bool literal = pattern.contains("String");
    const json& source = literal ? pattern.at("String") : member(pattern, "Regex", where);
    text.pre_tokenizer.add_split(Regex::compile(source.get<std::string>(), literal),
                                 split_behavior(member(node, "behavior", where).get<std::string>(), where));
  } else if (type == "Digits") {
    const char* pattern = node.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)";
    text.pre_tokenizer.add_split(Regex::compile(pattern), SplitBehavior::kIsolated);
  } else if (type == "Metaspace") {
    if (node.value("replacement", std::string(kSpaceMark)) != kSpaceMark) {
      fail(ErrorKind::kUnsupported, "{}: Metaspace replacement other than U+2581", where);
    }
    text.metaspace = true;
    text.metaspace_split = node.value("split", true);
    if (node.contains("prepend_scheme")) {
      text.prepend_scheme = node.at("prepend_scheme").get<std::string>();
    } else {
      text.prepend_scheme = node.value("add_prefix_space", true) ? "always" : "never";
    }
  } else {
    fail(ErrorKind::kUnsupported, "{}: unsupported pre-tokenizer type '{}'", where, type);
  }
}

void read_normalizer(const json& node, TextHandling& text, std::string_view where) {
  if (node.is_null()) return;
  const std::string type = type_of(node, where);
  if (type == "Sequence") {
    for (const json& child : member(node, "normalizers", where)) read_normalizer(child, text, where);
  } else if (type == "Prepend" && node.value("prepend", "") == kSpaceMark) {
    text.legacy_normalizer = true;
  } else if (type == "Replace" && member(node, "pattern", where).value("String", "") == " " &&
             node.value("content", "") == kSpaceMark) {
    text.legacy_normalizer = true;
  } else if (type == "NFC") {
    // Accepted as is: text pagoda receives is taken to be NFC already (nearly all text is);
    // a decomposed accent would tokenize differently from Hugging Face.
  } else {
    fail(ErrorKind::kUnsupported, "{}: unsupported normalizer type '{}'", where, type);
  }
}

// Decoders only confirm the model is one pagoda decodes; the decoding itself follows the model
// type. Returns whether the decoder drops a leading space (SentencePiece dummy prefix).
bool read_decoder(const json& node, std::string_view where) {
  if (node.is_null()) return false;
  const std::string type = type_of(node, where);
  if (type == "Sequence") {
    bool strips = false;
    for (const json& child : member(node, "decoders", where)) strips = read_decoder(child, where) || strips;
    return strips;
  }
  if (type == "Strip") return node.value("start", 0) > 0;
  if (type == "Metaspace") return node.value("prepend_scheme", std::string("always")) != "never";
  if (type == "ByteLevel" || type == "Replace" || type == "ByteFallback" || type == "Fuse") return false;
  fail(ErrorKind::kUnsupported, "{}: unsupported decoder type '{}'", where, type);
}

std::pair<std::string, std::string> read_merge(const json& merge, size_t index, std::string_view where) {
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
    return {merge[0].get<std::string>(), merge[1].get<std::string>()};
  }
  if (merge.is_string()) {
    const std::string line = merge.get<std::string>();
    const size_t space = line.find(' ');
    if (space != std::string::npos && line.find(' ', space + 1) == std::string::npos) {
      return {line.substr(0, space), line.substr(space + 1)};
    }
  }
  fail(ErrorKind::kCorrupt, "{}: model.merges[{}] is not a pair of pieces", where, index);
}

// A token named in tokenizer_config.json: "<s>" or {"content": "<s>", ...}.
std::optional<std::string> config_token(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return std::nullopt;
  const json& value = config.at(key);
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content")) return value.at("content").get<std::string>();
  return std::nullopt;
}

Tokenizer parse(std::string_view tokenizer_json, std::string_view config_json, std::string_view where) {
  const json root = json::parse(tokenizer_json);
  const json config = config_json.empty() ? json::object() : json::parse(config_json);
  const json& model = member(root, "model", where);
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") fail(ErrorKind::kUnsupported, "{}: unsupported tokenizer model type '{}' (pagoda reads BPE)", where, type);
  const auto non_empty_string = [&](const char* key) {
    return model.contains(key) && model.at(key).is_string() && !model.at(key).get<std::string>().empty();
  };
  if (non_empty_string("continuing_subword_prefix") || non_empty_string("end_of_word_suffix")) {
    fail(ErrorKind::kUnsupported, "{}: BPE with subword prefixes or suffixes", where);
  }
  if (model.contains("dropout") && !model.at("dropout").is_null() && model.at("dropout").get<double>() > 0) {
    fail(ErrorKind::kUnsupported, "{}: BPE dropout", where);
  }

  // Vocabulary: model.vocab, then added_tokens (which may extend it).
  const json& vocab_json = member(model, "vocab", where);
  if (!vocab_json.is_object()) fail(ErrorKind::kCorrupt, "{}: model.vocab is not an object", where);
  const json added = root.value("added_tokens", json::array());
  if (!added.is_array()) fail(ErrorKind::kCorrupt, "{}: added_tokens is not an array", where);
  const auto max_id = static_cast<int64_t>(vocab_json.size() + added.size()) + kMaxIdGap;
  int64_t size = 0;
  const auto check_id = [&](int64_t id, std::string_view piece) {
    if (id < 0 || id >= max_id) fail(ErrorKind::kCorrupt, "{}: token '{}' has id {}", where, piece, id);
    size = std::max(size, id + 1);
  };
  for (const auto& [piece, id] : vocab_json.items()) check_id(id.get<int64_t>(), piece);
  for (const json& token : added) check_id(member(token, "id", where).get<int64_t>(), token.value("content", ""));

  TokenizerConfig out;
  out.origin = std::string(where);
  Vocabulary& vocab = out.vocab;
  vocab.pieces.assign(size, "");
  vocab.kinds.assign(size, TokenKind::kUnused);  // ids no entry names stay unused
  const bool byte_fallback = model.value("byte_fallback", false);
  for (const auto& [piece, id] : vocab_json.items()) {
    vocab.pieces[id.get<int64_t>()] = piece;
    const bool byte_piece = piece.size() == 6 && piece.starts_with("<0x") && piece.ends_with(">");
    vocab.kinds[id.get<int64_t>()] = byte_fallback && byte_piece ? TokenKind::kByte : TokenKind::kNormal;
  }
  for (const json& token : added) {
    const int64_t id = token.at("id").get<int64_t>();
    vocab.pieces[id] = member(token, "content", where).get<std::string>();
    vocab.kinds[id] = token.value("special", false) ? TokenKind::kControl : TokenKind::kUserDefined;
  }
  const auto id_of = [&](const std::string& piece) -> int32_t {
    for (int32_t id = 0; id < static_cast<int32_t>(vocab.pieces.size()); ++id) {
      if (vocab.pieces[id] == piece && vocab.kinds[id] != TokenKind::kUnused) return id;
    }
    return -1;
  };

  const json merges = model.value("merges", json::array());
  if (!merges.is_array()) fail(ErrorKind::kCorrupt, "{}: model.merges is not an array", where);
  out.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) out.merges.push_back(read_merge(merges[i], i, where));

  TextHandling text;
  read_normalizer(root.value("normalizer", json()), text, where);
  read_pre_tokenizer(root.value("pre_tokenizer", json()), text, where);
  const bool decoder_strips = read_decoder(root.value("decoder", json()), where);
  if (text.byte_level && !text.metaspace && !text.legacy_normalizer) {
    out.model = TokenizerModel::kByteLevelBpe;
    out.pre_tokenizer = std::move(text.pre_tokenizer);
    out.byte_level.add_prefix_space = text.byte_level_prefix_space;
    out.byte_level.ignore_merges = model.value("ignore_merges", false);
  } else if ((text.metaspace || text.legacy_normalizer) && !text.byte_level && text.pre_tokenizer.empty()) {
    out.model = TokenizerModel::kSentencePieceBpe;
    SentencePieceOptions& spm = out.sentencepiece;
    spm.add_dummy_prefix = text.legacy_normalizer || text.prepend_scheme != "never";
    spm.prefix_every_segment = text.legacy_normalizer || text.prepend_scheme == "always";
    spm.split_on_space = text.metaspace && text.metaspace_split;
    spm.byte_fallback = byte_fallback;
    if (decoder_strips != spm.add_dummy_prefix) {
      fail(ErrorKind::kUnsupported, "{}: a decoder that does not undo the dummy prefix", where);
    }
    const json unk = model.value("unk_token", json());
    if (unk.is_string()) spm.unk_id = id_of(unk.get<std::string>());
  } else {
    fail(ErrorKind::kUnsupported, "{}: BPE whose text handling is neither ByteLevel nor Metaspace", where);
  }

  // bos: tokenizer_config.json, else the special token the post-processor puts first.
  if (const auto bos = config_token(config, "bos_token")) out.bos_id = id_of(*bos);
  if (const auto eos = config_token(config, "eos_token")) out.eos_id = id_of(*eos);
  const json post = root.value("post_processor", json());
  bool post_adds_bos = false;
  if (post.is_object() && post.value("type", "") == "TemplateProcessing" && post.contains("single") &&
      post.at("single").is_array() && !post.at("single").empty() && post.at("single")[0].contains("SpecialToken")) {
    const int32_t id = id_of(post.at("single")[0].at("SpecialToken").value("id", ""));
    if (out.bos_id < 0) out.bos_id = id;
    post_adds_bos = id >= 0;
  }
  out.add_bos = config.value("add_bos_token", post_adds_bos);
  if (config.contains("chat_template")) {
    const json& chat = config.at("chat_template");
    if (chat.is_string()) {
      out.chat_template = chat.get<std::string>();
    } else if (chat.is_array()) {  // named templates: take the default one
      for (const json& named : chat) {
        if (named.value("name", "") == "default") out.chat_template = named.value("template", "");
      }
    }
  }
  return Tokenizer::from_config(std::move(out));
}

}  // namespace

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view tokenizer_config_json,
                               std::string_view origin) {
  try {
    return parse(tokenizer_json, tokenizer_config_json, origin);
  } catch (const json::exception& e) {
    fail(ErrorKind::kCorrupt, "{}: {}", origin, e.what());
  }
}

Tokenizer Tokenizer::from_json_file(const std::string& path) {
  const auto read = [](const std::string& file) -> std::optional<std::string> {
    std::ifstream in(file, std::ios::binary);
    if (!in) return std::nullopt;
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  };
  const std::optional<std::string> tokenizer_json = read(path);
  if (!tokenizer_json) fail(ErrorKind::kNotFound, "cannot open tokenizer file '{}'", path);
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const std::string config = read(dir + "tokenizer_config.json").value_or("");
  return from_json(*tokenizer_json, config, path);
}

}  // namespace pagoda

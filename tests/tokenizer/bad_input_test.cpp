// Bad tokenizer files fail with a pagoda::Error that says what is wrong, never a crash.

#include <gtest/gtest.h>

#include "pagoda/core/error.h"
#include "pagoda/format/gguf.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda {
namespace {

// Runs `load` and returns the Error it throws (fails the test when it does not throw).
template <typename Fn>
Error error_of(Fn load) {
  try {
    load();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a pagoda::Error";
  return Error(ErrorKind::kInternal, "");
}

void expect_error(ErrorKind kind, std::string_view mentions, const std::string& json) {
  const Error e = error_of([&] { Tokenizer::from_json(json); });
  EXPECT_EQ(e.kind(), kind) << e.what();
  EXPECT_NE(std::string(e.what()).find(mentions), std::string::npos) << e.what();
}

const std::string kByteLevelTail =
    R"(,"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":true},"decoder":{"type":"ByteLevel"}})";

TEST(TokenizerBadInput, CorruptJson) {
  expect_error(ErrorKind::kCorrupt, "parse", "{\"model\": ");
  expect_error(ErrorKind::kCorrupt, "model", "[]");
  expect_error(ErrorKind::kCorrupt, "vocab", R"({"model":{"type":"BPE","merges":[]})" + kByteLevelTail);
  expect_error(ErrorKind::kCorrupt, "vocab", R"({"model":{"type":"BPE","vocab":[1,2],"merges":[]})" + kByteLevelTail);
  expect_error(ErrorKind::kCorrupt, "id", R"({"model":{"type":"BPE","vocab":{"a":-4}})" + kByteLevelTail);
  expect_error(ErrorKind::kCorrupt, "merges[0]", R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[7]})" + kByteLevelTail);
}

TEST(TokenizerBadInput, MergeNamingUnknownToken) {
  expect_error(ErrorKind::kCorrupt, "'zz'",
               R"({"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b","zz b"]})" + kByteLevelTail);
  expect_error(ErrorKind::kCorrupt, "'ba'",
               R"({"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":[["b","a"]]})" + kByteLevelTail);
}

TEST(TokenizerBadInput, UnsupportedPartsAreNamed) {
  expect_error(ErrorKind::kUnsupported, "WordPiece", R"({"model":{"type":"WordPiece","vocab":{"a":0}}})");
  expect_error(ErrorKind::kUnsupported, "BertPreTokenizer",
               R"({"model":{"type":"BPE","vocab":{"a":0}},"pre_tokenizer":{"type":"BertPreTokenizer"}})");
  expect_error(ErrorKind::kUnsupported, "NFKC",
               R"({"model":{"type":"BPE","vocab":{"a":0}},"normalizer":{"type":"NFKC"})" + kByteLevelTail.substr(0));
}

TEST(TokenizerBadInput, MinimalByteLevelJsonLoads) {
  const Tokenizer tok = Tokenizer::from_json(
      R"({"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]},"added_tokens":[{"id":3,"content":"<eos>","special":true}])" +
      kByteLevelTail);
  EXPECT_EQ(tok.vocab_size(), 4);
  EXPECT_EQ(tok.encode("abab<eos>", false), (std::vector<int32_t>{2, 2, 3}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{2, 3}, /*skip_special=*/true), "ab");
  EXPECT_THROW(tok.decode(std::vector<int32_t>{9}), Error);
}

TEST(TokenizerBadInput, MissingFile) {
  EXPECT_EQ(error_of([] { Tokenizer::from_json_file("/nonexistent/tokenizer.json"); }).kind(), ErrorKind::kNotFound);
}

// A GGUF v3 file with string metadata only and no tensors.
std::vector<uint8_t> gguf_bytes(const std::vector<std::pair<std::string, std::string>>& strings) {
  std::string out;
  const auto put = [&](const void* data, size_t size) { out.append(static_cast<const char*>(data), size); };
  const auto put_u32 = [&](uint32_t v) { put(&v, 4); };
  const auto put_u64 = [&](uint64_t v) { put(&v, 8); };
  const auto put_string = [&](const std::string& s) {
    put_u64(s.size());
    put(s.data(), s.size());
  };
  put("GGUF", 4);
  put_u32(3);
  put_u64(0);  // tensors
  put_u64(strings.size());
  for (const auto& [key, value] : strings) {
    put_string(key);
    put_u32(8);  // string
    put_string(value);
  }
  return std::vector<uint8_t>(out.begin(), out.end());
}

TEST(TokenizerBadInput, GgufWithoutTokens) {
  const std::vector<uint8_t> bytes = gguf_bytes({{"tokenizer.ggml.model", "gpt2"}});
  const GgufFile file = GgufFile::parse(bytes);
  const Error e = error_of([&] { Tokenizer::from_gguf(file); });
  EXPECT_EQ(e.kind(), ErrorKind::kNotFound) << e.what();
  EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.tokens"), std::string::npos) << e.what();
}

TEST(TokenizerBadInput, GgufUnknownModel) {
  const std::vector<uint8_t> bytes = gguf_bytes({{"tokenizer.ggml.model", "bert"}});
  const Error e = error_of([&] { Tokenizer::from_gguf(GgufFile::parse(bytes)); });
  EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
  EXPECT_NE(std::string(e.what()).find("bert"), std::string::npos);
}

}  // namespace
}  // namespace pagoda

// SmolLM2's byte-level BPE against the Hugging Face tokenizer's ids on the fixture strings, read
// both from the model's GGUF and from the tokenizer.json transformers converted from it.
#include <chrono>

#include <gtest/gtest.h>

#include "fixtures.h"
#include "pagoda/core/default_model.h"
#include "pagoda/format/gguf.h"
#include "pagoda/tokenizer/byte_unicode.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda {
namespace {

using testing::fixture_ids;
using testing::fixture_strings;

const Tokenizer& gguf_tokenizer() {
  static const Tokenizer tokenizer = Tokenizer::from_gguf(GgufFile::open(default_model_path()));
  return tokenizer;
}

const Tokenizer& json_tokenizer() {
  static const Tokenizer tokenizer = Tokenizer::from_json_file(testing::fixture_path("smollm2_tokenizer.json"));
  return tokenizer;
}

void expect_fixture_ids(const Tokenizer& tokenizer) {
  const std::vector<std::string> strings = fixture_strings();
  const std::vector<std::vector<int32_t>> expected = fixture_ids("smollm2_ids.json");
  ASSERT_EQ(strings.size(), expected.size());
  ASSERT_GE(strings.size(), 200u);
  for (size_t i = 0; i < strings.size(); ++i) {
    EXPECT_EQ(tokenizer.encode(strings[i], /*add_bos=*/false), expected[i]) << "string " << i << ": " << strings[i];
  }
}

TEST(SmolLM2Tokenizer, GgufIdsMatchHuggingFace) {
  expect_fixture_ids(gguf_tokenizer());
}

TEST(SmolLM2Tokenizer, JsonIdsMatchHuggingFace) { expect_fixture_ids(json_tokenizer()); }

TEST(SmolLM2Tokenizer, GgufMetadata) {
  const Tokenizer& tok = gguf_tokenizer();
  EXPECT_EQ(tok.vocab_size(), 49152);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_FALSE(tok.add_bos_by_default());
  EXPECT_EQ(tok.token_id("<|im_start|>"), 1);
  EXPECT_TRUE(tok.is_special(1));
  EXPECT_FALSE(tok.is_special(tok.token_id("Hello").value()));
  EXPECT_NE(tok.chat_template_text().find("<|im_start|>"), std::string::npos);
  const std::vector<int32_t> stops = tok.stop_ids();
  EXPECT_EQ(stops.front(), 2);
  EXPECT_NE(std::find(stops.begin(), stops.end(), 0), stops.end());  // <|endoftext|>
  EXPECT_EQ(tok.encode("Hi", /*add_bos=*/true), (std::vector<int32_t>{1, tok.token_id("Hi").value()}));
}

TEST(SmolLM2Tokenizer, SpecialTokensAreTextWithoutParseSpecial) {
  const Tokenizer& tok = json_tokenizer();
  const std::vector<int32_t> parsed = tok.encode("<|im_start|>user", false, /*parse_special=*/true);
  const std::vector<int32_t> literal = tok.encode("<|im_start|>user", false, /*parse_special=*/false);
  EXPECT_EQ(parsed.front(), 1);
  EXPECT_GT(literal.size(), parsed.size());
  EXPECT_EQ(std::find(literal.begin(), literal.end(), 1), literal.end());
  EXPECT_EQ(tok.decode(literal), "<|im_start|>user");
}

TEST(SmolLM2Tokenizer, DecodeRoundTripsAndSkipsSpecials) {
  const Tokenizer& tok = json_tokenizer();
  for (const std::string& text : fixture_strings()) {
    EXPECT_EQ(tok.decode(tok.encode(text, false)), text);
  }
  const std::vector<int32_t> ids = tok.encode("<|im_start|>user\nHi<|im_end|>", false);
  EXPECT_EQ(tok.decode(ids, /*skip_special=*/true), "user\nHi");
}

// Any byte string encodes to the tokens of its bytes. SmolLM2 has no token for bytes that never
// occur in UTF-8 text (C0, C1, F5..FF) nor for a few control characters; those are dropped, as
// Hugging Face drops them.
TEST(SmolLM2Tokenizer, EncodesArbitraryBytesExactly) {
  const Tokenizer& tok = json_tokenizer();
  std::string bytes;
  for (int b = 255; b >= 0; --b) {
    if (tok.token_id(bytes_to_unicode_text(std::string(1, static_cast<char>(b))))) bytes += static_cast<char>(b);
  }
  EXPECT_GT(bytes.size(), 230u);
  std::string decoded;
  for (int32_t id : tok.encode(bytes, false, false)) decoded += tok.token_bytes(id);
  EXPECT_EQ(decoded, bytes);
}

TEST(SmolLM2Tokenizer, IncrementalDecoderEmitsValidUtf8AndTheWholeText) {
  const Tokenizer& tok = json_tokenizer();
  int split_characters = 0;
  for (const std::string& text : fixture_strings()) {
    const std::vector<int32_t> ids = tok.encode(text, false);
    IncrementalDecoder decoder(tok, /*skip_special=*/false);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = decoder.push(id);
      EXPECT_TRUE(testing::is_valid_utf8(piece)) << text;
      if (!testing::is_valid_utf8(tok.token_bytes(id))) ++split_characters;
      streamed += piece;
    }
    streamed += decoder.flush();
    EXPECT_EQ(streamed, text);
  }
  EXPECT_GT(split_characters, 10);  // the strings do exercise characters split across tokens
}

TEST(SmolLM2Tokenizer, IncrementalDecoderMakesBrokenSequencesValid) {
  const Tokenizer& tok = json_tokenizer();
  // The first token of a 4-byte emoji, then plain text: the held bytes become one U+FFFD.
  const std::vector<int32_t> emoji = tok.encode("😀", false);
  ASSERT_GE(emoji.size(), 2u);
  IncrementalDecoder decoder(tok);
  std::string out = decoder.push(emoji[0]);
  EXPECT_EQ(out, "");
  for (int32_t id : tok.encode("ok", false)) out += decoder.push(id);
  out += decoder.flush();
  EXPECT_EQ(out, tok.decode(std::vector<int32_t>{emoji[0], tok.token_id("ok").value()}));
  EXPECT_TRUE(testing::is_valid_utf8(out));
  EXPECT_TRUE(out.ends_with("ok"));
}

TEST(SmolLM2Tokenizer, LongPromptTakesMilliseconds) {
  const Tokenizer& tok = json_tokenizer();
  std::string prompt;
  const std::vector<std::string> strings = fixture_strings();
  for (size_t i = 0; prompt.size() < 9000; ++i) prompt += strings[i % strings.size()] + " ";
  Tokenizer fresh = Tokenizer::from_json_file(testing::fixture_path("smollm2_tokenizer.json"));
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = fresh.encode(prompt, false);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  // Reported, not asserted: tests assert, benchmarks measure.
  std::printf("encoded %zu bytes into %zu tokens in %.2f ms (cold word cache)\n", prompt.size(), ids.size(), ms);
  EXPECT_EQ(tok.decode(ids), prompt);
}

}  // namespace
}  // namespace pagoda

// SentencePiece-style BPE (Llama 2 layout) against Hugging Face on the fixture strings: the same
// small trained model read from tokenizer.json (merges by rank) and from GGUF (merges by score).
#include <gtest/gtest.h>

#include "fixtures.h"
#include "pagoda/format/gguf.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda {
namespace {

using testing::fixture_ids;
using testing::fixture_strings;

const Tokenizer& json_tokenizer() {
  static const Tokenizer tokenizer = Tokenizer::from_json_file(testing::fixture_path("spm_tokenizer.json"));
  return tokenizer;
}

const Tokenizer& gguf_tokenizer() {
  static const Tokenizer tokenizer = Tokenizer::from_gguf(GgufFile::open(testing::fixture_path("spm.gguf")));
  return tokenizer;
}

void expect_fixture_ids(const Tokenizer& tokenizer) {
  const std::vector<std::string> strings = fixture_strings();
  const std::vector<std::vector<int32_t>> expected = fixture_ids("spm_ids.json");
  ASSERT_EQ(strings.size(), expected.size());
  for (size_t i = 0; i < strings.size(); ++i) {
    EXPECT_EQ(tokenizer.encode(strings[i], /*add_bos=*/false), expected[i]) << "string " << i << ": " << strings[i];
  }
}

TEST(SentencePieceTokenizer, JsonIdsMatchHuggingFace) { expect_fixture_ids(json_tokenizer()); }
TEST(SentencePieceTokenizer, GgufIdsMatchHuggingFace) { expect_fixture_ids(gguf_tokenizer()); }

TEST(SentencePieceTokenizer, GgufMetadata) {
  const Tokenizer& tok = gguf_tokenizer();
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_TRUE(tok.add_bos_by_default());
  EXPECT_TRUE(tok.is_special(1));
  EXPECT_EQ(tok.stop_ids(), (std::vector<int32_t>{2}));
  EXPECT_EQ(tok.encode("Hello", /*add_bos=*/true).front(), 1);
}

TEST(SentencePieceTokenizer, UsesSpaceMarkAndByteFallback) {
  const Tokenizer& tok = gguf_tokenizer();
  const std::vector<int32_t> ids = tok.encode("the 🚀", false);
  ASSERT_GE(ids.size(), 5u);
  EXPECT_EQ(tok.token_id("\xE2\x96\x81the"), ids[0]);  // "▁the": the dummy prefix
  // The rocket has no piece: its four bytes become <0xF0> <0x9F> <0x9A> <0x80>.
  EXPECT_EQ(std::vector<int32_t>(ids.end() - 4, ids.end()),
            (std::vector<int32_t>{tok.token_id("<0xF0>").value(), tok.token_id("<0x9F>").value(),
                                  tok.token_id("<0x9A>").value(), tok.token_id("<0x80>").value()}));
  EXPECT_EQ(tok.token_bytes(tok.token_id("<0xF0>").value()), "\xF0");
}

// Text that starts with a space gets no dummy prefix, and decode drops the first space all the
// same: Hugging Face's decode gives back " two" for "  two" too.
std::string without_leading_space(const std::string& text) {
  return text.starts_with(' ') ? text.substr(1) : text;
}

TEST(SentencePieceTokenizer, DecodeRoundTrips) {
  for (const Tokenizer* tok : {&json_tokenizer(), &gguf_tokenizer()}) {
    for (const std::string& text : fixture_strings()) {
      EXPECT_EQ(tok->decode(tok->encode(text, false)), without_leading_space(text));
    }
  }
}

TEST(SentencePieceTokenizer, SkipSpecialDropsControlTokens) {
  const Tokenizer& tok = gguf_tokenizer();
  const std::vector<int32_t> ids = tok.encode("<s>Hello</s>", true);
  EXPECT_EQ(tok.decode(ids, /*skip_special=*/true), "Hello");
  EXPECT_EQ(tok.decode(ids), "<s><s>Hello</s>");
}

TEST(SentencePieceTokenizer, IncrementalDecoderMatchesDecode) {
  const Tokenizer& tok = gguf_tokenizer();
  for (const std::string& text : fixture_strings()) {
    for (bool skip_special : {false, true}) {
      const std::vector<int32_t> ids = tok.encode(text, /*add_bos=*/skip_special);
      IncrementalDecoder decoder(tok, skip_special);
      std::string streamed;
      for (int32_t id : ids) {
        const std::string piece = decoder.push(id);
        EXPECT_TRUE(testing::is_valid_utf8(piece)) << text;
        streamed += piece;
      }
      streamed += decoder.flush();
      EXPECT_EQ(streamed, tok.decode(ids, skip_special));
      if (!skip_special) {
        EXPECT_EQ(streamed, without_leading_space(text));
      }
    }
  }
}

}  // namespace
}  // namespace pagoda

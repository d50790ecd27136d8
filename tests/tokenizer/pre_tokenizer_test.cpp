#include "pagoda/tokenizer/pre_tokenizer.h"

#include <gtest/gtest.h>

#include "pagoda/core/error.h"

namespace pagoda {
namespace {

using Pieces = std::vector<std::string_view>;

TEST(PreTokenizer, Gpt2SplitsWordsContractionsAndSpaces) {
  const PreTokenizer pre = PreTokenizer::for_gguf_name("gpt2");
  EXPECT_EQ(pre.split("Hello world, it's 2024!"),
            (Pieces{"Hello", " world", ",", " it", "'s", " 2024", "!"}));
  // Runs of spaces leave the last one to the next word; \s+(?!\S) keeps trailing ones together.
  EXPECT_EQ(pre.split("a   b  \n"), (Pieces{"a", "  ", " b", "  \n"}));
  EXPECT_EQ(pre.split("café 日本"), (Pieces{"café", " 日本"}));
}

TEST(PreTokenizer, SmolLmIsolatesDigits) {
  EXPECT_EQ(PreTokenizer::for_gguf_name("smollm").split("ab 123"), (Pieces{"ab", " ", "1", "2", "3"}));
}

TEST(PreTokenizer, Llama3GroupsDigitsByThreeAndKeepsNewlines) {
  const PreTokenizer pre = PreTokenizer::for_gguf_name("llama3");
  EXPECT_EQ(pre.split("12345 IT'S\n\nok"), (Pieces{"123", "45", " IT", "'S", "\n\n", "ok"}));
}

TEST(PreTokenizer, Qwen2IsolatesEachDigit) {
  EXPECT_EQ(PreTokenizer::for_gguf_name("qwen2").split("x=42"), (Pieces{"x", "=", "4", "2"}));
}

TEST(PreTokenizer, SplitBehaviors) {
  const auto split = [](SplitBehavior behavior) {
    PreTokenizer pre;
    pre.add_split(Regex::compile("-", /*literal=*/true), behavior);
    return pre.split("a-b--c");
  };
  EXPECT_EQ(split(SplitBehavior::kIsolated), (Pieces{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(split(SplitBehavior::kRemoved), (Pieces{"a", "b", "c"}));
  EXPECT_EQ(split(SplitBehavior::kMergedWithPrevious), (Pieces{"a-", "b-", "-", "c"}));
  EXPECT_EQ(split(SplitBehavior::kMergedWithNext), (Pieces{"a", "-b", "-", "-c"}));
}

TEST(PreTokenizer, InvalidUtf8IsKeptNotDropped) {
  const std::string text = "ab\xFF\xFE cd";
  std::string joined;
  for (std::string_view piece : PreTokenizer::for_gguf_name("gpt2").split(text)) joined += piece;
  EXPECT_EQ(joined, text);
}

TEST(PreTokenizer, UnknownNameIsUnsupported) {
  try {
    PreTokenizer::for_gguf_name("mystery");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("mystery"), std::string::npos);
  }
}

TEST(PreTokenizer, BadRegexIsCorrupt) {
  try {
    Regex::compile("(unclosed");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
  }
}

}  // namespace
}  // namespace pagoda

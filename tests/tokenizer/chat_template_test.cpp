#include "pagoda/tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include "fixtures.h"
#include "pagoda/core/error.h"

namespace pagoda {
namespace {

// Byte for byte what jinja2 renders from SmolLM2's own template (fixture), including the
// default system prompt it adds when the conversation has none.
TEST(ChatTemplate, MatchesSmolLM2JinjaRendering) {
  const nlohmann::json fixture = testing::read_fixture_json("chat_smollm2.json");
  const std::optional<ChatTemplate> kind = detect_chat_template(fixture.at("template").get<std::string>());
  ASSERT_TRUE(kind.has_value());
  EXPECT_EQ(kind->format, ChatFormat::kChatML);
  EXPECT_EQ(kind->default_system_prompt, "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  ASSERT_GE(fixture.at("cases").size(), 6u);
  for (const nlohmann::json& c : fixture.at("cases")) {
    std::vector<ChatMessage> messages;
    for (const nlohmann::json& m : c.at("messages")) messages.push_back({m.at("role"), m.at("content")});
    EXPECT_EQ(apply_chat_template(*kind, messages, c.at("add_generation_prompt").get<bool>()),
              c.at("text").get<std::string>());
  }
}

TEST(ChatTemplate, DetectsFormatsFromMarkers) {
  EXPECT_EQ(detect_chat_template("{{ '<|start_header_id|>' + role }}")->format, ChatFormat::kLlama3);
  EXPECT_EQ(detect_chat_template("{{ bos_token + '[INST] ' + content }}")->format, ChatFormat::kLlama2);
  EXPECT_EQ(detect_chat_template("{{'<|im_start|>' + message['role']}}")->default_system_prompt, "");
  EXPECT_FALSE(detect_chat_template("{{ messages }}").has_value());
}

TEST(ChatTemplate, Llama3) {
  const std::vector<ChatMessage> messages = {{"system", "Be brief. "}, {"user", "Hi"}};
  EXPECT_EQ(apply_chat_template(chat_template_by_name("llama3"), messages, true),
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, Llama2) {
  const std::vector<ChatMessage> messages = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};
  EXPECT_EQ(apply_chat_template(chat_template_by_name("llama2"), messages, true),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye [/INST]");
  const std::vector<ChatMessage> tool = {{"tool", "x"}};
  EXPECT_THROW(apply_chat_template(chat_template_by_name("llama2"), tool, true), Error);
}

TEST(ChatTemplate, ChatMLByNameHasNoDefaultSystem) {
  const std::vector<ChatMessage> messages = {{"user", "Hi"}};
  EXPECT_EQ(apply_chat_template(chat_template_by_name("chatml"), messages, true),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, UnknownNameListsKnownOnes) {
  try {
    chat_template_by_name("vicuna");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    const std::string message = e.what();
    EXPECT_NE(message.find("vicuna"), std::string::npos);
    EXPECT_NE(message.find("chatml, llama3, llama2"), std::string::npos);
  }
}

}  // namespace
}  // namespace pagoda

// Chat prompt formats. pagoda does not run Jinja: it recognises which of the common formats a
// model's template implements (from marker substrings) and renders that format in C++. The
// output never starts with the BOS token; encode with the tokenizer's add_bos_by_default().
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace pagoda {

enum class ChatFormat {
  kChatML,  // <|im_start|>role\ncontent<|im_end|>\n (Qwen2, SmolLM2)
  kLlama3,  // <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
  kLlama2,  // [INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] assistant </s><s>[INST] ...
};

struct ChatTemplate {
  ChatFormat format = ChatFormat::kChatML;
  // Put first when the conversation has no system message ("" for none). Some templates carry
  // one, e.g. SmolLM2's "You are a helpful AI assistant named SmolLM, trained by Hugging Face".
  std::string default_system_prompt;
};

struct ChatMessage {
  std::string role, content;
};

// The format a model's Jinja template implements; nullopt when none is recognised.
std::optional<ChatTemplate> detect_chat_template(std::string_view jinja);
// By name: chatml, llama3, llama2. Throws Error(kInvalidArgument) listing the known names.
ChatTemplate chat_template_by_name(std::string_view name);

// Throws Error(kInvalidArgument) for a role the format cannot express.
std::string apply_chat_template(const ChatTemplate& kind, std::span<const ChatMessage> messages,
                                bool add_generation_prompt);

}  // namespace pagoda

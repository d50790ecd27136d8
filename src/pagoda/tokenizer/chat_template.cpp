#include "pagoda/tokenizer/chat_template.h"

#include <array>

#include "pagoda/core/error.h"

namespace pagoda {
namespace {

struct NamedFormat {
  std::string_view name;
  ChatFormat format;
};
constexpr std::array kNamedFormats = {
    NamedFormat{"chatml", ChatFormat::kChatML},
    NamedFormat{"llama3", ChatFormat::kLlama3},
    NamedFormat{"llama2", ChatFormat::kLlama2},
};

std::string_view trim(std::string_view text) {
  constexpr std::string_view kSpace = " \t\n\r\f\v";
  const size_t begin = text.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return {};
  return text.substr(begin, text.find_last_not_of(kSpace) - begin + 1);
}

// Jinja string literals may spell a newline as "\n"; the template text can hold either.
std::string unescape(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'n') {
      out += '\n';
      ++i;
    } else {
      out += text[i];
    }
  }
  return out;
}

// A ChatML template that writes a fixed system turn when the conversation has none:
// {% if ... != 'system' %}{{ '<|im_start|>system\nDEFAULT<|im_end|>\n' }}{% endif %}.
std::string chatml_default_system_prompt(std::string_view jinja) {
  if (jinja.find("!= 'system'") == std::string_view::npos && jinja.find("!= \"system\"") == std::string_view::npos) {
    return "";
  }
  for (std::string_view header : {std::string_view("<|im_start|>system\n"), std::string_view("<|im_start|>system\\n")}) {
    const size_t begin = jinja.find(header);
    if (begin == std::string_view::npos) continue;
    const size_t text_begin = begin + header.size();
    const size_t end = jinja.find("<|im_end|>", text_begin);
    if (end == std::string_view::npos) continue;
    const std::string_view text = jinja.substr(text_begin, end - text_begin);
    // Only a literal: a template that inserts a variable there is not a fixed default.
    if (text.find_first_of("{}'\"+") != std::string_view::npos) continue;
    return unescape(text);
  }
  return "";
}

}  // namespace

std::optional<ChatTemplate> detect_chat_template(std::string_view jinja) {
  if (jinja.find("<|im_start|>") != std::string_view::npos) {
    return ChatTemplate{ChatFormat::kChatML, chatml_default_system_prompt(jinja)};
  }
  if (jinja.find("<|start_header_id|>") != std::string_view::npos) return ChatTemplate{ChatFormat::kLlama3, ""};
  if (jinja.find("[INST]") != std::string_view::npos) return ChatTemplate{ChatFormat::kLlama2, ""};
  return std::nullopt;
}

ChatTemplate chat_template_by_name(std::string_view name) {
  for (const NamedFormat& named : kNamedFormats) {
    if (named.name == name) return ChatTemplate{named.format, ""};
  }
  std::string known;
  for (const NamedFormat& named : kNamedFormats) {
    known += known.empty() ? "" : ", ";
    known += named.name;
  }
  fail(ErrorKind::kInvalidArgument, "unknown chat template '{}' (known: {})", name, known);
}

namespace {

std::string render_chatml(const ChatTemplate& kind, std::span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string out;
  if (!kind.default_system_prompt.empty() && (messages.empty() || messages[0].role != "system")) {
    out += "<|im_start|>system\n" + kind.default_system_prompt + "<|im_end|>\n";
  }
  for (const ChatMessage& message : messages) {
    out += "<|im_start|>" + message.role + "\n" + message.content + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string render_llama3(std::span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string out;
  for (const ChatMessage& message : messages) {
    out += "<|start_header_id|>" + message.role + "<|end_header_id|>\n\n";
    out += trim(message.content);
    out += "<|eot_id|>";
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// Meta's format: the system prompt is folded into the first user turn; every user turn but the
// first starts with <s> (the first one's comes from the tokenizer). The generation prompt is
// implicit: the text ends after [/INST].
std::string render_llama2(std::span<const ChatMessage> messages) {
  std::string out;
  std::string system;
  bool first_user = true;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if (message.role == "system" && i == 0) {
      system = std::string(trim(message.content));
    } else if (message.role == "user") {
      if (!first_user) out += "<s>";
      out += "[INST] ";
      if (first_user && !system.empty()) out += "<<SYS>>\n" + system + "\n<</SYS>>\n\n";
      out += trim(message.content);
      out += " [/INST]";
      first_user = false;
    } else if (message.role == "assistant") {
      out += " ";
      out += trim(message.content);
      out += " </s>";
    } else {
      fail(ErrorKind::kInvalidArgument,
           "llama2 chat format: message {} has role '{}' (allowed: system first, then user and assistant)", i,
           message.role);
    }
  }
  return out;
}

}  // namespace

std::string apply_chat_template(const ChatTemplate& kind, std::span<const ChatMessage> messages,
                                bool add_generation_prompt) {
  switch (kind.format) {
    case ChatFormat::kChatML: return render_chatml(kind, messages, add_generation_prompt);
    case ChatFormat::kLlama3: return render_llama3(messages, add_generation_prompt);
    case ChatFormat::kLlama2: return render_llama2(messages);
  }
  fail(ErrorKind::kInternal, "unknown chat format {}", static_cast<int>(kind.format));
}

}  // namespace pagoda

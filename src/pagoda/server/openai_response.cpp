#include "pagoda/server/openai_response.h"

#include <algorithm>
#include <cassert>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "pagoda/tokenizer/utf8.h"

namespace pagoda::server {
namespace {

// ordered_json keeps fields in the order OpenAI writes them: "id" first, as people read it.
using nlohmann::ordered_json;

// replace: model and user text need not be valid UTF-8, and dump() throws on invalid bytes.
std::string dump(const ordered_json& value) {
  return value.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

std::string sse_event(const ordered_json& value) { return "data: " + dump(value) + "\n\n"; }

ordered_json finish_reason(FinishReason finish) {
  switch (finish) {
    case FinishReason::kNone: return nullptr;
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: break;
  }
  assert(false && "a cancelled choice has no one to report to");
  return nullptr;
}

// -inf (a token with no probability left) has no JSON spelling; the clients want a number.
double logprob_value(float logprob) { return std::max(double(logprob), -9999.0); }

std::string token_text(const Tokenizer& tokenizer, int32_t id) { return to_valid_utf8(tokenizer.token_bytes(id)); }

ordered_json chat_token_logprob(const Tokenizer& tokenizer, int32_t id, float logprob) {
  ordered_json bytes = ordered_json::array();
  for (unsigned char byte : tokenizer.token_bytes(id)) bytes.push_back(int(byte));
  return {{"token", token_text(tokenizer, id)}, {"logprob", logprob_value(logprob)}, {"bytes", std::move(bytes)}};
}

// {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}
ordered_json chat_logprobs(const GenerationJob& job, std::span<const SampledToken> tokens, const Tokenizer& tokenizer) {
  ordered_json content = ordered_json::array();
  for (const SampledToken& sampled : tokens) {
    ordered_json entry = chat_token_logprob(tokenizer, sampled.token, sampled.logprob);
    ordered_json top = ordered_json::array();
    const size_t shown = std::min(sampled.top_logprobs.size(), size_t(job.top_logprobs));
    for (size_t i = 0; i < shown; ++i) {
      top.push_back(chat_token_logprob(tokenizer, sampled.top_logprobs[i].token, sampled.top_logprobs[i].logprob));
    }
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return {{"content", std::move(content)}};
}

// {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}. Like OpenAI's, each
// top_logprobs entry holds the k most likely tokens plus the chosen one (up to k + 1); tokens
// whose strings coincide (bytes made U+FFFD) keep the first, most likely, value.
ordered_json completion_logprobs(const GenerationJob& job, std::span<const SampledToken> tokens,
                                 const Tokenizer& tokenizer, int32_t text_offset) {
  ordered_json texts = ordered_json::array(), logprobs = ordered_json::array(), tops = ordered_json::array(),
               offsets = ordered_json::array();
  for (const SampledToken& sampled : tokens) {
    const std::string text = token_text(tokenizer, sampled.token);
    ordered_json top = ordered_json::object();
    const size_t shown = std::min(sampled.top_logprobs.size(), size_t(job.top_logprobs));
    for (size_t i = 0; i < shown; ++i) {
      const std::string candidate = token_text(tokenizer, sampled.top_logprobs[i].token);
      if (!top.contains(candidate)) top[candidate] = logprob_value(sampled.top_logprobs[i].logprob);
    }
    if (!top.contains(text)) top[text] = logprob_value(sampled.logprob);
    texts.push_back(text);
    logprobs.push_back(logprob_value(sampled.logprob));
    tops.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += int32_t(count_code_points(text));
  }
  return {{"tokens", std::move(texts)},
          {"token_logprobs", std::move(logprobs)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

ordered_json usage(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

ordered_json envelope(const ResponseIds& ids, std::string_view object) {
  return {{"id", ids.id}, {"object", object}, {"created", ids.created}, {"model", ids.model}};
}

}  // namespace

std::string completion_response_json(const GenerationJob& job, const ResponseIds& ids,
                                     std::span<const ChoiceOutput> choices, const Tokenizer& tokenizer) {
  const bool chat = job.kind == ApiKind::kChat;
  ordered_json out_choices = ordered_json::array();
  int64_t prompt_tokens = 0, completion_tokens = 0;
  std::vector<bool> prompt_counted(job.prompts.size(), false);  // n choices share one prompt
  for (const ChoiceOutput& choice : choices) {
    ordered_json logprobs = nullptr;
    if (job.logprobs) {
      logprobs = chat ? chat_logprobs(job, choice.tokens, tokenizer)
                      : completion_logprobs(job, choice.tokens, tokenizer, /*text_offset=*/0);
    }
    ordered_json out{{"index", choice.index}};
    if (chat) {
      out["message"] = {{"role", "assistant"}, {"content", choice.text}};
    } else {
      out["text"] = choice.text;
    }
    out["logprobs"] = std::move(logprobs);
    out["finish_reason"] = finish_reason(choice.finish);
    if (job.beam_search) {
      out["cumulative_logprob"] = choice.cumulative_logprob;
      out["beam_score"] = choice.beam_score;
    }
    out_choices.push_back(std::move(out));

    const size_t prompt = size_t(choice.index / job.n);
    assert(prompt < prompt_counted.size());
    if (!prompt_counted[prompt]) prompt_tokens += choice.prompt_tokens;
    prompt_counted[prompt] = true;
    completion_tokens += choice.completion_tokens;
  }
  ordered_json response = envelope(ids, chat ? "chat.completion" : "text_completion");
  response["choices"] = std::move(out_choices);
  response["usage"] = usage(prompt_tokens, completion_tokens);
  return dump(response);
}

std::string stream_chunk_event(const GenerationJob& job, const ResponseIds& ids, int32_t index,
                               std::string_view text_delta, std::span<const SampledToken> new_tokens,
                               FinishReason finish, bool first, const Tokenizer& tokenizer, int32_t text_offset) {
  const bool chat = job.kind == ApiKind::kChat;
  ordered_json logprobs = nullptr;
  if (job.logprobs && !new_tokens.empty()) {
    logprobs = chat ? chat_logprobs(job, new_tokens, tokenizer)
                    : completion_logprobs(job, new_tokens, tokenizer, text_offset);
  }
  ordered_json choice{{"index", index}};
  if (chat) {
    // OpenAI's first delta is {"role": "assistant", "content": ""}; the last one may be {}.
    ordered_json delta = ordered_json::object();
    if (first) delta["role"] = "assistant";
    if (first || !text_delta.empty()) delta["content"] = text_delta;
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = text_delta;
  }
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = finish_reason(finish);

  ordered_json chunk = envelope(ids, chat ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = ordered_json::array({std::move(choice)});
  if (job.include_usage) chunk["usage"] = nullptr;  // OpenAI: null on every chunk but the usage one
  return sse_event(chunk);
}

std::string stream_usage_event(const GenerationJob& job, const ResponseIds& ids, int32_t prompt_tokens,
                               int32_t completion_tokens) {
  ordered_json chunk = envelope(ids, job.kind == ApiKind::kChat ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = ordered_json::array();
  chunk["usage"] = usage(prompt_tokens, completion_tokens);
  return sse_event(chunk);
}

std::string models_json(const std::string& model_id, int64_t created, int32_t max_context) {
  const ordered_json model{{"id", model_id},
                           {"object", "model"},
                           {"created", created},
                           {"owned_by", "pagoda"},
                           {"max_model_len", max_context}};
  return dump({{"object", "list"}, {"data", ordered_json::array({model})}});
}

std::string new_response_id(ApiKind kind) {
  // random_device reads the OS's entropy: ids do not repeat across restarts or threads.
  std::random_device random;
  std::string id = kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-";
  for (int i = 0; i < 4; ++i) id += fmt::format("{:08x}", uint32_t(random()));
  return id;
}

}  // namespace pagoda::server

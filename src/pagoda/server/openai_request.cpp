#include "pagoda/server/openai_request.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/server/api_error.h"

namespace pagoda::server {
namespace {

using nlohmann::json;

template <typename... Args>
[[noreturn]] void refuse(std::string param, fmt::format_string<Args...> format, Args&&... args) {
  throw ApiError(400, fmt::format(format, std::forward<Args>(args)...), std::move(param));
}

std::string_view described(const json& value) {
  switch (value.type()) {
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::null: return "null";
    default: return value.is_number_integer() ? "an integer" : "a number";
  }
}

[[noreturn]] void wrong_type(const std::string& param, std::string_view expected, const json& value) {
  refuse(param, "'{}' must be {}, got {}", param, expected, described(value));
}

json parse_body(std::string_view text) {
  json body;
  try {
    body = json::parse(text);
  } catch (const json::exception& e) {
    // parse_error for bad syntax; out_of_range for a number too large for a double (1e999).
    const auto* syntax = dynamic_cast<const json::parse_error*>(&e);
    refuse("",
           "We could not parse the JSON body of your request ({}). The API expects a JSON object: check that "
           "the body is JSON and is sent as it is.",
           syntax ? fmt::format("invalid JSON near byte {}", syntax->byte) : std::string("a number out of range"));
  }
  if (!body.is_object()) refuse("", "The request body must be a JSON object, got {}", described(body));
  return body;
}

// A field's value; nullptr when it is absent or null (the openai clients send null for unset).
const json* find(const json& object, std::string_view key) {
  const auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

const std::string& as_string(const json& value, const std::string& param) {
  if (!value.is_string()) wrong_type(param, "a string", value);
  return value.get_ref<const std::string&>();
}

bool as_bool(const json& value, const std::string& param) {
  if (!value.is_boolean()) wrong_type(param, "a boolean", value);
  return value.get<bool>();
}

int64_t as_int64(const json& value, const std::string& param) {
  if (!value.is_number_integer()) wrong_type(param, "an integer", value);
  if (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
    refuse(param, "'{}' is out of range: {}", param, value.get<uint64_t>());
  }
  return value.get<int64_t>();
}

int32_t as_int32(const json& value, const std::string& param) {
  const int64_t v = as_int64(value, param);
  if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
    refuse(param, "'{}' is out of range: {}", param, v);
  }
  return int32_t(v);
}

// Any JSON number: "temperature": 1 is as good as 1.0.
float as_float(const json& value, const std::string& param) {
  if (!value.is_number()) wrong_type(param, "a number", value);
  const double v = value.get<double>();
  // Casting a double beyond float's range (1e300) is undefined behaviour: refuse it first.
  if (!(std::abs(v) <= std::numeric_limits<float>::max())) refuse(param, "'{}' is out of range: {}", param, v);
  return float(v);
}

int32_t as_token_id(const json& value, const std::string& param, const Tokenizer& tokenizer) {
  if (!value.is_number_integer()) wrong_type(param, "an integer token id", value);
  const bool in_vocab = value.is_number_unsigned() ? value.get<uint64_t>() < uint64_t(tokenizer.vocab_size())
                                                   : value.get<int64_t>() >= 0 &&
                                                         value.get<int64_t>() < tokenizer.vocab_size();
  if (!in_vocab) {
    refuse(param, "Token id {} in '{}' is outside the vocabulary (0 to {})", value.dump(), param,
           tokenizer.vocab_size() - 1);
  }
  return value.get<int32_t>();
}

void check_valid(const SamplingParams& params, const std::string& param) {
  try {
    validate(params);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), param);
  }
}

// validate() owns the ranges. Checking one field on otherwise default parameters tells which
// request field a range error belongs to.
template <typename Set>
void set_checked(SamplingParams& params, const std::string& param, Set set) {
  SamplingParams alone;
  set(alone);
  check_valid(alone, param);
  set(params);
}

void read_float(const json& body, const std::string& name, float SamplingParams::*field, SamplingParams& params) {
  if (const json* value = find(body, name)) {
    const float v = as_float(*value, name);
    set_checked(params, name, [&](SamplingParams& p) { p.*field = v; });
  }
}

void check_model(const json& body, const ModelContext& model) {
  const json* value = find(body, "model");
  if (value == nullptr) return;  // vLLM serves the one model to a request that names none
  const std::string& name = as_string(*value, "model");
  if (name != model.model_id) throw ApiError(404, fmt::format("The model '{}' does not exist", name), "model");
}

[[noreturn]] void not_supported(const std::string& param, std::string_view what) {
  refuse(param, "{} is not supported by this server", what);
}

// Fields the server cannot honour and whose omission would change the output.
void refuse_unsupported(const json& body, ApiKind kind) {
  if (const json* bias = find(body, "logit_bias")) {
    if (!bias->is_object()) wrong_type("logit_bias", "an object", *bias);
    if (!bias->empty()) not_supported("logit_bias", "'logit_bias'");
  }
  if (const json* format = find(body, "response_format")) {
    if (!format->is_object()) wrong_type("response_format", "an object", *format);
    const json* type = find(*format, "type");
    if (type == nullptr || !type->is_string() || type->get_ref<const std::string&>() != "text") {
      not_supported("response_format", "A response_format other than {\"type\": \"text\"}");
    }
  }
  if (kind == ApiKind::kChat) {
    for (const char* name : {"tools", "functions"}) {
      if (const json* list = find(body, name)) {
        if (!list->is_array()) wrong_type(name, "an array", *list);
        if (!list->empty()) not_supported(name, "Tool calling");
      }
    }
    // "none" and "auto" with no tools change nothing.
    for (const char* name : {"tool_choice", "function_call"}) {
      if (const json* choice = find(body, name)) {
        if (!choice->is_string() || (*choice != "none" && *choice != "auto")) not_supported(name, "Tool calling");
      }
    }
  } else {
    if (const json* suffix = find(body, "suffix"); suffix && !as_string(*suffix, "suffix").empty()) {
      not_supported("suffix", "'suffix'");
    }
    if (const json* echo = find(body, "echo"); echo && as_bool(*echo, "echo")) not_supported("echo", "'echo'");
  }
}

// The fields both endpoints share: sampling, n, stop, stream.
void read_common(const json& body, const ModelContext& model, GenerationJob& job) {
  SamplingParams& params = job.params;
  // Not used (it names the end user for OpenAI's abuse monitoring), but typed as OpenAI types it.
  if (const json* user = find(body, "user")) as_string(*user, "user");
  read_float(body, "temperature", &SamplingParams::temperature, params);
  read_float(body, "top_p", &SamplingParams::top_p, params);
  read_float(body, "min_p", &SamplingParams::min_p, params);
  read_float(body, "presence_penalty", &SamplingParams::presence_penalty, params);
  read_float(body, "frequency_penalty", &SamplingParams::frequency_penalty, params);
  read_float(body, "repetition_penalty", &SamplingParams::repetition_penalty, params);

  if (const json* value = find(body, "top_k")) {
    const int32_t k = as_int32(*value, "top_k");
    if (k < -1) refuse("top_k", "top_k must be -1 or 0 (off) or a number of tokens, got {}", k);
    params.top_k = std::max(k, 0);
  }
  if (const json* value = find(body, "seed")) {
    if (!value->is_number_integer()) wrong_type("seed", "an integer", *value);
    // Negative seeds (OpenAI allows them) wrap to 64 bits: distinct seeds stay distinct.
    params.seed = value->is_number_unsigned() ? value->get<uint64_t>() : uint64_t(value->get<int64_t>());
  }
  if (const json* value = find(body, "n")) {
    job.n = as_int32(*value, "n");
    if (job.n < 1 || job.n > kMaxChoices) refuse("n", "n must be between 1 and {}, got {}", kMaxChoices, job.n);
  }

  if (const json* value = find(body, "stop")) {
    std::vector<std::string> stop;
    if (value->is_string()) {
      stop.push_back(value->get<std::string>());
    } else if (value->is_array()) {
      if (value->size() > size_t(kMaxStopStrings)) {
        refuse("stop", "'stop' may hold at most {} strings, got {}", kMaxStopStrings, value->size());
      }
      for (size_t i = 0; i < value->size(); ++i) stop.push_back(as_string((*value)[i], fmt::format("stop[{}]", i)));
    } else {
      wrong_type("stop", "a string or an array of strings", *value);
    }
    for (const std::string& s : stop) {
      if (s.size() > kMaxStopStringBytes) {
        refuse("stop", "stop strings may be at most {} bytes long, got one of {}", kMaxStopStringBytes, s.size());
      }
    }
    set_checked(params, "stop", [&](SamplingParams& p) { p.stop = stop; });
  }
  if (const json* value = find(body, "stop_token_ids")) {
    if (!value->is_array()) wrong_type("stop_token_ids", "an array of token ids", *value);
    if (value->size() > size_t(kMaxStopTokenIds)) {
      refuse("stop_token_ids", "'stop_token_ids' may hold at most {} ids, got {}", kMaxStopTokenIds, value->size());
    }
    for (const json& id : *value) params.stop_token_ids.push_back(as_token_id(id, "stop_token_ids", model.tokenizer));
  }
  if (const json* value = find(body, "ignore_eos")) params.ignore_eos = as_bool(*value, "ignore_eos");

  if (const json* value = find(body, "stream")) job.stream = as_bool(*value, "stream");
  if (const json* options = find(body, "stream_options")) {
    if (!job.stream) refuse("stream_options", "'stream_options' is only allowed when 'stream' is true");
    if (!options->is_object()) wrong_type("stream_options", "an object", *options);
    if (const json* usage = find(*options, "include_usage")) {
      job.include_usage = as_bool(*usage, "stream_options.include_usage");
    }
  }
}

// vLLM's beam-search fields. Called after read_common (n and temperature are known) and before
// the logprobs fields, which validate() refuses for a beam search.
void read_beam_search(const json& body, GenerationJob& job) {
  const json* use = find(body, "use_beam_search");
  job.beam_search = use && as_bool(*use, "use_beam_search");
  if (!job.beam_search) {
    for (const char* name : {"beam_width", "length_penalty", "early_stopping"}) {
      if (find(body, name)) refuse(name, "'{}' needs \"use_beam_search\": true", name);
    }
    return;
  }
  if (job.stream) {
    refuse("stream",
           "streaming is not supported with use_beam_search: the best hypotheses are known only when the search "
           "ends; send \"stream\": false");
  }
  SamplingParams& params = job.params;
  int32_t width = job.n;
  const json* best_of = find(body, "best_of");
  const json* beam_width = find(body, "beam_width");
  if (best_of) width = as_int32(*best_of, "best_of");
  if (beam_width) {
    const int32_t w = as_int32(*beam_width, "beam_width");
    if (best_of && w != width) refuse("beam_width", "'beam_width' ({}) and 'best_of' ({}) differ; send one", w, width);
    width = w;
  }
  const std::string param = beam_width ? "beam_width" : best_of ? "best_of" : "n";
  if (width < 1 || width > kMaxBeamWidth) refuse(param, "the beam width must be between 1 and {}, got {}", kMaxBeamWidth, width);
  if (job.n > width) refuse("n", "n ({}) must be at most the beam width ({}): a beam search returns its best beams", job.n, width);
  params.beam_width = width;
  params.num_return = job.n;
  if (find(body, "temperature") == nullptr) params.temperature = 0.f;
  if (params.temperature != 0.f) refuse("temperature", "beam search is deterministic: temperature must be 0, got {}", params.temperature);
  if (const json* value = find(body, "length_penalty")) params.length_penalty = as_float(*value, "length_penalty");
  if (const json* value = find(body, "early_stopping")) {
    if (value->is_boolean()) {
      params.early_stopping = value->get<bool>() ? EarlyStopping::kTrue : EarlyStopping::kFalse;
    } else if (value->is_string() && value->get_ref<const std::string&>() == "never") {
      params.early_stopping = EarlyStopping::kNever;
    } else {
      wrong_type("early_stopping", "true, false or \"never\"", *value);
    }
  }
  check_valid(params, "use_beam_search");
}

void set_logprobs(GenerationJob& job, int32_t top_logprobs, const char* param) {
  if (job.beam_search) {
    refuse(param, "logprobs are not supported with use_beam_search: each choice carries its cumulative_logprob");
  }
  if (top_logprobs < 0 || top_logprobs > kMaxLogprobs) {
    refuse(param, "{} must be between 0 and {}, got {}", param, kMaxLogprobs, top_logprobs);
  }
  job.logprobs = true;
  job.top_logprobs = top_logprobs;
  job.params.logprobs = std::max(1, top_logprobs);  // the chosen token's logprob needs at least one
}

// max_tokens as requested (nullopt when absent), after checking it is at least 1.
std::optional<int32_t> read_max_tokens(const json& body, const std::string& name) {
  const json* value = find(body, name);
  if (value == nullptr) return std::nullopt;
  const int32_t max_tokens = as_int32(*value, name);
  if (max_tokens < 1) refuse(name, "{} must be at least 1, got {}", name, max_tokens);
  return max_tokens;
}

// Every prompt must leave room for the completion: its max_tokens, or one token when none was
// asked for (it then gets the rest of the context). OpenAI's wording.
void fit_context(GenerationJob& job, std::optional<int32_t> max_tokens, const ModelContext& model) {
  const bool chat = job.kind == ApiKind::kChat;
  const int64_t context = model.max_context;
  for (size_t i = 0; i < job.prompts.size(); ++i) {
    const auto length = int64_t(job.prompts[i].size());
    const std::string param = chat ? "messages" : job.prompts.size() == 1 ? "prompt" : fmt::format("prompt[{}]", i);
    const std::string_view what = chat ? "messages" : "prompt";
    if (max_tokens && length + *max_tokens > context) {
      refuse(param,
             "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the {}, "
             "{} in the completion). Please reduce the length of the {} or completion.",
             context, length + *max_tokens, length, what, *max_tokens, what);
    }
    if (length >= context) {
      refuse(param,
             "This model's maximum context length is {} tokens. However, your {} resulted in {} tokens{}. Please "
             "reduce the length of the {}.",
             context, what, length, length == context ? ", which leaves no room for the completion" : "", what);
    }
    job.max_tokens_per_prompt.push_back(max_tokens ? *max_tokens : int32_t(context - length));
  }
  job.params.max_tokens = *std::min_element(job.max_tokens_per_prompt.begin(), job.max_tokens_per_prompt.end());
  check_valid(job.params, "");  // every field passed alone; this keeps "validated" true whatever validate() adds
}

std::string message_content(const json& message, const std::string& param) {
  const json* content = find(message, "content");
  if (content == nullptr) refuse(param + ".content", "'{}.content' is required", param);
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array()) wrong_type(param + ".content", "a string or an array of content parts", *content);
  // Text parts joined by newlines, as vLLM joins them.
  std::string text;
  for (size_t j = 0; j < content->size(); ++j) {
    const json& part = (*content)[j];
    const std::string part_param = fmt::format("{}.content[{}]", param, j);
    if (!part.is_object()) wrong_type(part_param, "an object", part);
    const json* type = find(part, "type");
    if (type == nullptr) refuse(part_param + ".type", "'{}.type' is required", part_param);
    const std::string& type_name = as_string(*type, part_param + ".type");
    if (type_name != "text") {
      refuse(part_param + ".type", "Content parts of type '{}' are not supported: this model reads text only",
             type_name);
    }
    const json* part_text = find(part, "text");
    if (part_text == nullptr) refuse(part_param + ".text", "'{}.text' is required", part_param);
    if (j > 0) text += '\n';
    text += as_string(*part_text, part_param + ".text");
  }
  return text;
}

std::vector<ChatMessage> read_messages(const json& body) {
  const json* list = find(body, "messages");
  if (list == nullptr) refuse("messages", "'messages' is required");
  if (!list->is_array()) wrong_type("messages", "an array", *list);
  if (list->empty()) refuse("messages", "'messages' must hold at least one message");
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < list->size(); ++i) {
    const json& message = (*list)[i];
    const std::string param = fmt::format("messages[{}]", i);
    if (!message.is_object()) wrong_type(param, "an object", message);
    const json* role = find(message, "role");
    if (role == nullptr) refuse(param + ".role", "'{}.role' is required", param);
    const std::string& role_name = as_string(*role, param + ".role");
    // The formats could render any role, but a tool or developer turn would not mean what the
    // client meant: tools are not supported, and no template here knows "developer".
    if (role_name != "system" && role_name != "user" && role_name != "assistant") {
      refuse(param + ".role", "'{}.role' is '{}'; the roles supported are system, user and assistant", param,
             role_name);
    }
    messages.push_back({role_name, message_content(message, param)});
  }
  return messages;
}

// prompt: a string, an array of strings, an array of token ids, or an array of such arrays.
std::vector<std::vector<int32_t>> read_prompts(const json& body, const Tokenizer& tokenizer) {
  const json* prompt = find(body, "prompt");
  if (prompt == nullptr) refuse("prompt", "'prompt' is required");
  const auto encode = [&](const json& text, const std::string& param) {
    const std::string& s = as_string(text, param);
    // Exactly what `pagoda generate -p` does, so a seed gives the same text there and here.
    std::vector<int32_t> ids = tokenizer.encode(s, tokenizer.add_bos_by_default());
    if (s.empty() || ids.empty()) refuse(param, "'{}' is empty", param);
    return ids;
  };
  const auto ids = [&](const json& list, const std::string& param) {
    if (list.empty()) refuse(param, "'{}' is empty", param);
    std::vector<int32_t> out;
    for (const json& id : list) out.push_back(as_token_id(id, param, tokenizer));
    return out;
  };
  if (prompt->is_string()) return {encode(*prompt, "prompt")};
  if (!prompt->is_array()) {
    wrong_type("prompt", "a string, an array of strings, an array of token ids or an array of token-id arrays",
               *prompt);
  }
  if (prompt->empty()) refuse("prompt", "'prompt' is empty");
  const json& first = prompt->front();
  if (first.is_number()) return {ids(*prompt, "prompt")};
  if (!first.is_string() && !first.is_array()) {
    wrong_type("prompt[0]", "a string, a token id or an array of token ids", first);
  }
  // Checked before any is encoded; with n, again after.
  if (prompt->size() > size_t(kMaxChoicesPerRequest)) {
    refuse("prompt", "one request may hold at most {} prompts, got {}", kMaxChoicesPerRequest, prompt->size());
  }
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < prompt->size(); ++i) {
    const json& item = (*prompt)[i];
    const std::string param = fmt::format("prompt[{}]", i);
    if (first.is_string()) {
      prompts.push_back(encode(item, param));
    } else {
      if (!item.is_array()) wrong_type(param, "an array of token ids, like prompt[0]", item);
      prompts.push_back(ids(item, param));
    }
  }
  return prompts;
}

}  // namespace

GenerationJob parse_chat_request(std::string_view text, const ModelContext& model) {
  const json body = parse_body(text);
  check_model(body, model);
  refuse_unsupported(body, ApiKind::kChat);
  GenerationJob job{.kind = ApiKind::kChat};
  read_common(body, model, job);
  read_beam_search(body, job);

  const json* logprobs_value = find(body, "logprobs");
  const bool logprobs = logprobs_value && as_bool(*logprobs_value, "logprobs");
  const json* top = find(body, "top_logprobs");
  const int32_t top_logprobs = top ? as_int32(*top, "top_logprobs") : 0;
  if (logprobs) {
    set_logprobs(job, top_logprobs, "top_logprobs");
  } else if (top_logprobs != 0) {
    refuse("top_logprobs", "'top_logprobs' needs \"logprobs\": true");
  }

  const std::vector<ChatMessage> messages = read_messages(body);
  std::string prompt;
  try {
    prompt = apply_chat_template(model.chat_template, messages, /*add_generation_prompt=*/true);
  } catch (const Error& e) {
    refuse("messages", "{}", e.what());
  }
  job.prompts.push_back(model.tokenizer.encode(prompt, model.tokenizer.add_bos_by_default()));
  if (job.prompts[0].empty()) refuse("messages", "The messages make an empty prompt");

  // OpenAI renamed max_tokens to max_completion_tokens; the new name wins when both are sent.
  const bool new_name = find(body, "max_completion_tokens") != nullptr;
  fit_context(job, read_max_tokens(body, new_name ? "max_completion_tokens" : "max_tokens"), model);
  return job;
}

GenerationJob parse_completion_request(std::string_view text, const ModelContext& model) {
  const json body = parse_body(text);
  check_model(body, model);
  refuse_unsupported(body, ApiKind::kCompletion);
  GenerationJob job{.kind = ApiKind::kCompletion};
  read_common(body, model, job);
  read_beam_search(body, job);

  // best_of picks the most likely of several samples: only best_of == n (no picking) is served,
  // unless it is a beam search's width.
  if (const json* best_of = find(body, "best_of");
      !job.beam_search && best_of && as_int32(*best_of, "best_of") != job.n) {
    not_supported("best_of", "'best_of' other than n (without \"use_beam_search\": true)");
  }
  if (const json* logprobs = find(body, "logprobs")) set_logprobs(job, as_int32(*logprobs, "logprobs"), "logprobs");

  job.prompts = read_prompts(body, model.tokenizer);
  if (job.prompts.size() * size_t(job.n) > size_t(kMaxChoicesPerRequest)) {
    refuse("prompt", "{} prompts x n = {} make {} choices; one request may ask for at most {}", job.prompts.size(),
           job.n, job.prompts.size() * size_t(job.n), kMaxChoicesPerRequest);
  }
  fit_context(job, read_max_tokens(body, "max_tokens"), model);
  return job;
}

SamplingParams choice_params(const GenerationJob& job, int32_t index) {
  assert(index >= 0 && size_t(index) < job.prompts.size() * size_t(job.n));
  SamplingParams params = job.params;
  params.max_tokens = job.max_tokens_per_prompt[size_t(index / job.n)];
  if (job.beam_search) return params;  // deterministic: no seed to vary
  if (params.seed) *params.seed += uint64_t(index);  // wraps modulo 2^64, like the seed itself
  return params;
}

}  // namespace pagoda::server

// OpenAI request bodies -> GenerationJob with the real SmolLM2 tokenizer: every refusal names
// its status and field, defaults match OpenAI/vLLM, and prompts are the tokens `pagoda generate`
// and `pagoda chat` would make.
#include "pagoda/server/openai_request.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>

#include <fmt/format.h>

#include "pagoda/core/default_model.h"
#include "pagoda/format/gguf.h"
#include "pagoda/server/api_error.h"

namespace pagoda::server {
namespace {

const Tokenizer& tokenizer() {
  static const Tokenizer tokenizer = Tokenizer::from_gguf(GgufFile::open(default_model_path()));
  return tokenizer;
}

const ChatTemplate& chat_template() {
  static const ChatTemplate chat_template = detect_chat_template(tokenizer().chat_template_text()).value();
  return chat_template;
}

ModelContext model(int32_t max_context = 8192) { return {tokenizer(), chat_template(), "smollm2", max_context}; }

constexpr std::string_view kHello = R"("messages": [{"role": "user", "content": "Hello"}])";

std::string chat_body(std::string_view extra) {
  return fmt::format("{{{}{}{}}}", kHello, extra.empty() ? "" : ", ", extra);
}
std::string completion_body(std::string_view extra) {
  return fmt::format(R"({{"prompt": "Once upon a time"{}{}}})", extra.empty() ? "" : ", ", extra);
}

struct Refusal {
  std::string body;
  int status;
  std::string param;
  std::string message_part;  // a piece of the message a person reads
};

void expect_refusals(ApiKind kind, const std::vector<Refusal>& cases, int32_t max_context = 8192) {
  for (const Refusal& c : cases) {
    SCOPED_TRACE(c.body);
    try {
      if (kind == ApiKind::kChat) {
        parse_chat_request(c.body, model(max_context));
      } else {
        parse_completion_request(c.body, model(max_context));
      }
      ADD_FAILURE() << "accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, c.status) << e.what();
      EXPECT_EQ(e.param, c.param) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.message_part), std::string::npos) << e.what();
    }
  }
}

// `item` n times, comma-separated: the inside of a long JSON array.
std::string repeated(const std::string& item, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += (i ? "," : "") + item;
  return out;
}

TEST(OpenAiRequest, BodiesThatAreNotObjects) {
  for (ApiKind kind : {ApiKind::kChat, ApiKind::kCompletion}) {
    expect_refusals(kind, {{"", 400, "", "could not parse the JSON body"},
                           {"{\"messages\": [", 400, "", "could not parse the JSON body"},
                           {"{'a': 1}", 400, "", "could not parse the JSON body"},
                           {"{\"prompt\": \"\xff\"}", 400, "", "could not parse the JSON body"},
                           {"[1, 2]", 400, "", "must be a JSON object, got an array"},
                           {"\"hi\"", 400, "", "must be a JSON object, got a string"}});
  }
}

TEST(OpenAiRequest, ChatRefusals) {
  std::string long_text;  // " hello" is one token: 9000 of them do not fit 8192
  for (int i = 0; i < 9000; ++i) long_text += " hello";
  expect_refusals(
      ApiKind::kChat,
      {
          {chat_body(R"("model": "gpt-4")"), 404, "model", "The model 'gpt-4' does not exist"},
          {chat_body(R"("model": 5)"), 400, "model", "must be a string"},
          {chat_body(R"("user": 5)"), 400, "user", "must be a string"},
          {"{}", 400, "messages", "'messages' is required"},
          {R"({"messages": null})", 400, "messages", "is required"},
          {R"({"messages": {}})", 400, "messages", "'messages' must be an array, got an object"},
          {R"({"messages": []})", 400, "messages", "at least one message"},
          {R"({"messages": ["hi"]})", 400, "messages[0]", "must be an object, got a string"},
          {R"({"messages": [{"content": "hi"}]})", 400, "messages[0].role", "is required"},
          {R"({"messages": [{"role": "user"}]})", 400, "messages[0].content", "is required"},
          {R"({"messages": [{"role": 1, "content": "x"}]})", 400, "messages[0].role", "must be a string"},
          {R"({"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "x"}]})", 400,
           "messages[1].role", "system, user and assistant"},
          {R"({"messages": [{"role": "user", "content": 5}]})", 400, "messages[0].content",
           "a string or an array of content parts"},
          {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})",
           400, "messages[0].content[0].type", "'image_url' are not supported"},
          {R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})", 400, "messages[0].content[0].text",
           "is required"},
          {R"({"messages": [{"role": "user", "content": [{"text": "hi"}]}]})", 400, "messages[0].content[0].type",
           "is required"},
          {R"({"messages": [{"role": "user", "content": ["hi"]}]})", 400, "messages[0].content[0]",
           "must be an object"},
          {chat_body(R"("max_tokens": "10")"), 400, "max_tokens", "'max_tokens' must be an integer, got a string"},
          {chat_body(R"("max_tokens": 10.0)"), 400, "max_tokens", "must be an integer, got a number"},
          {chat_body(R"("max_tokens": 0)"), 400, "max_tokens", "at least 1"},
          {chat_body(R"("max_tokens": -5)"), 400, "max_tokens", "at least 1"},
          {chat_body(R"("max_tokens": 10000000000)"), 400, "max_tokens", "out of range"},
          {chat_body(R"("max_tokens": 18446744073709551615)"), 400, "max_tokens", "out of range"},
          {chat_body(R"("max_completion_tokens": 0, "max_tokens": 5)"), 400, "max_completion_tokens", "at least 1"},
          {chat_body(R"("temperature": "hot")"), 400, "temperature", "must be a number, got a string"},
          {chat_body(R"("temperature": -1)"), 400, "temperature", "temperature must be >= 0"},
          {chat_body(R"("temperature": 1e999)"), 400, "", "could not parse the JSON body of your request (a number"},
          {chat_body(R"("temperature": 1e300)"), 400, "temperature", "out of range"},
          {chat_body(R"("top_p": 0)"), 400, "top_p", "top_p must be in (0, 1]"},
          {chat_body(R"("top_p": 1.5)"), 400, "top_p", "top_p"},
          {chat_body(R"("top_k": -2)"), 400, "top_k", "-1 or 0"},
          {chat_body(R"("top_k": 1.5)"), 400, "top_k", "must be an integer"},
          {chat_body(R"("min_p": 2)"), 400, "min_p", "min_p must be in [0, 1]"},
          {chat_body(R"("presence_penalty": 3)"), 400, "presence_penalty", "[-2, 2]"},
          {chat_body(R"("frequency_penalty": -2.5)"), 400, "frequency_penalty", "[-2, 2]"},
          {chat_body(R"("repetition_penalty": 0)"), 400, "repetition_penalty", "[0.01, 100]"},
          {chat_body(R"("stop": ")" + std::string(1025, 'x') + "\""), 400, "stop", "at most 1024 bytes"},
          {chat_body(R"("n": 0)"), 400, "n", "between 1 and 16"},
          {chat_body(R"("n": 17)"), 400, "n", "between 1 and 16"},
          {chat_body(R"("n": "2")"), 400, "n", "must be an integer"},
          {chat_body(R"("stop": 5)"), 400, "stop", "a string or an array of strings"},
          {chat_body(R"("stop": ["a", 1])"), 400, "stop[1]", "must be a string"},
          {chat_body(R"("stop": "")"), 400, "stop", "must not be empty"},
          {chat_body(R"("stop": ["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"])"), 400,
           "stop", "at most 16"},
          {chat_body(R"("stop_token_ids": [-1])"), 400, "stop_token_ids", "outside the vocabulary (0 to 49151)"},
          {chat_body(R"("stop_token_ids": [49152])"), 400, "stop_token_ids", "outside the vocabulary"},
          {chat_body(R"("stop_token_ids": 2)"), 400, "stop_token_ids", "an array of token ids"},
          {chat_body("\"stop_token_ids\": [" + repeated("0", 65) + "]"), 400, "stop_token_ids", "at most 64 ids"},
          {chat_body(R"("seed": 1.5)"), 400, "seed", "must be an integer"},
          {chat_body(R"("seed": "1")"), 400, "seed", "must be an integer"},
          {chat_body(R"("ignore_eos": 1)"), 400, "ignore_eos", "must be a boolean"},
          {chat_body(R"("stream": "yes")"), 400, "stream", "must be a boolean"},
          {chat_body(R"("stream_options": {"include_usage": true})"), 400, "stream_options",
           "only allowed when 'stream' is true"},
          {chat_body(R"("stream": true, "stream_options": {"include_usage": 1})"), 400,
           "stream_options.include_usage", "must be a boolean"},
          {chat_body(R"("logprobs": 1)"), 400, "logprobs", "must be a boolean"},
          {chat_body(R"("logprobs": true, "top_logprobs": 21)"), 400, "top_logprobs", "between 0 and 20"},
          {chat_body(R"("logprobs": true, "top_logprobs": -1)"), 400, "top_logprobs", "between 0 and 20"},
          {chat_body(R"("top_logprobs": 3)"), 400, "top_logprobs", "\"logprobs\": true"},
          {chat_body(R"("tools": [{"type": "function", "function": {"name": "f"}}])"), 400, "tools", "not supported"},
          {chat_body(R"("tool_choice": "required")"), 400, "tool_choice", "not supported"},
          {chat_body(R"("functions": [{"name": "f"}])"), 400, "functions", "not supported"},
          {chat_body(R"("response_format": {"type": "json_object"})"), 400, "response_format", "not supported"},
          {chat_body(R"("response_format": "json")"), 400, "response_format", "must be an object"},
          {chat_body(R"("logit_bias": {"50256": -100})"), 400, "logit_bias", "not supported"},
          {fmt::format(R"({{"messages": [{{"role": "user", "content": "{}"}}]}})", long_text), 400, "messages",
           "This model's maximum context length is 8192 tokens. However, your messages resulted in"},
      });
}

TEST(OpenAiRequest, ChatContextLimits) {
  // Exactly what the messages make, so the limits below sit on the boundary.
  const int32_t prompt = int32_t(parse_chat_request(chat_body(""), model()).prompts[0].size());
  expect_refusals(ApiKind::kChat,
                  {{chat_body("\"max_tokens\": 2"), 400, "messages",
                    fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                                "({} in the messages, 2 in the completion). Please reduce the length of the messages "
                                "or completion.",
                                prompt + 1, prompt + 2, prompt)}},
                  prompt + 1);
  expect_refusals(ApiKind::kChat,
                  {{chat_body(""), 400, "messages",
                    fmt::format("This model's maximum context length is {0} tokens. However, your messages resulted "
                                "in {0} tokens, which leaves no room for the completion.",
                                prompt)}},
                  prompt);
  const GenerationJob job = parse_chat_request(chat_body("\"max_tokens\": 1"), model(prompt + 1));
  EXPECT_EQ(job.params.max_tokens, 1);
  EXPECT_EQ(parse_chat_request(chat_body(""), model(prompt + 1)).params.max_tokens, 1);
}

TEST(OpenAiRequest, CompletionRefusals) {
  expect_refusals(ApiKind::kCompletion,
                  {
                      {"{}", 400, "prompt", "'prompt' is required"},
                      {R"({"prompt": ""})", 400, "prompt", "'prompt' is empty"},
                      {R"({"prompt": []})", 400, "prompt", "'prompt' is empty"},
                      {R"({"prompt": ["a", ""]})", 400, "prompt[1]", "'prompt[1]' is empty"},
                      {R"({"prompt": [[]]})", 400, "prompt[0]", "'prompt[0]' is empty"},
                      {R"({"prompt": 5})", 400, "prompt", "a string, an array of strings"},
                      {R"({"prompt": [{"a": 1}]})", 400, "prompt[0]", "must be a string, a token id"},
                      {R"({"prompt": [49152]})", 400, "prompt", "Token id 49152 in 'prompt' is outside"},
                      {R"({"prompt": [-1]})", 400, "prompt", "Token id -1"},
                      {R"({"prompt": [1.5]})", 400, "prompt", "must be an integer token id"},
                      {R"({"prompt": [1, "a"]})", 400, "prompt", "must be an integer token id, got a string"},
                      {R"({"prompt": ["a", 1]})", 400, "prompt[1]", "must be a string"},
                      {R"({"prompt": [[1, 2], 3]})", 400, "prompt[1]", "an array of token ids"},
                      {R"({"prompt": [[1, 2], [99999]]})", 400, "prompt[1]", "outside the vocabulary"},
                      {completion_body(R"("model": "davinci")"), 404, "model", "The model 'davinci' does not exist"},
                      // A small body must not make a mountain of work: prompts and prompts x n are capped.
                      {"{\"prompt\": [" + repeated("[1]", 65) + "]}", 400, "prompt", "at most 64 prompts, got 65"},
                      {"{\"n\": 16, \"prompt\": [" + repeated("\"a\"", 5) + "]}", 400, "prompt",
                       "make 80 choices; one request may ask for at most 64"},
                      {completion_body(R"("suffix": "end")"), 400, "suffix", "not supported"},
                      {completion_body(R"("echo": true)"), 400, "echo", "not supported"},
                      {completion_body(R"("best_of": 2)"), 400, "best_of", "not supported"},
                      {completion_body(R"("best_of": 1.0)"), 400, "best_of", "must be an integer"},
                      {completion_body(R"("logprobs": 21)"), 400, "logprobs", "between 0 and 20"},
                      {completion_body(R"("logprobs": true)"), 400, "logprobs", "must be an integer"},
                      {completion_body(R"("max_tokens": 0)"), 400, "max_tokens", "at least 1"},
                      {completion_body(R"("temperature": [1])"), 400, "temperature", "must be a number"},
                      {completion_body(R"("response_format": {"type": "json_schema"})"), 400, "response_format",
                       "not supported"},
                  });
  // Token prompts are counted as they are: 8 tokens do not fit a context of 8.
  expect_refusals(ApiKind::kCompletion,
                  {{R"({"prompt": [1, 2, 3, 4, 5, 6, 7, 8]})", 400, "prompt",
                    "maximum context length is 8 tokens. However, your prompt resulted in 8 tokens"},
                   {R"({"prompt": [[1], [1, 2, 3, 4, 5, 6, 7, 8, 9]]})", 400, "prompt[1]", "resulted in 9 tokens"},
                   {R"({"prompt": [1, 2, 3], "max_tokens": 6})", 400, "prompt",
                    "you requested 9 tokens (3 in the prompt, 6 in the completion). Please reduce the length of the "
                    "prompt or completion."}},
                  8);
}

TEST(OpenAiRequest, ChatDefaults) {
  const GenerationJob job = parse_chat_request(fmt::format("{{{}}}", kHello), model());
  const SamplingParams defaults;
  EXPECT_EQ(job.kind, ApiKind::kChat);
  ASSERT_EQ(job.prompts.size(), 1u);
  EXPECT_EQ(job.n, 1);
  EXPECT_FALSE(job.stream);
  EXPECT_FALSE(job.include_usage);
  EXPECT_FALSE(job.logprobs);
  EXPECT_EQ(job.top_logprobs, 0);
  const SamplingParams& p = job.params;
  EXPECT_EQ(p.temperature, 1.0f);
  EXPECT_EQ(p.top_p, 1.0f);
  EXPECT_EQ(p.top_k, 0);
  EXPECT_EQ(p.min_p, 0.0f);
  EXPECT_EQ(p.presence_penalty, 0.0f);
  EXPECT_EQ(p.frequency_penalty, 0.0f);
  EXPECT_EQ(p.repetition_penalty, 1.0f);
  EXPECT_FALSE(p.seed.has_value());
  EXPECT_TRUE(p.stop.empty());
  EXPECT_TRUE(p.stop_token_ids.empty());
  EXPECT_FALSE(p.ignore_eos);
  EXPECT_EQ(p.logprobs, 0);
  // No max_tokens: the rest of the context.
  EXPECT_EQ(p.max_tokens, 8192 - int32_t(job.prompts[0].size()));
  EXPECT_EQ(job.max_tokens_per_prompt, std::vector<int32_t>{p.max_tokens});
}

TEST(OpenAiRequest, NullMeansAbsentAndUnknownFieldsAreIgnored) {
  const GenerationJob job = parse_chat_request(
      chat_body(R"("model": null, "temperature": null, "max_tokens": null, "stop": null, "seed": null, "n": null,
                    "logprobs": null, "top_logprobs": null, "tool_choice": "none", "user": "u1",
                    "response_format": {"type": "text"}, "logit_bias": {}, "tools": [], "parallel_tool_calls": true,
                    "some_future_field": {"x": [1, 2]})"),
      model());
  EXPECT_EQ(job.params.temperature, 1.0f);
  EXPECT_FALSE(job.params.seed.has_value());
  EXPECT_EQ(job.n, 1);
  EXPECT_FALSE(job.logprobs);
  EXPECT_NO_THROW(parse_chat_request(chat_body(R"("model": "smollm2", "tool_choice": "auto")"), model()));
  EXPECT_NO_THROW(parse_completion_request(completion_body(R"("suffix": "", "echo": false, "best_of": 3, "n": 3)"),
                                           model()));
}

TEST(OpenAiRequest, ChatReadsEveryField) {
  const GenerationJob job = parse_chat_request(
      chat_body(R"("model": "smollm2", "temperature": 0, "top_p": 0.5, "top_k": 40, "min_p": 0.05,
                    "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
                    "seed": 42, "max_tokens": 100, "max_completion_tokens": 20, "n": 3,
                    "stop": ["\n\n", "END"], "stop_token_ids": [2, 5], "ignore_eos": true,
                    "stream": true, "stream_options": {"include_usage": true},
                    "logprobs": true, "top_logprobs": 5)"),
      model());
  const SamplingParams& p = job.params;
  EXPECT_EQ(p.temperature, 0.0f);  // an integer where a float goes
  EXPECT_EQ(p.top_p, 0.5f);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_EQ(p.min_p, 0.05f);
  EXPECT_EQ(p.presence_penalty, 0.5f);
  EXPECT_EQ(p.frequency_penalty, -0.5f);
  EXPECT_EQ(p.repetition_penalty, 1.1f);
  EXPECT_EQ(p.seed, 42u);
  EXPECT_EQ(p.max_tokens, 20);  // max_completion_tokens wins
  EXPECT_EQ(job.n, 3);
  EXPECT_EQ(p.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(p.stop_token_ids, (std::vector<int32_t>{2, 5}));
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_TRUE(job.stream);
  EXPECT_TRUE(job.include_usage);
  EXPECT_TRUE(job.logprobs);
  EXPECT_EQ(job.top_logprobs, 5);
  EXPECT_EQ(p.logprobs, 5);
}

TEST(OpenAiRequest, SmallVariants) {
  EXPECT_EQ(parse_chat_request(chat_body(R"("top_k": -1)"), model()).params.top_k, 0);  // vLLM's "off"
  EXPECT_EQ(parse_chat_request(chat_body(R"("stop": "###")"), model()).params.stop, std::vector<std::string>{"###"});
  EXPECT_EQ(parse_chat_request(chat_body(R"("seed": -1)"), model()).params.seed,
            std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(parse_chat_request(chat_body(R"("seed": 18446744073709551615)"), model()).params.seed,
            std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(parse_chat_request(chat_body(R"("max_tokens": 7)"), model()).params.max_tokens, 7);
  EXPECT_FALSE(parse_chat_request(chat_body(R"("stream": true)"), model()).include_usage);

  // logprobs without top_logprobs: the engine is asked for one so the chosen token's exists.
  const GenerationJob chat = parse_chat_request(chat_body(R"("logprobs": true)"), model());
  EXPECT_TRUE(chat.logprobs);
  EXPECT_EQ(chat.top_logprobs, 0);
  EXPECT_EQ(chat.params.logprobs, 1);
  EXPECT_FALSE(parse_chat_request(chat_body(R"("logprobs": false, "top_logprobs": 0)"), model()).logprobs);

  const GenerationJob zero = parse_completion_request(completion_body(R"("logprobs": 0)"), model());
  EXPECT_TRUE(zero.logprobs);
  EXPECT_EQ(zero.top_logprobs, 0);
  EXPECT_EQ(zero.params.logprobs, 1);
  const GenerationJob twenty = parse_completion_request(completion_body(R"("logprobs": 20)"), model());
  EXPECT_EQ(twenty.top_logprobs, 20);
  EXPECT_EQ(twenty.params.logprobs, 20);
}

TEST(OpenAiRequest, ChatPromptIsTheTemplateEncoded) {
  const GenerationJob job = parse_chat_request(
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                       {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]})",
      model());
  const std::vector<ChatMessage> messages = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "2+2?"}};
  const std::string text = apply_chat_template(chat_template(), messages, true);
  EXPECT_EQ(job.prompts[0], tokenizer().encode(text, tokenizer().add_bos_by_default()));
  // And independently of apply_chat_template: SmolLM2's ChatML, special tokens as single ids.
  EXPECT_EQ(tokenizer().decode(job.prompts[0]),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "Hello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(job.prompts[0].front(), tokenizer().token_id("<|im_start|>").value());

  // Text parts are joined with newlines: the same prompt as the joined string.
  const GenerationJob parts = parse_chat_request(
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})",
      model());
  const GenerationJob joined = parse_chat_request(R"({"messages": [{"role": "user", "content": "a\nb"}]})", model());
  EXPECT_EQ(parts.prompts, joined.prompts);
  // Without a system message SmolLM2's template puts its default one first.
  EXPECT_TRUE(tokenizer().decode(joined.prompts[0]).starts_with("<|im_start|>system\nYou are a helpful AI assistant"));
}

TEST(OpenAiRequest, CompletionPrompts) {
  const Tokenizer& tok = tokenizer();
  const auto encode = [&](std::string_view text) { return tok.encode(text, tok.add_bos_by_default()); };

  const GenerationJob one = parse_completion_request(R"({"prompt": "Once upon a time"})", model());
  EXPECT_EQ(one.kind, ApiKind::kCompletion);
  EXPECT_EQ(one.prompts, std::vector<std::vector<int32_t>>{encode("Once upon a time")});

  const GenerationJob strings = parse_completion_request(R"({"prompt": ["Hello", "The capital of France is"]})", model());
  EXPECT_EQ(strings.prompts, (std::vector<std::vector<int32_t>>{encode("Hello"), encode("The capital of France is")}));

  const GenerationJob ids = parse_completion_request(R"({"prompt": [1, 2, 3]})", model());
  EXPECT_EQ(ids.prompts, (std::vector<std::vector<int32_t>>{{1, 2, 3}}));

  const GenerationJob id_lists = parse_completion_request(R"({"prompt": [[5], [6, 7, 49151]]})", model());
  EXPECT_EQ(id_lists.prompts, (std::vector<std::vector<int32_t>>{{5}, {6, 7, 49151}}));
}

TEST(OpenAiRequest, MaxTokensPerPrompt) {
  // No max_tokens: each prompt gets the rest of the context after it.
  const GenerationJob rest = parse_completion_request(R"({"prompt": [[1, 2, 3], [1]], "n": 2})", model(10));
  EXPECT_EQ(rest.max_tokens_per_prompt, (std::vector<int32_t>{7, 9}));
  EXPECT_EQ(rest.params.max_tokens, 7);  // the smallest: valid for every prompt
  EXPECT_EQ(choice_params(rest, 0).max_tokens, 7);
  EXPECT_EQ(choice_params(rest, 1).max_tokens, 7);
  EXPECT_EQ(choice_params(rest, 2).max_tokens, 9);
  EXPECT_EQ(choice_params(rest, 3).max_tokens, 9);

  const GenerationJob fixed = parse_completion_request(R"({"prompt": [[1, 2, 3], [1]], "max_tokens": 5})", model(10));
  EXPECT_EQ(fixed.max_tokens_per_prompt, (std::vector<int32_t>{5, 5}));
}

TEST(OpenAiRequest, ChoiceSeeds) {
  const GenerationJob job = parse_completion_request(R"({"prompt": ["a", "b"], "n": 3, "seed": 100})", model());
  ASSERT_EQ(job.prompts.size(), 2u);
  for (int32_t i = 0; i < 6; ++i) {
    const SamplingParams p = choice_params(job, i);
    EXPECT_EQ(p.seed, 100u + uint64_t(i)) << i;
    EXPECT_EQ(p.temperature, job.params.temperature);
  }
  // Seeds wrap rather than overflow.
  const GenerationJob wrap = parse_chat_request(chat_body(R"("n": 2, "seed": -1)"), model());
  EXPECT_EQ(choice_params(wrap, 1).seed, 0u);
  // No seed: every choice draws its own.
  const GenerationJob unseeded = parse_chat_request(chat_body(R"("n": 2)"), model());
  EXPECT_FALSE(choice_params(unseeded, 1).seed.has_value());
}


// vLLM's beam-search extension: the width from beam_width, best_of or n; n hypotheses returned.
TEST(OpenAiRequest, BeamSearchFields) {
  const GenerationJob chat = parse_chat_request(
      chat_body(R"("use_beam_search": true, "n": 2, "best_of": 4, "length_penalty": 0.5, "early_stopping": "never")"),
      model());
  EXPECT_TRUE(chat.beam_search);
  EXPECT_EQ(chat.n, 2);
  EXPECT_EQ(chat.params.beam_width, 4);
  EXPECT_EQ(chat.params.num_return, 2);
  EXPECT_EQ(chat.params.length_penalty, 0.5f);
  EXPECT_EQ(chat.params.early_stopping, EarlyStopping::kNever);
  EXPECT_EQ(chat.params.temperature, 0.f);  // absent: 0, as a beam search needs
  const SamplingParams choice = choice_params(chat, 0);
  EXPECT_EQ(choice.beam_width, 4);
  EXPECT_FALSE(choice.seed.has_value());

  const GenerationJob completion = parse_completion_request(
      completion_body(R"("use_beam_search": true, "beam_width": 8, "early_stopping": true, "temperature": 0)"), model());
  EXPECT_EQ(completion.n, 1);
  EXPECT_EQ(completion.params.beam_width, 8);
  EXPECT_EQ(completion.params.early_stopping, EarlyStopping::kTrue);
  const GenerationJob by_n = parse_completion_request(completion_body(R"("use_beam_search": true, "n": 3)"), model());
  EXPECT_EQ(by_n.params.beam_width, 3);
  EXPECT_EQ(by_n.params.num_return, 3);
  EXPECT_EQ(by_n.params.early_stopping, EarlyStopping::kFalse);
}

TEST(OpenAiRequest, BeamSearchRefusals) {
  for (const ApiKind kind : {ApiKind::kChat, ApiKind::kCompletion}) {
    const auto body = [&](std::string_view extra) {
      return kind == ApiKind::kChat ? chat_body(extra) : completion_body(extra);
    };
    expect_refusals(kind, {
        {body(R"("use_beam_search": true, "stream": true)"), 400, "stream", "streaming is not supported with use_beam_search"},
        {body(R"("use_beam_search": true, "beam_width": 65)"), 400, "beam_width", "between 1 and 64, got 65"},
        {body(R"("use_beam_search": true, "best_of": 0)"), 400, "best_of", "between 1 and 64, got 0"},
        {body(R"("use_beam_search": true, "n": 5, "best_of": 4)"), 400, "n", "n (5) must be at most the beam width (4)"},
        {body(R"("use_beam_search": true, "best_of": 2, "beam_width": 4)"), 400, "beam_width", "differ"},
        {body(R"("use_beam_search": true, "temperature": 0.8)"), 400, "temperature", "temperature must be 0"},
        {body(R"("use_beam_search": true, "early_stopping": "sometimes")"), 400, "early_stopping", "true, false or"},
        {body(R"("use_beam_search": true, "length_penalty": "long")"), 400, "length_penalty", "must be a number"},
        {body(R"("use_beam_search": true, "presence_penalty": 0.5)"), 400, "use_beam_search", "penalties"},
        {body(R"("use_beam_search": 1)"), 400, "use_beam_search", "must be a boolean"},
        {body(R"("beam_width": 4)"), 400, "beam_width", "needs \"use_beam_search\": true"},
        {body(R"("length_penalty": 1.5)"), 400, "length_penalty", "needs \"use_beam_search\": true"},
        {body(R"("early_stopping": true)"), 400, "early_stopping", "needs \"use_beam_search\": true"},
    });
  }
  expect_refusals(ApiKind::kChat, {{chat_body(R"("use_beam_search": true, "logprobs": true)"), 400, "top_logprobs",
                                    "not supported with use_beam_search"}});
  expect_refusals(ApiKind::kCompletion, {{completion_body(R"("use_beam_search": true, "logprobs": 1)"), 400, "logprobs",
                                          "not supported with use_beam_search"},
                                         {completion_body(R"("best_of": 4, "temperature": 0.7)"), 400, "best_of",
                                          "without \"use_beam_search\": true"}});
}

}  // namespace
}  // namespace pagoda::server

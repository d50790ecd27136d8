// OpenAI response bodies, parsed back and checked field by field against the shapes the openai
// clients read: chat.completion, text_completion, streamed chunks, usage, the model list.
#include "pagoda/server/openai_response.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "pagoda/core/default_model.h"
#include "pagoda/format/gguf.h"

namespace pagoda::server {
namespace {

using nlohmann::json;

const Tokenizer& tokenizer() {
  static const Tokenizer tokenizer = Tokenizer::from_gguf(GgufFile::open(default_model_path()));
  return tokenizer;
}

int32_t id_of(std::string_view piece) { return tokenizer().token_id(piece).value(); }

// A token that is one byte >= 0x80: never valid UTF-8 on its own.
int32_t invalid_utf8_token() {
  for (int32_t id = 0; id < tokenizer().vocab_size(); ++id) {
    const std::string bytes = tokenizer().token_bytes(id);
    if (bytes.size() == 1 && static_cast<unsigned char>(bytes[0]) >= 0x80) return id;
  }
  ADD_FAILURE() << "no single-byte token >= 0x80";
  return 0;
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

GenerationJob job(ApiKind kind, int32_t num_prompts = 1, int32_t n = 1) {
  GenerationJob job{.kind = kind, .n = n};
  job.prompts.assign(size_t(num_prompts), {1, 2, 3});
  return job;
}

const ResponseIds kIds{"chatcmpl-0123", 1700000000, "smollm2"};

json parse_event(const std::string& event) {
  EXPECT_TRUE(event.starts_with("data: ")) << event;
  EXPECT_TRUE(event.ends_with("\n\n")) << event;
  EXPECT_EQ(event.find('\n'), event.size() - 2) << "one line of data: " << event;
  return json::parse(event.substr(6));
}

SampledToken sampled(int32_t token, float logprob, std::vector<TokenLogprob> top = {}) {
  return {.token = token, .logprob = logprob, .top_logprobs = std::move(top)};
}

std::vector<int> byte_values(const std::string& bytes) {
  std::vector<int> out;
  for (unsigned char b : bytes) out.push_back(b);
  return out;
}

TEST(OpenAiResponse, ChatCompletion) {
  const ChoiceOutput choice{.index = 0, .text = "Paris.", .finish = FinishReason::kStop, .prompt_tokens = 12,
                            .completion_tokens = 3};
  const json r = json::parse(completion_response_json(job(ApiKind::kChat), kIds, {&choice, 1}, tokenizer()));
  EXPECT_EQ(r["id"], "chatcmpl-0123");
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["created"], 1700000000);
  EXPECT_EQ(r["model"], "smollm2");
  ASSERT_EQ(r["choices"].size(), 1u);
  const json& c = r["choices"][0];
  EXPECT_EQ(c["index"], 0);
  EXPECT_EQ(c["message"], (json{{"role", "assistant"}, {"content", "Paris."}}));
  EXPECT_TRUE(c.contains("logprobs") && c["logprobs"].is_null());
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_EQ(r["usage"], (json{{"prompt_tokens", 12}, {"completion_tokens", 3}, {"total_tokens", 15}}));
}

TEST(OpenAiResponse, UsageCountsEachPromptOnce) {
  // 2 prompts x n = 2: prompts of 10 and 20 tokens, each shared by two choices.
  std::vector<ChoiceOutput> choices;
  for (int32_t i = 0; i < 4; ++i) {
    choices.push_back({.index = i, .text = "x", .finish = i == 3 ? FinishReason::kLength : FinishReason::kStop,
                       .prompt_tokens = i < 2 ? 10 : 20, .completion_tokens = i + 1});
  }
  const json r = json::parse(
      completion_response_json(job(ApiKind::kCompletion, 2, 2), {"cmpl-1", 1, "m"}, choices, tokenizer()));
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["usage"], (json{{"prompt_tokens", 30}, {"completion_tokens", 10}, {"total_tokens", 40}}));
  ASSERT_EQ(r["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r["choices"][i]["index"], i);
    EXPECT_EQ(r["choices"][i]["text"], "x");
    EXPECT_TRUE(r["choices"][i]["logprobs"].is_null());
  }
  EXPECT_EQ(r["choices"][2]["finish_reason"], "stop");
  EXPECT_EQ(r["choices"][3]["finish_reason"], "length");
}

TEST(OpenAiResponse, ChatLogprobs) {
  const int32_t hello = id_of("Hello"), world = id_of("Ġworld"), comma = id_of(",");
  GenerationJob with_top = job(ApiKind::kChat);
  with_top.logprobs = true;
  with_top.top_logprobs = 2;
  const ChoiceOutput choice{
      .text = "Hello world",
      .tokens = {sampled(hello, -0.5f, {{hello, -0.5f}, {comma, -1.5f}, {world, -3.0f}}),
                 sampled(world, -0.25f, {{world, -0.25f}})},
      .finish = FinishReason::kLength};
  const json r = json::parse(completion_response_json(with_top, kIds, {&choice, 1}, tokenizer()));
  const json& content = r["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "Hello");
  EXPECT_EQ(content[0]["logprob"], -0.5);
  EXPECT_EQ(content[0]["bytes"], json(byte_values("Hello")));
  ASSERT_EQ(content[0]["top_logprobs"].size(), 2u);  // trimmed to top_logprobs
  EXPECT_EQ(content[0]["top_logprobs"][0], (json{{"token", "Hello"}, {"logprob", -0.5}, {"bytes", byte_values("Hello")}}));
  EXPECT_EQ(content[0]["top_logprobs"][1], (json{{"token", ","}, {"logprob", -1.5}, {"bytes", byte_values(",")}}));
  EXPECT_EQ(content[1]["token"], " world");
  EXPECT_EQ(content[1]["bytes"], json(byte_values(" world")));
  EXPECT_EQ(content[1]["top_logprobs"].size(), 1u);  // fewer survivors than asked for

  // logprobs: true with top_logprobs 0: the engine gave one, the response lists none.
  GenerationJob no_top = with_top;
  no_top.top_logprobs = 0;
  const json bare = json::parse(completion_response_json(no_top, kIds, {&choice, 1}, tokenizer()));
  for (const json& token : bare["choices"][0]["logprobs"]["content"]) {
    EXPECT_TRUE(token["top_logprobs"].is_array());
    EXPECT_TRUE(token["top_logprobs"].empty());
  }
}

TEST(OpenAiResponse, InvalidUtf8StaysValidJson) {
  const int32_t bad = invalid_utf8_token();
  const std::string raw = tokenizer().token_bytes(bad);
  GenerationJob chat = job(ApiKind::kChat);
  chat.logprobs = true;
  chat.top_logprobs = 1;
  // The text too: a choice's text should already be valid, but a bad byte must not throw.
  const ChoiceOutput choice{.text = "a" + raw + "b", .tokens = {sampled(bad, -1.0f, {{bad, -1.0f}})},
                            .finish = FinishReason::kStop};
  std::string body;
  ASSERT_NO_THROW(body = completion_response_json(chat, kIds, {&choice, 1}, tokenizer()));
  const json r = json::parse(body);  // throws on invalid UTF-8
  EXPECT_EQ(r["choices"][0]["message"]["content"], "a" + std::string(kReplacement) + "b");
  const json& token = r["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(token["token"], kReplacement);
  EXPECT_EQ(token["bytes"], json(byte_values(raw)));  // the raw bytes survive here
  EXPECT_EQ(token["top_logprobs"][0]["token"], kReplacement);

  GenerationJob completion = job(ApiKind::kCompletion);
  completion.logprobs = true;
  const json c = json::parse(completion_response_json(completion, kIds, {&choice, 1}, tokenizer()));
  EXPECT_EQ(c["choices"][0]["logprobs"]["tokens"][0], kReplacement);
  EXPECT_EQ(c["choices"][0]["logprobs"]["top_logprobs"][0], (json{{std::string(kReplacement), -1.0}}));

  const std::string event = stream_chunk_event(chat, kIds, 0, raw, choice.tokens, FinishReason::kNone, false,
                                               tokenizer(), 0);
  EXPECT_EQ(parse_event(event)["choices"][0]["delta"]["content"], kReplacement);
}

TEST(OpenAiResponse, CompletionLogprobs) {
  const int32_t hello = id_of("Hello"), world = id_of("Ġworld"), comma = id_of(","), e_acute = id_of("Ã©");
  ASSERT_EQ(tokenizer().token_bytes(e_acute), "\xC3\xA9");  // "é": 2 bytes, 1 character
  GenerationJob completion = job(ApiKind::kCompletion);
  completion.logprobs = true;
  completion.top_logprobs = 1;
  const ChoiceOutput choice{
      .text = "Helloé world",
      .tokens = {sampled(hello, -0.5f, {{hello, -0.5f}, {comma, -2.0f}}),
                 sampled(e_acute, -std::numeric_limits<float>::infinity(), {{comma, -0.125f}}),
                 sampled(world, -0.25f, {{world, -0.25f}})},
      .finish = FinishReason::kStop};
  const json r = json::parse(completion_response_json(completion, kIds, {&choice, 1}, tokenizer()));
  const json& lp = r["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], (json{"Hello", "é", " world"}));
  EXPECT_EQ(lp["token_logprobs"], (json{-0.5, -9999.0, -0.25}));  // -inf has no JSON spelling
  // The k most likely plus the chosen token.
  EXPECT_EQ(lp["top_logprobs"][0], (json{{"Hello", -0.5}}));
  EXPECT_EQ(lp["top_logprobs"][1], (json{{",", -0.125}, {"é", -9999.0}}));
  EXPECT_EQ(lp["top_logprobs"][2], (json{{" world", -0.25}}));
  EXPECT_EQ(lp["text_offset"], (json{0, 5, 6}));  // characters, not bytes

  // logprobs: 0 still lists the chosen token.
  completion.top_logprobs = 0;
  const json zero = json::parse(completion_response_json(completion, kIds, {&choice, 1}, tokenizer()));
  EXPECT_EQ(zero["choices"][0]["logprobs"]["top_logprobs"][0], (json{{"Hello", -0.5}}));

  // Streamed: the offsets continue from the characters already sent.
  const std::vector<SampledToken> tail(choice.tokens.begin() + 1, choice.tokens.end());
  const json chunk = parse_event(
      stream_chunk_event(completion, kIds, 0, "é world", tail, FinishReason::kNone, false, tokenizer(), 5));
  EXPECT_EQ(chunk["choices"][0]["logprobs"]["text_offset"], (json{5, 6}));
  EXPECT_EQ(chunk["choices"][0]["logprobs"]["tokens"], (json{"é", " world"}));
}

TEST(OpenAiResponse, ChatStream) {
  GenerationJob chat = job(ApiKind::kChat, 1, 2);
  const json first = parse_event(stream_chunk_event(chat, kIds, 1, "", {}, FinishReason::kNone, true, tokenizer(), 0));
  EXPECT_EQ(first["id"], "chatcmpl-0123");
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["created"], 1700000000);
  EXPECT_EQ(first["model"], "smollm2");
  EXPECT_FALSE(first.contains("usage"));
  ASSERT_EQ(first["choices"].size(), 1u);
  EXPECT_EQ(first["choices"][0]["index"], 1);
  EXPECT_EQ(first["choices"][0]["delta"], (json{{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(first["choices"][0]["logprobs"].is_null());
  EXPECT_TRUE(first["choices"][0].contains("finish_reason"));
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());

  const json middle =
      parse_event(stream_chunk_event(chat, kIds, 0, "Hi\nthere", {}, FinishReason::kNone, false, tokenizer(), 0));
  EXPECT_EQ(middle["choices"][0]["delta"], (json{{"content", "Hi\nthere"}}));

  const json last = parse_event(stream_chunk_event(chat, kIds, 0, "", {}, FinishReason::kLength, false, tokenizer(), 0));
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");

  chat.logprobs = true;
  chat.include_usage = true;
  const SampledToken token = sampled(id_of("Hi"), -0.125f, {{id_of("Hi"), -0.125f}});
  const json with_logprobs =
      parse_event(stream_chunk_event(chat, kIds, 0, "Hi", {&token, 1}, FinishReason::kStop, false, tokenizer(), 0));
  EXPECT_TRUE(with_logprobs.contains("usage") && with_logprobs["usage"].is_null());
  EXPECT_EQ(with_logprobs["choices"][0]["logprobs"]["content"][0]["token"], "Hi");
  EXPECT_EQ(with_logprobs["choices"][0]["logprobs"]["content"][0]["logprob"], -0.125);
  EXPECT_TRUE(with_logprobs["choices"][0]["logprobs"]["content"][0]["top_logprobs"].empty());
  EXPECT_EQ(with_logprobs["choices"][0]["finish_reason"], "stop");

  const json usage = parse_event(stream_usage_event(chat, kIds, 12, 34));
  EXPECT_EQ(usage["object"], "chat.completion.chunk");
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"], (json{{"prompt_tokens", 12}, {"completion_tokens", 34}, {"total_tokens", 46}}));
  EXPECT_EQ(kStreamDone, "data: [DONE]\n\n");
}

TEST(OpenAiResponse, CompletionStream) {
  const GenerationJob completion = job(ApiKind::kCompletion);
  const ResponseIds ids{"cmpl-9", 5, "smollm2"};
  const json chunk =
      parse_event(stream_chunk_event(completion, ids, 0, " upon", {}, FinishReason::kNone, true, tokenizer(), 0));
  EXPECT_EQ(chunk["object"], "text_completion");
  EXPECT_EQ(chunk["choices"][0], (json{{"index", 0}, {"text", " upon"}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
  EXPECT_EQ(parse_event(stream_usage_event(completion, ids, 1, 2))["object"], "text_completion");
}

TEST(OpenAiResponse, Models) {
  const json r = json::parse(models_json("smollm2", 42, 8192));
  EXPECT_EQ(r, (json{{"object", "list"},
                     {"data", {{{"id", "smollm2"}, {"object", "model"}, {"created", 42}, {"owned_by", "pagoda"},
                                {"max_model_len", 8192}}}}}));
}

TEST(OpenAiResponse, ResponseIds) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string chat = new_response_id(ApiKind::kChat);
    ASSERT_TRUE(chat.starts_with("chatcmpl-")) << chat;
    ASSERT_EQ(chat.size(), 9u + 32u) << chat;
    EXPECT_EQ(chat.find_first_not_of("0123456789abcdef", 9), std::string::npos) << chat;
    seen.insert(chat);
  }
  EXPECT_EQ(seen.size(), 100u);
  const std::string completion = new_response_id(ApiKind::kCompletion);
  EXPECT_TRUE(completion.starts_with("cmpl-")) << completion;
  EXPECT_EQ(completion.size(), 5u + 32u);
}


// A beam search's choices carry their cumulative log-probability and score; usage counts the
// tokens of every beam once (the API puts them all on the prompt's first choice).
TEST(OpenAiResponse, BeamSearchChoices) {
  GenerationJob beam = job(ApiKind::kCompletion, 1, 2);
  beam.beam_search = true;
  const std::vector<ChoiceOutput> choices = {
      {.index = 0, .text = " Paris.", .finish = FinishReason::kStop, .prompt_tokens = 5, .completion_tokens = 40,
       .cumulative_logprob = -1.5f, .beam_score = -0.5f},
      {.index = 1, .text = " Lyon.", .finish = FinishReason::kLength, .prompt_tokens = 5, .completion_tokens = 0,
       .cumulative_logprob = -3.f, .beam_score = -0.75f}};
  const json r = json::parse(completion_response_json(beam, kIds, choices, tokenizer()));
  ASSERT_EQ(r["choices"].size(), 2u);
  EXPECT_EQ(r["choices"][0]["cumulative_logprob"], -1.5);
  EXPECT_EQ(r["choices"][0]["beam_score"], -0.5);
  EXPECT_EQ(r["choices"][1]["cumulative_logprob"], -3.0);
  EXPECT_EQ(r["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(r["usage"], (json{{"prompt_tokens", 5}, {"completion_tokens", 40}, {"total_tokens", 45}}));
  const json plain = json::parse(completion_response_json(job(ApiKind::kCompletion), kIds, {choices.data(), 1}, tokenizer()));
  EXPECT_FALSE(plain["choices"][0].contains("cumulative_logprob"));
}

}  // namespace
}  // namespace pagoda::server

// The OpenAI response bodies: chat.completion, text_completion, their streamed chunks
// (server-sent events), usage and the model list, shaped so the official clients parse them.
//
// Token strings in logprobs are the token's bytes made valid UTF-8 (invalid bytes become U+FFFD;
// chat logprobs also carry the raw bytes). A logprob of -inf is written as -9999.0 (vLLM's
// choice): JSON has no infinity and the clients want a number. Completions' text_offset counts
// characters (code points, as Python's str does) of the token strings.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/engine/request.h"
#include "pagoda/engine/sampler.h"
#include "pagoda/server/openai_request.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda::server {

// One choice, accumulated over its events.
struct ChoiceOutput {
  int32_t index = 0;
  std::string text;
  std::vector<SampledToken> tokens;  // every generated token with its logprobs (when job.logprobs)
  FinishReason finish = FinishReason::kNone;
  int32_t prompt_tokens = 0, completion_tokens = 0;
  // A beam search's hypothesis: written as the choice's "cumulative_logprob" (sum of its tokens'
  // natural-log probabilities) and "beam_score" (that over length^length_penalty, the ranking).
  float cumulative_logprob = 0.f, beam_score = 0.f;
};

struct ResponseIds {
  std::string id;  // new_response_id()
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// Non-streaming: a chat.completion or text_completion with every choice and usage
// {prompt_tokens (each prompt once, not once per choice), completion_tokens, total_tokens}.
std::string completion_response_json(const GenerationJob& job, const ResponseIds& ids,
                                     std::span<const ChoiceOutput> choices, const Tokenizer& tokenizer);

// Streaming: one SSE event "data: {...}\n\n" for choice `index`: its new text and tokens, and
// its finish_reason once finish is not kNone. `first`: a chat delta also carries the role.
// text_offset matters for completions with logprobs only: the characters (code points) of this
// choice's text streamed before this chunk, where the chunk's text_offset values start.
std::string stream_chunk_event(const GenerationJob& job, const ResponseIds& ids, int32_t index,
                               std::string_view text_delta, std::span<const SampledToken> new_tokens,
                               FinishReason finish, bool first, const Tokenizer& tokenizer,
                               int32_t text_offset = 0);
// The last event before [DONE] when stream_options.include_usage: choices [] and usage.
std::string stream_usage_event(const GenerationJob& job, const ResponseIds& ids, int32_t prompt_tokens,
                               int32_t completion_tokens);
inline constexpr std::string_view kStreamDone = "data: [DONE]\n\n";

// GET /v1/models: {"object":"list","data":[{id, object:"model", created, owned_by:"pagoda", max_model_len}]}
std::string models_json(const std::string& model_id, int64_t created, int32_t max_context);

// "chatcmpl-" or "cmpl-" and 32 random hex digits.
std::string new_response_id(ApiKind kind);

}  // namespace pagoda::server

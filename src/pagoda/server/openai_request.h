// The OpenAI request bodies (/v1/chat/completions, /v1/completions) turned into a GenerationJob:
// token ids per prompt and validated sampling parameters. Anything the server cannot honour as
// asked throws ApiError (400, or 404 for an unknown model) naming the field at fault, before any
// work is queued.
//
// Decisions where OpenAI and vLLM differ (vLLM's choice unless it would change the output
// silently):
//  - "model" may be omitted (vLLM); when given it must be the served model's id, else 404.
//  - Unknown fields are ignored (vLLM). Known fields the server cannot honour and that change
//    the output are refused: tools, a tool_choice other than "none"/"auto", functions,
//    function_call, logit_bias, a response_format other than {"type":"text"}, and for
//    completions suffix, echo: true and best_of != n.
//  - null for an optional field means "absent" (the openai clients send it that way).
//  - Integer fields take JSON integers only (10.0 is refused); float fields take any number.
//  - max_tokens absent: the context left after the prompt, per prompt (vLLM's chat default;
//    OpenAI's legacy completions default is 16). Chat's max_completion_tokens wins over
//    max_tokens when both are given.
//  - n: 1..16, and prompts x n at most 64. stop: a string or up to 16 strings (OpenAI allows 4,
//    vLLM any number) of up to 1 KiB each; stop_token_ids: up to 64.
//  - top_k: 0 or -1 is off (-1 is vLLM's spelling). seed: any 64-bit integer, negative ones
//    taken modulo 2^64.
//  - completions logprobs: 0..20 like vLLM (OpenAI caps it at 5).
//  - vLLM's beam-search extension, on both endpoints: "use_beam_search": true with "beam_width"
//    or "best_of" (the beams, 1..64; default n), "n" (hypotheses returned, <= the beams),
//    "length_penalty", "early_stopping" (true, false or "never"). temperature defaults to 0 and
//    must stay 0; stream and logprobs are refused (the hypotheses are known only at the end, and
//    each choice carries its cumulative_logprob instead). Those fields without use_beam_search
//    are refused rather than ignored.
//  - chat content may be an array of {"type":"text"} parts, joined with "\n" (vLLM); other part
//    types (images, audio) are refused. Roles: system, user, assistant.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/engine/sampling_params.h"
#include "pagoda/tokenizer/chat_template.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda::server {

enum class ApiKind { kChat, kCompletion };

// What parsing needs to know about the served model.
struct ModelContext {
  const Tokenizer& tokenizer;
  const ChatTemplate& chat_template;
  std::string model_id;  // "model" must be this when given
  int32_t max_context;   // tokens: prompt + completion must fit
};

// Bounds on what one request may ask for, so a small body cannot make the server build an
// enormous amount of work or copies of its parameters (each choice holds its own).
inline constexpr int32_t kMaxChoices = 16;             // n
inline constexpr int32_t kMaxChoicesPerRequest = 64;   // prompts x n
inline constexpr int32_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopStringBytes = 1024;
inline constexpr int32_t kMaxStopTokenIds = 64;

struct GenerationJob {
  ApiKind kind = ApiKind::kChat;
  // Token ids. Chat: exactly one; completions: one per prompt of the request.
  std::vector<std::vector<int32_t>> prompts;
  int32_t n = 1;  // choices per prompt; choice index = prompt_index * n + j
  // Validated. max_tokens is the smallest of max_tokens_per_prompt: use choice_params() for a
  // choice's own parameters.
  SamplingParams params;
  // Per prompt: the requested max_tokens, or the context left after that prompt when none was.
  std::vector<int32_t> max_tokens_per_prompt;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Chat: "logprobs": true; completions: "logprobs": k (any k >= 0). params.logprobs is then
  // max(1, top_logprobs) so the chosen token's logprob exists; responses show top_logprobs.
  bool logprobs = false;
  int32_t top_logprobs = 0;  // chat: top_logprobs; completions: k
  // use_beam_search: one engine request per prompt (params.beam_width beams) returning its n best
  // hypotheses as the prompt's n choices.
  bool beam_search = false;
};

GenerationJob parse_chat_request(std::string_view body, const ModelContext& model);
GenerationJob parse_completion_request(std::string_view body, const ModelContext& model);

// The parameters of choice `index` (0-based over all prompts x n): its prompt's max_tokens, and
// the seed params.seed + index when a seed was given, so n > 1 choices differ but stay
// reproducible.
SamplingParams choice_params(const GenerationJob& job, int32_t index);

}  // namespace pagoda::server

// A generation request and the events the engine reports back for it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pagoda/engine/sampler.h"
#include "pagoda/engine/sampling_params.h"

namespace pagoda {

using RequestId = int64_t;

struct Request {
  std::vector<int32_t> prompt;  // token ids, BOS included when the model wants one
  SamplingParams params;
  // Disaggregated serving (disagg/, Engine's remote prefill): a prefill server computes the
  // prompt's KV and first token (decode server), or the KV outlives the request until
  // release_kept_kv so that it can be sent (prefill server).
  bool prefill_remotely = false;
  bool keep_kv = false;
};

enum class FinishReason : uint8_t {
  kNone,       // still generating
  kStop,       // EOS, a stop token or a stop string
  kLength,     // max_tokens reached, or the model's context is full
  kCancelled,  // cancel() was called
};

const char* finish_reason_name(FinishReason reason);

// One hypothesis of a finished beam-search request.
struct BeamOutput {
  std::vector<int32_t> tokens;  // generated tokens, the stop token included when one ended it
  std::string text;             // valid UTF-8, cut before a stop string
  float cumulative_logprob = 0.f;  // sum of the tokens' log-probabilities (natural log)
  float score = 0.f;               // cumulative_logprob / tokens.size()^length_penalty: the ranking
  FinishReason finish = FinishReason::kNone;
};

// One step's news for one request: a new token, and the text it makes safe to show (text is
// valid UTF-8 with stop strings cut off; it may be empty while a character or a possible stop
// string is incomplete).
struct TokenEvent {
  RequestId request = 0;
  int32_t token = -1;  // -1 when the event only reports the finish (cancel)
  std::string text;
  SampledToken sampled;  // logprobs when asked for
  FinishReason finish = FinishReason::kNone;
  int32_t prompt_tokens = 0;
  int32_t generated_tokens = 0;
  // A beam-search request reports once, when it ends (token -1, text empty): its num_return best
  // hypotheses, best first; generated_tokens then counts the tokens of every beam.
  std::vector<BeamOutput> beams;
};

}  // namespace pagoda

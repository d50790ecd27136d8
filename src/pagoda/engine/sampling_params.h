// SamplingParams: how one request turns logits into tokens and when it stops. One plain struct
// that the CLI flags and the OpenAI request fields both fill; validate() is the single place
// that decides what is in range, so the two front ends cannot disagree.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pagoda {

// OpenAI's top_logprobs allows at most 20; so does vLLM by default.
inline constexpr int32_t kMaxLogprobs = 20;

// Beam widths served: 64 beams already take 64 rows of a step (transformers and vLLM allow more,
// but wider beams buy little and the KV bound grows with the width).
inline constexpr int32_t kMaxBeamWidth = 64;

// transformers' early_stopping: kTrue ends a beam search once beam_width hypotheses are finished;
// kFalse once no running beam can beat the worst finished one at its current length (the
// heuristic); kNever the same, but scoring running beams at the longest length they could reach
// when length_penalty > 0 (the canonical beam search).
enum class EarlyStopping : uint8_t { kFalse, kTrue, kNever };

// Temperatures below this sample greedily: dividing logits by a tinier one overflows to inf
// (vLLM draws the same line).
inline constexpr float kGreedyBelowTemperature = 1e-5f;

struct SamplingParams {
  float temperature = 1.0f;         // below kGreedyBelowTemperature (0): greedy; else logits / temperature
  int32_t top_k = 0;                // keep the k most likely tokens; 0 (or >= vocab): off
  float top_p = 1.0f;               // keep the fewest tokens whose mass reaches top_p; 1: off
  float min_p = 0.0f;               // drop tokens less likely than min_p * p(most likely); 0: off
  float repetition_penalty = 1.0f;  // CTRL rule over prompt + output tokens, in [0.01, 100]; 1: off
  float presence_penalty = 0.0f;    // OpenAI: subtracted once from every token the output holds
  float frequency_penalty = 0.0f;   // OpenAI: subtracted once per occurrence in the output
  std::optional<uint64_t> seed;     // none: a seed from std::random_device
  int32_t max_tokens = 256;         // most tokens to generate (the CLI and server set their own)
  std::vector<std::string> stop;        // stop strings; the output ends before the first match
  std::vector<int32_t> stop_token_ids;  // tokens that end generation besides the model's EOS
  bool ignore_eos = false;              // generate past EOS (benchmarks want fixed lengths)
  // 0: no logprobs. n >= 1: the chosen token's logprob and the n most likely tokens' (OpenAI's
  // logprobs=true with top_logprobs=0 is n = 1 with the list dropped by the server).
  int32_t logprobs = 0;

  // Beam search (engine/beam_search.h) when beam_width >= 1: deterministic, so it needs
  // temperature 0, no penalties and no logprobs; the filters (top-k, top-p, min-p) are unused.
  int32_t beam_width = 0;           // beams; 0: sampling or greedy as above
  float length_penalty = 1.0f;      // hypothesis score = sum of logprobs / generated length^length_penalty
  EarlyStopping early_stopping = EarlyStopping::kFalse;
  int32_t num_return = 1;           // finished hypotheses returned, best first: 1..beam_width
};

// "true", "false", "never" (also the parser of --early-stopping and the server's field).
const char* early_stopping_name(EarlyStopping e);

// Throws pagoda::Error(kInvalidArgument) naming the first parameter out of range and its range.
void validate(const SamplingParams& params);

}  // namespace pagoda

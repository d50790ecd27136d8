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
};

// Throws pagoda::Error(kInvalidArgument) naming the first parameter out of range and its range.
void validate(const SamplingParams& params);

}  // namespace pagoda

// Sampler: turns one row of logits into the next token of one request.
//
// Order of operations (HF transformers' logits-processor order where the two overlap; presence
// and frequency penalties, which HF lacks, sit with the repetition penalty as in vLLM):
//
//   1. repetition penalty r, once per distinct token in prompt + output (CTRL / HF rule):
//        l = l > 0 ? l / r : l * r
//   2. frequency f and presence q penalties over the output tokens (OpenAI rule), c = count:
//        l -= c * f + (c > 0 ? q : 0)
//   3. temperature 0: the argmax of the penalized logits, ties to the lowest id. Done: filters
//      cannot change the argmax and no random number is drawn.
//   4. z = l / temperature
//   5. top-k: keep the k largest z
//   6. top-p: in descending order, keep a token while the probability mass of the tokens before
//      it (softmax over the top-k survivors) is < top_p; the most likely token always stays
//   7. min-p: keep tokens with p >= min_p * p_max (renormalizing does not change this ratio)
//   8. draw one token from softmax(z) over the survivors, with one 64-bit draw of the RNG
//
// Wherever a ranking is needed, equal logits rank lower ids first, so top-k keeps exactly k
// tokens. The survivors of steps 5-7 are always the best-ranked tokens down to some rank (the
// cut) whose weight passes min-p, and step 8 walks them in token-id order; so the token drawn is
// a function of (logits, seed) alone, whatever permutation the selection algorithms leave.
//
// Reproducibility: each request owns its RNG (mt19937_64 seeded from params.seed) and draws
// exactly one number per sampled (non-greedy) token, so the same seed gives the same text however
// requests are batched. The uniform in [0, 1) is formed from the raw 64-bit output by this code,
// not by std::uniform_real_distribution, whose algorithm differs between standard libraries. On a
// backend that samples (the GPU), the engine gives this sampler only the requests that need
// penalties or logprobs; the others draw from the backend's counter-based generator instead, so a
// seed reproduces text on one backend, not across backends.
//
// Logprobs are the log-softmax of the distribution actually sampled from (after penalties,
// temperature and filters), as OpenAI and vLLM report them; filtered-out tokens are not listed.
// In greedy mode they are the log-softmax of the penalized logits (temperature 1, no filters).
//
// Cost for a vocabulary V, no sort of the vocabulary anywhere: penalties O(n log n) in the n
// context tokens (skipped when off); temperature, weights and the draw: a few O(V) passes;
// top-k: one nth_element, O(V); top-p: a weighted quickselect (nth_element on halving ranges
// until the cut is found), O(V) expected; logprobs: partial_sort of the survivors, O(V log n).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "pagoda/engine/sampling_params.h"

namespace pagoda {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampledToken {
  int32_t token = 0;
  float logprob = 0.0f;                    // set when params.logprobs > 0
  std::vector<TokenLogprob> top_logprobs;  // min(params.logprobs, survivors), most likely first
};

// Steps 1 and 2 above, in place. token_ids is prompt + output; the first num_prompt_tokens of it
// are the prompt. Throws pagoda::Error(kInvalidArgument) for a token id outside the vocabulary
// (logits.size()) when a penalty is on.
void apply_penalties(std::span<float> logits, std::span<const int32_t> token_ids,
                     size_t num_prompt_tokens, const SamplingParams& params);

class Sampler {
 public:
  // Throws pagoda::Error(kInvalidArgument) when validate(params) does.
  explicit Sampler(const SamplingParams& params);

  // logits: one row, [vocab], with at least one finite value; used as scratch (overwritten).
  // token_ids: prompt + output so far; its first num_prompt_tokens are the prompt.
  SampledToken sample(std::span<float> logits, std::span<const int32_t> token_ids,
                      size_t num_prompt_tokens);
  // Advances the RNG as sampling `tokens` tokens would have (not at all when greedy): another
  // server sampled them with the same seed (disaggregated prefill sends the first token).
  void skip(int32_t tokens);

 private:
  struct Candidate {
    float z;       // logit after penalties and temperature
    float weight;  // exp(z - max z): the unnormalized probability
    int32_t id;
  };
  struct RanksBefore;
  // Who survives steps 5-7: tokens ranked no later than `last` (when there is a rank cut, from
  // top-k and top-p) whose weight is >= min_weight (min-p).
  struct Cut {
    bool by_rank = false;
    Candidate last{};
    float min_weight = 0.0f;
    bool survives(const Candidate& c) const;
  };

  Cut find_cut(std::span<const float> z);
  void fill_logprobs(std::span<const float> z, float max_z, double weight_sum, const Cut& cut,
                     SampledToken* out);

  SamplingParams params_;
  std::mt19937_64 rng_;
  // Scratch reused across calls: a 150K vocabulary would otherwise allocate 2 MB per token.
  std::vector<float> weights_;          // [vocab]
  std::vector<Candidate> candidates_;  // [vocab] at most
};

}  // namespace pagoda

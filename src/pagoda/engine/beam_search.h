// BeamSearch: the scoring side of one beam-search request (which continuations survive, which
// hypotheses are finished, when the search ends), with the semantics of transformers'
// GenerationMixin._beam_search (transformers 5.x) for one prompt. The engine owns the KV: it
// re-forms the beams' block tables from what advance() returns (docs/beam-search.md).
//
// One step, for the B running beams (B = 1 at the first step: every beam would be the prompt, and
// transformers gives all but one a score of -1e9 so that they add nothing; B = W after):
//   1. log-softmax each beam's logits; a candidate's score is its beam's cumulative log-prob plus
//      the token's. Keep the best K = max(2, 1 + number of stop ids) x W candidates over all B x V,
//      so that at least W of them go on even when every beam's best token ends it.
//   2. A candidate "ends" when its token is a stop id, its text hits a stop string, or it reaches
//      the length limit (the caller says which). The W best candidates that do not end are the
//      next running beams (when fewer than W do not end, ending ones fill in at score - 1e9,
//      exactly as transformers does).
//   3. Ending candidates among the first W become finished hypotheses, scored
//      cumulative log-prob / generated_length^length_penalty (generated_length counts the stop
//      token); the W best finished so far are kept.
//   4. The search ends when no running beam can improve on the worst of W finished hypotheses
//      (early_stopping false: judged at the current length; "never" with length_penalty > 0: at
//      the length limit), when W hypotheses are finished and early_stopping is true, or when
//      every candidate ended.
// Scores are float32 and the -1e9 sentinels are added as float32, as transformers computes them,
// so that the corner cases (a beam kept at -1e9) behave the same.
//
// Width 1 is greedy search, as transformers' generate(num_beams=1) is: the most likely token (ties
// to the lower id), ending at the first stop.
//
// Cost per step: O(W K log K) here. The log-softmax and the selection of each beam's best K
// tokens, O(V) per beam, are the backend's (Backend::top_logprobs: on the GPU, only W x K
// (token, log-prob) pairs reach the host).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/engine/sampling_params.h"

namespace pagoda {

struct BeamHypothesis {
  std::vector<int32_t> tokens;     // generated tokens; the stop token included when one ended it
  float cumulative_logprob = 0.f;  // sum of the tokens' log-probabilities
  float score = 0.f;               // cumulative_logprob / tokens.size()^length_penalty
  bool stopped = false;            // a stop token or stop string ended it (else the length limit)
};

class BeamSearch {
 public:
  struct Candidate {
    int32_t parent = 0;  // index of the running beam it extends
    int32_t token = 0;
    float score = 0.f;   // the parent's cumulative log-prob + this token's
  };

  // max_new_tokens: the length limit (the request's max_tokens, cut to the context left);
  // num_stop_ids: token ids that end a beam (sets K).
  BeamSearch(int32_t width, float length_penalty, EarlyStopping early_stopping, int32_t max_new_tokens,
             int32_t num_stop_ids);

  int32_t width() const { return width_; }
  int32_t num_running() const { return int32_t(running_scores_.size()); }
  int32_t generated() const { return generated_; }  // tokens each running beam holds past the prompt
  int32_t max_new_tokens() const { return max_new_tokens_; }
  bool done() const { return done_; }

  // Running beam b's most likely tokens by log-softmax of its logits, best first (equal log-probs
  // lower id first): Backend::top_logprobs' output, at least candidates_per_beam() of them (fewer
  // only when the vocabulary is smaller). Tokens of log-prob -inf are never chosen.
  struct RankedRow {
    std::span<const int32_t> tokens;
    std::span<const float> logprobs;
  };
  // K: the candidates a step keeps, and so the most it needs of each beam's row.
  int32_t candidates_per_beam() const { return num_candidates_; }

  // Step 1: the best K continuations of the running beams, best first (ties: lower beam, then
  // lower token id). rows[b] is running beam b's.
  std::vector<Candidate> candidates(std::span<const RankedRow> rows) const;

  // What ends a candidate's beam (ends[i] in advance()).
  static constexpr uint8_t kGoesOn = 0, kEndsByStop = 1, kEndsByLength = 2;

  // Steps 2-4. ends[i]: whether and why candidates[i] ends its beam (a stop token or string wins
  // over the length limit). parent_tokens[b]: the generated tokens of
  // running beam b (a finished hypothesis copies them). Returns, for each running beam of the next
  // step in order, the index of the candidate it continues; empty once done().
  std::vector<int32_t> advance(std::span<const Candidate> candidates, std::span<const uint8_t> ends,
                               std::span<const std::span<const int32_t>> parent_tokens);

  // Ends the search before its time (the KV cache cannot hold the beams): the running beams count
  // as finished at their present length, kept where they rank among the W best.
  // running_tokens[b]: the generated tokens of running beam b.
  void stop_early(std::span<const std::span<const int32_t>> running_tokens);

  // The finished hypotheses, best first (width of them once the search is done).
  std::vector<BeamHypothesis> finished() const;

 private:
  struct Slot {  // one of the W places for finished hypotheses
    float score = -1e9f;
    bool finished = false;
    BeamHypothesis hypothesis;
  };

  int32_t width_;
  float length_penalty_;
  EarlyStopping early_stopping_;
  int32_t max_new_tokens_;
  int32_t num_candidates_;  // K
  int32_t generated_ = 0;
  std::vector<float> running_scores_{0.f};  // cumulative log-probs, best first
  std::vector<Slot> slots_;
  bool improvement_possible_ = true;  // transformers' is_early_stop_heuristic_unsatisfied
  bool done_ = false;
};

}  // namespace pagoda

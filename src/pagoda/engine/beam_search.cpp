#include "pagoda/engine/beam_search.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "pagoda/core/error.h"

namespace pagoda {
namespace {

// transformers' "this beam must not be chosen" offset, added in float32.
constexpr float kSentinel = -1.0e9f;

// length^penalty as transformers computes it (a Python float) before dividing a float32 score.
float length_power(int32_t length, float penalty) { return float(std::pow(double(length), double(penalty))); }

// Indices 0..n-1 ordered by score, larger first; equal scores keep index order (the flattened
// beam x vocab order for candidates).
std::vector<int32_t> ranked(std::span<const float> scores) {
  std::vector<int32_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return scores[size_t(a)] > scores[size_t(b)]; });
  return order;
}

}  // namespace

BeamSearch::BeamSearch(int32_t width, float length_penalty, EarlyStopping early_stopping, int32_t max_new_tokens,
                       int32_t num_stop_ids)
    : width_(width),
      length_penalty_(length_penalty),
      early_stopping_(early_stopping),
      max_new_tokens_(max_new_tokens),
      num_candidates_(width == 1 ? 1 : std::max(2, 1 + num_stop_ids) * width),
      slots_(size_t(std::max(width, 0))) {
  if (width < 1 || width > kMaxBeamWidth || max_new_tokens < 1 || num_stop_ids < 0)
    fail(ErrorKind::kInvalidArgument, "beam search: width {} (1..{}), max new tokens {} (>= 1)", width, kMaxBeamWidth,
         max_new_tokens);
}

std::vector<BeamSearch::Candidate> BeamSearch::candidates(std::span<const RankedRow> rows) const {
  if (rows.size() != running_scores_.size())
    fail(ErrorKind::kInternal, "beam search: {} ranked rows for {} running beams", rows.size(), running_scores_.size());
  std::vector<Candidate> all;
  for (size_t b = 0; b < rows.size(); ++b) {
    const RankedRow& row = rows[b];
    // The best K of this row are a superset of its share of the best K overall.
    const size_t k = std::min({size_t(num_candidates_), row.tokens.size(), row.logprobs.size()});
    for (size_t i = 0; i < k; ++i) {
      if (row.logprobs[i] == -std::numeric_limits<float>::infinity()) break;
      all.push_back({.parent = int32_t(b), .token = row.tokens[i], .score = running_scores_[b] + row.logprobs[i]});
    }
  }
  // Stable: rows were appended in beam order and each row in token order among equals.
  std::stable_sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
    return a.score > b.score || (a.score == b.score && (a.parent < b.parent || (a.parent == b.parent && a.token < b.token)));
  });
  if (all.size() > size_t(num_candidates_)) all.resize(size_t(num_candidates_));
  return all;
}

std::vector<int32_t> BeamSearch::advance(std::span<const Candidate> candidates, std::span<const uint8_t> ends,
                                         std::span<const std::span<const int32_t>> parent_tokens) {
  if (done_ || candidates.empty() || ends.size() != candidates.size() || parent_tokens.size() != running_scores_.size())
    fail(ErrorKind::kInternal, "beam search: advance with {} candidates, {} end flags, {} parents{}", candidates.size(),
         ends.size(), parent_tokens.size(), done_ ? " after the end" : "");
  const size_t k = candidates.size(), w = size_t(width_);
  const auto hypothesis = [&](size_t i, float score) {
    const Candidate& c = candidates[i];
    BeamHypothesis h{.cumulative_logprob = c.score, .score = score, .stopped = ends[i] == kEndsByStop};
    const std::span<const int32_t> parent = parent_tokens[size_t(c.parent)];
    h.tokens.assign(parent.begin(), parent.end());
    h.tokens.push_back(c.token);
    return h;
  };
  const float length_divisor = length_power(generated_ + 1, length_penalty_);

  if (width_ == 1) {  // greedy: the best token goes on, or ends the search
    ++generated_;
    if (ends[0]) {
      slots_[0] = {.score = candidates[0].score / length_divisor, .finished = true};
      slots_[0].hypothesis = hypothesis(0, slots_[0].score);
      done_ = true;
      return {};
    }
    running_scores_ = {candidates[0].score};
    return {0};
  }

  // The next running beams: the best W, ending candidates pushed down by the sentinel.
  std::vector<float> running(k);
  for (size_t i = 0; i < k; ++i) running[i] = candidates[i].score + (ends[i] ? kSentinel : 0.f);
  const std::vector<int32_t> running_order = ranked(running);
  std::vector<int32_t> next(running_order.begin(), running_order.begin() + ptrdiff_t(std::min(w, k)));

  // Finished hypotheses: the W best of those kept so far and the ending candidates among the
  // first W. Every other entry carries a sentinel, so it is never marked finished.
  const bool all_finished = std::all_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.finished; });
  std::vector<float> merged;
  merged.reserve(w + k);
  for (const Slot& s : slots_) merged.push_back(s.score);
  for (size_t i = 0; i < k; ++i) {
    float s = candidates[i].score / length_divisor;
    if (all_finished && early_stopping_ == EarlyStopping::kTrue) s += kSentinel;
    if (!improvement_possible_) s += kSentinel;
    if (!(ends[i] && i < w)) s += kSentinel;
    merged.push_back(s);
  }
  const std::vector<int32_t> merged_order = ranked(merged);
  std::vector<Slot> slots(w);
  for (size_t j = 0; j < w; ++j) {
    const size_t m = size_t(merged_order[j]);
    if (m < w) {
      slots[j] = std::move(slots_[m]);
      continue;
    }
    const size_t i = m - w;
    slots[j].score = merged[m];
    slots[j].finished = ends[i] && i < w;
    if (slots[j].finished) slots[j].hypothesis = hypothesis(i, merged[m]);
  }
  slots_ = std::move(slots);

  running_scores_.resize(next.size());
  for (size_t j = 0; j < next.size(); ++j) running_scores_[j] = running[size_t(next[j])];
  ++generated_;

  // Can a running beam still beat the worst finished hypothesis?
  const bool lengthen = early_stopping_ == EarlyStopping::kNever && length_penalty_ > 0.f;
  const float best_possible = running_scores_[0] / length_power(lengthen ? max_new_tokens_ : generated_, length_penalty_);
  const bool now_all_finished = std::all_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.finished; });
  float worst = std::numeric_limits<float>::infinity();
  for (const Slot& s : slots_) worst = std::min(worst, s.score);
  bool beats_one = false;
  for (const Slot& s : slots_) beats_one = beats_one || best_possible > (s.finished ? worst : kSentinel);
  improvement_possible_ = improvement_possible_ && beats_one;
  const bool every_candidate_ended = std::all_of(ends.begin(), ends.end(), [](uint8_t e) { return e != 0; });
  done_ = !improvement_possible_ || (now_all_finished && early_stopping_ == EarlyStopping::kTrue) ||
          every_candidate_ended;
  if (done_) return {};
  return next;
}

void BeamSearch::stop_early(std::span<const std::span<const int32_t>> running_tokens) {
  if (running_tokens.size() != running_scores_.size())
    fail(ErrorKind::kInternal, "beam search: {} running beams, {} token lists", running_scores_.size(),
         running_tokens.size());
  const float length_divisor = length_power(std::max(generated_, 1), length_penalty_);
  for (size_t b = 0; b < running_tokens.size(); ++b) {
    const float score = running_scores_[b] / length_divisor;
    // The worst slot (the last: slots are kept best first) gives way to a better hypothesis.
    if (!(score > slots_.back().score) && slots_.back().finished) continue;
    Slot slot{.score = score, .finished = true};
    slot.hypothesis = {.tokens = {running_tokens[b].begin(), running_tokens[b].end()},
                       .cumulative_logprob = running_scores_[b], .score = score, .stopped = false};
    slots_.back() = std::move(slot);
    std::stable_sort(slots_.begin(), slots_.end(), [](const Slot& a, const Slot& c) { return a.score > c.score; });
  }
  done_ = true;
}

std::vector<BeamHypothesis> BeamSearch::finished() const {
  std::vector<BeamHypothesis> out;
  for (const Slot& s : slots_)
    if (s.finished) out.push_back(s.hypothesis);
  return out;
}

}  // namespace pagoda

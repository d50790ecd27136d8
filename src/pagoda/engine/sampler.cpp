#include "pagoda/engine/sampler.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

#include "pagoda/core/error.h"

namespace pagoda {

namespace {

int32_t argmax(std::span<const float> z) {
  int32_t best = 0;
  for (size_t i = 1; i < z.size(); ++i) {
    if (z[i] > z[best]) best = int32_t(i);  // strict: ties keep the lower id
  }
  return best;
}

// 53 random bits -> a double in [0, 1), identical on every standard library.
double uniform01(std::mt19937_64& rng) { return double(rng() >> 11) * 0x1.0p-53; }

uint64_t initial_seed(const SamplingParams& params) {
  if (params.seed) return *params.seed;
  std::random_device device;
  return (uint64_t(device()) << 32) ^ device();
}

}  // namespace

void apply_penalties(std::span<float> logits, std::span<const int32_t> token_ids,
                     size_t num_prompt_tokens, const SamplingParams& params) {
  assert(num_prompt_tokens <= token_ids.size());
  const bool repetition = params.repetition_penalty != 1.0f;
  const bool additive = params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f;
  if (!repetition && !additive) return;

  const size_t vocab = logits.size();
  for (int32_t id : token_ids) {
    if (id < 0 || size_t(id) >= vocab) {
      fail(ErrorKind::kInvalidArgument, "token id {} is outside the vocabulary [0, {})", id, vocab);
    }
  }

  // Sorting a copy of the ids finds distinct tokens and their counts without a vocab-sized
  // table that would have to be cleared every step.
  std::vector<int32_t> ids;
  if (repetition) {
    ids.assign(token_ids.begin(), token_ids.end());
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    const float r = params.repetition_penalty;
    for (int32_t id : ids) {
      float& l = logits[id];
      l = l > 0 ? l / r : l * r;  // dividing a negative logit would raise its probability
    }
  }
  if (additive) {
    ids.assign(token_ids.begin() + num_prompt_tokens, token_ids.end());
    std::sort(ids.begin(), ids.end());
    for (size_t i = 0; i < ids.size();) {
      size_t j = i;
      while (j < ids.size() && ids[j] == ids[i]) ++j;
      logits[ids[i]] -= float(j - i) * params.frequency_penalty + params.presence_penalty;
      i = j;
    }
  }
}

// The one ranking used by top-k, top-p and the logprob list: larger logit first, then lower id.
struct Sampler::RanksBefore {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.z > b.z || (a.z == b.z && a.id < b.id);
  }
};

Sampler::Sampler(const SamplingParams& params) : params_(params) {
  validate(params_);
  rng_.seed(initial_seed(params_));
}

void Sampler::skip(int32_t tokens) {
  if (params_.temperature < kGreedyBelowTemperature) return;
  for (int32_t i = 0; i < tokens; ++i) rng_();
}

bool Sampler::Cut::survives(const Candidate& c) const {
  return (!by_rank || !RanksBefore{}(last, c)) && c.weight >= min_weight;
}

SampledToken Sampler::sample(std::span<float> logits, std::span<const int32_t> token_ids,
                             size_t num_prompt_tokens) {
  assert(!logits.empty());
  apply_penalties(logits, token_ids, num_prompt_tokens, params_);
  const size_t vocab = logits.size();
  SampledToken out;

  if (params_.temperature < kGreedyBelowTemperature) {
    out.token = argmax(logits);
    if (params_.logprobs > 0) {
      const float max_z = logits[out.token];
      weights_.resize(vocab);
      double sum = 0;
      for (size_t i = 0; i < vocab; ++i) sum += (weights_[i] = std::exp(logits[i] - max_z));
      fill_logprobs(logits, max_z, sum, Cut{}, &out);
    }
    return out;
  }

  // Dividing is monotonic, so the max of z is the max of the logits divided, computed once.
  const float temperature = params_.temperature;
  float max_z = -std::numeric_limits<float>::infinity();
  for (float& l : logits) max_z = std::max(max_z, l /= temperature);
  assert(std::isfinite(max_z));
  const std::span<const float> z = logits;

  weights_.resize(vocab);
  for (size_t i = 0; i < vocab; ++i) weights_[i] = std::exp(z[i] - max_z);
  const Cut cut = find_cut(z);

  const bool filtered = cut.by_rank || cut.min_weight > 0.0f;
  double sum = 0;
  for (size_t i = 0; i < vocab; ++i) {
    if (filtered && !cut.survives({z[i], weights_[i], int32_t(i)})) weights_[i] = 0.0f;
    sum += weights_[i];
  }

  // Inverse CDF in id order. The running sum repeats the additions that made `sum`, so it ends
  // exactly at `sum`; only u * sum rounding up to `sum` can fall off the end, and then the last
  // token with non-zero weight is the right answer.
  const double target = uniform01(rng_) * sum;
  double cumulative = 0;
  out.token = -1;
  for (size_t i = 0; i < vocab; ++i) {
    cumulative += weights_[i];
    if (target < cumulative) {
      out.token = int32_t(i);
      break;
    }
  }
  if (out.token < 0) {
    out.token = int32_t(vocab - 1);
    while (out.token > 0 && weights_[out.token] == 0.0f) --out.token;
  }

  if (params_.logprobs > 0) fill_logprobs(z, max_z, sum, cut, &out);
  return out;
}

Sampler::Cut Sampler::find_cut(std::span<const float> z) {
  const size_t vocab = z.size();
  Cut cut;
  // p_i / p_max = weight_i: HF's "p < min_p * p_max" without a softmax; renormalizing after
  // top-k or top-p scales both sides alike.
  cut.min_weight = params_.min_p;

  const bool top_k = params_.top_k > 0 && size_t(params_.top_k) < vocab;
  const bool top_p = params_.top_p < 1.0f;
  if (!top_k && !top_p) return cut;

  const RanksBefore ranks_before;
  if (top_k) {
    const size_t k = size_t(params_.top_k);
    candidates_.resize(vocab);
    for (size_t i = 0; i < vocab; ++i) candidates_[i] = {z[i], weights_[i], int32_t(i)};
    std::nth_element(candidates_.begin(), candidates_.begin() + (k - 1), candidates_.end(),
                     ranks_before);
    candidates_.resize(k);
    cut.by_rank = true;
    cut.last = candidates_[k - 1];  // the k-th ranked; all before it rank higher
  }

  if (top_p) {
    double total = 0;
    if (top_k) {
      for (const Candidate& c : candidates_) total += c.weight;
    } else {
      // A token of weight w has at most V tokens of weight <= w at or after its rank, so the mass
      // before it is >= total - V * w, which is >= target once w <= (1 - top_p) * total / V:
      // such tokens never stay and need not be ranked. (Half that bound, against rounding.) On a
      // peaked distribution this leaves a few hundred tokens of 150K.
      for (size_t i = 0; i < vocab; ++i) total += weights_[i];
      const double never_kept = 0.5 * (1.0 - double(params_.top_p)) * total / double(vocab);
      candidates_.clear();
      for (size_t i = 0; i < vocab; ++i) {
        if (weights_[i] > never_kept) candidates_.push_back({z[i], weights_[i], int32_t(i)});
      }
    }
    const double target = double(params_.top_p) * total;
    const auto begin = candidates_.begin();

    // Weighted quickselect for the number of best-ranked tokens to keep: token t stays while the
    // mass ranked before it is < target. Invariant: [0, lo) stay, [hi, n) go, everything in
    // [0, lo) ranks before [lo, hi), which ranks before [hi, n); mass_kept is the mass of [0, lo).
    size_t lo = 0, hi = candidates_.size();
    double mass_kept = 0;
    while (lo < hi) {
      const size_t mid = lo + (hi - lo) / 2;
      std::nth_element(begin + lo, begin + mid, begin + hi, ranks_before);
      double mass_before_mid = mass_kept;
      for (size_t i = lo; i < mid; ++i) mass_before_mid += candidates_[i].weight;
      if (mass_before_mid < target) {
        mass_kept = mass_before_mid + candidates_[mid].weight;
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    // The first token always stays (mass 0 before it), so lo >= 1; candidates_[lo - 1] is the
    // last `mid` that stayed, which ranks after everything else in [0, lo).
    cut.by_rank = true;
    cut.last = candidates_[lo - 1];
  }
  return cut;
}

void Sampler::fill_logprobs(std::span<const float> z, float max_z, double weight_sum, const Cut& cut,
                            SampledToken* out) {
  const double log_normalizer = double(max_z) + std::log(weight_sum);
  out->logprob = float(double(z[out->token]) - log_normalizer);

  candidates_.clear();
  for (size_t i = 0; i < z.size(); ++i) {
    const Candidate c{z[i], std::exp(z[i] - max_z), int32_t(i)};
    if (cut.survives(c)) candidates_.push_back(c);
  }
  const size_t n = std::min(size_t(params_.logprobs), candidates_.size());
  std::partial_sort(candidates_.begin(), candidates_.begin() + n, candidates_.end(), RanksBefore{});
  out->top_logprobs.resize(n);
  for (size_t i = 0; i < n; ++i) {
    out->top_logprobs[i] = {candidates_[i].id, float(double(candidates_[i].z) - log_normalizer)};
  }
}

}  // namespace pagoda

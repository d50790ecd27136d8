// The best tokens of a row of logits by log-probability: what a beam search scores its candidates
// with. Backend::top_logprobs runs it on the backend; rank_top_logprobs() here is its host
// implementation and the definition of its numbers, which the GPU kernel
// (backend/cuda/top_logprobs.h) reproduces.
//
// The log-probs, in this rounding (the sum in double, so that it hardly depends on its order):
//   m   = the largest logit
//   lse = m + float(log(sum_j exp(double(x_j) - double(m))))
//   logprob(t) = x_t - lse, one float subtraction
// Tokens rank by that float, larger first; equal log-probs keep the lower token id first, the
// order in which transformers' beam search ranks equal scores (its top-k over the flattened
// beam x vocab scores, lower index first). The subtraction can make two different logits equal:
// ranking the rounded log-probs, not the logits, is what keeps every backend's order the same.
// A row of -inf only has a NaN lse (as log_softmax gives); its tokens then rank by id.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/core/tensor.h"

namespace pagoda {

// The most tokens one row returns (the GPU ranks them in shared memory). A beam search of width W
// asks for max(2, 1 + stop ids) x W of them.
inline constexpr int32_t kMaxTopLogprobs = 4096;

inline float log_sum_exp(std::span<const float> row) {
  const float max = *std::max_element(row.begin(), row.end());
  double sum = 0;
  for (float x : row) sum += std::exp(double(x) - double(max));
  return max + float(std::log(sum));
}

// The tokens.size() best tokens of row (every column valid), best first, and their log-probs.
inline void rank_top_logprobs(std::span<const float> row, std::span<int32_t> tokens, std::span<float> logprobs) {
  const float lse = log_sum_exp(row);
  std::vector<float> lp(row.size());
  for (size_t i = 0; i < row.size(); ++i) lp[i] = row[i] - lse;
  std::vector<int32_t> ids(row.size());
  std::iota(ids.begin(), ids.end(), 0);
  const auto better = [&](int32_t a, int32_t c) {
    const float la = lp[size_t(a)], lc = lp[size_t(c)];
    return la > lc || (la == lc && a < c) || (std::isnan(lc) && !std::isnan(la)) ||
           (std::isnan(la) && std::isnan(lc) && a < c);
  };
  const auto k = ptrdiff_t(tokens.size());
  std::nth_element(ids.begin(), ids.begin() + (k - 1), ids.end(), better);
  std::sort(ids.begin(), ids.begin() + k, better);
  for (ptrdiff_t i = 0; i < k; ++i) {
    tokens[size_t(i)] = ids[size_t(i)];
    logprobs[size_t(i)] = lp[size_t(ids[size_t(i)])];
  }
}

// The arguments of Backend::top_logprobs, checked (a caller's bug is an internal error).
inline void check_top_logprobs_args(const Tensor& logits, int32_t vocab, std::span<const int32_t> rows, int32_t k,
                                    size_t num_tokens, size_t num_logprobs) {
  const bool shape_ok = logits.dtype == DType::kF32 && logits.ndim == 2 && logits.size(1) >= vocab && vocab > 0;
  const bool k_ok = k >= 1 && k <= vocab && k <= kMaxTopLogprobs;
  const bool rows_ok = std::all_of(rows.begin(), rows.end(), [&](int32_t r) { return r >= 0 && r < logits.size(0); });
  const size_t want = rows.size() * size_t(std::max(k, 0));
  if (!shape_ok || !k_ok || !rows_ok || num_tokens != want || num_logprobs != want)
    fail(ErrorKind::kInternal, "top_logprobs: k = {} of vocab {} (at most {}), {} rows of logits {}, outputs {} and {}", k,
         vocab, kMaxTopLogprobs, rows.size(), logits.shape_string(), num_tokens, num_logprobs);
}

}  // namespace pagoda

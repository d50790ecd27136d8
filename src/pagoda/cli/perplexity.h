// The scoring behind `pagoda perplexity`: the negative log-likelihood of each next token, and
// against a base run (saved as each position's top-k log-probabilities), the KL divergence and
// top-1 agreement of the next-token distributions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace pagoda::cli {

// One scored position of a base run: the k most likely tokens and their log-probabilities, best
// first.
struct TopTokens {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
};

// log softmax of logits, in f64 sums.
std::vector<double> log_softmax(std::span<const float> logits);

// The k largest entries of logprobs, best first (ties to the lower id).
TopTokens top_tokens(std::span<const double> logprobs, int32_t k);

// KL(base || test) of the distributions coarse-grained to base's top tokens plus one bucket for
// the rest of the vocabulary: a lower bound of the full KL (log-sum inequality), equal to it
// when the rest holds no mass. logprobs: the test run's full log-probabilities.
double top_k_kl(const TopTokens& base, std::span<const double> logprobs);

// The base run file (JSON): the window size, the scored targets and each position's top tokens.
struct PerplexityBase {
  int32_t window = 0;
  std::vector<int32_t> targets;
  std::vector<TopTokens> positions;
};
void save_perplexity_base(const std::string& path, const PerplexityBase& base);
// Throws Error(kInvalidArgument) for a file that is not one, or not consistent.
PerplexityBase load_perplexity_base(const std::string& path);

}  // namespace pagoda::cli

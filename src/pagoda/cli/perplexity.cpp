#include "pagoda/cli/perplexity.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"

namespace pagoda::cli {

std::vector<double> log_softmax(std::span<const float> logits) {
  const double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(double(x) - max);
  const double log_sum = max + std::log(sum);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = double(logits[i]) - log_sum;
  return out;
}

TopTokens top_tokens(std::span<const double> logprobs, int32_t k) {
  std::vector<int32_t> order(logprobs.size());
  std::iota(order.begin(), order.end(), 0);
  const auto n = size_t(std::clamp<int64_t>(k, 0, int64_t(logprobs.size())));
  std::partial_sort(order.begin(), order.begin() + int64_t(n), order.end(), [&](int32_t a, int32_t b) {
    return logprobs[size_t(a)] != logprobs[size_t(b)] ? logprobs[size_t(a)] > logprobs[size_t(b)] : a < b;
  });
  TopTokens top;
  for (size_t i = 0; i < n; ++i) {
    top.ids.push_back(order[i]);
    top.logprobs.push_back(float(logprobs[size_t(order[i])]));
  }
  return top;
}

double top_k_kl(const TopTokens& base, std::span<const double> logprobs) {
  double kl = 0, base_mass = 0, test_mass = 0;
  for (size_t i = 0; i < base.ids.size(); ++i) {
    const double p = std::exp(double(base.logprobs[i]));
    const double test = logprobs[size_t(base.ids[i])];
    kl += p * (double(base.logprobs[i]) - test);
    base_mass += p;
    test_mass += std::exp(test);
  }
  // The saved log-probabilities are floats: a rest below 1e-6 is their rounding, not mass.
  const double base_rest = 1.0 - base_mass, test_rest = std::max(1e-300, 1.0 - test_mass);
  if (base_rest > 1e-6) kl += base_rest * std::log(base_rest / test_rest);
  return kl;
}

void save_perplexity_base(const std::string& path, const PerplexityBase& base) {
  nlohmann::json positions = nlohmann::json::array();
  for (const TopTokens& t : base.positions) positions.push_back({{"ids", t.ids}, {"logprobs", t.logprobs}});
  const nlohmann::json j{{"format", "pagoda-perplexity-base-1"},
                         {"window", base.window},
                         {"targets", base.targets},
                         {"positions", positions}};
  std::ofstream out(path);
  out << j.dump() << '\n';
  if (!out) fail(ErrorKind::kInvalidArgument, "--save-base: cannot write '{}'", path);
}

PerplexityBase load_perplexity_base(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(ErrorKind::kInvalidArgument, "--kl-base: cannot read '{}'", path);
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    if (j.at("format") != "pagoda-perplexity-base-1") fail(ErrorKind::kInvalidArgument, "not a base run");
    PerplexityBase base{.window = j.at("window").get<int32_t>(), .targets = j.at("targets").get<std::vector<int32_t>>()};
    for (const auto& p : j.at("positions")) {
      TopTokens t{.ids = p.at("ids").get<std::vector<int32_t>>(), .logprobs = p.at("logprobs").get<std::vector<float>>()};
      if (t.ids.empty() || t.ids.size() != t.logprobs.size()) fail(ErrorKind::kInvalidArgument, "a position has no tokens");
      base.positions.push_back(std::move(t));
    }
    if (base.positions.size() != base.targets.size()) fail(ErrorKind::kInvalidArgument, "targets and positions differ");
    return base;
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kInvalidArgument, "--kl-base '{}' is not a base run: {}", path, e.what());
  } catch (const Error& e) {
    fail(ErrorKind::kInvalidArgument, "--kl-base '{}' is not a base run: {}", path, e.what());
  }
}

}  // namespace pagoda::cli

#include "pagoda/engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "pagoda/core/error.h"

namespace pagoda {
namespace {

constexpr int kDraws = 20000;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

SamplingParams with_seed(uint64_t seed) {
  SamplingParams p;
  p.seed = seed;
  return p;
}

// Counts of each token over `draws` samples (sample() overwrites the logits, so each draw gets a
// fresh copy).
std::vector<int> draw_counts(const SamplingParams& params, const std::vector<float>& logits,
                             int draws = kDraws) {
  Sampler sampler(params);
  std::vector<int> counts(logits.size(), 0);
  std::vector<float> scratch;
  for (int i = 0; i < draws; ++i) {
    scratch = logits;
    ++counts.at(size_t(sampler.sample(scratch, {}, 0).token));
  }
  return counts;
}

// The distribution the header promises, written independently: double precision, one full
// sort, filters applied one after another on explicit probabilities.
std::vector<double> reference_distribution(const std::vector<float>& logits, double temperature,
                                           int top_k, double top_p, double min_p) {
  const size_t n = logits.size();
  std::vector<double> z(n);
  for (size_t i = 0; i < n; ++i) z[i] = double(logits[i]) / temperature;
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
  if (top_k > 0 && size_t(top_k) < n) order.resize(size_t(top_k));

  const auto softmax_over = [&](const std::vector<int>& ids) {
    std::vector<double> p(n, 0.0);
    double sum = 0;
    for (int id : ids) sum += std::exp(z[id] - z[ids[0]]);
    for (int id : ids) p[id] = std::exp(z[id] - z[ids[0]]) / sum;
    return p;
  };
  std::vector<double> p = softmax_over(order);
  std::vector<int> kept;
  double before = 0;
  for (int id : order) {
    if (before >= top_p) break;
    kept.push_back(id);
    before += p[id];
  }
  p = softmax_over(kept);
  const double p_max = p[kept[0]];
  std::erase_if(kept, [&](int id) { return p[id] < min_p * p_max; });
  return softmax_over(kept);
}

std::vector<int> support(const std::vector<double>& p) {
  std::vector<int> ids;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] > 0) ids.push_back(int(i));
  }
  return ids;
}

// Pearson's statistic over the tokens the expectation gives mass to; a token drawn outside that
// support makes it infinite.
double chi_square(const std::vector<int>& counts, const std::vector<double>& expected) {
  const double total = std::accumulate(counts.begin(), counts.end(), 0.0);
  double stat = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = expected[i] * total;
    if (e == 0) {
      if (counts[i] > 0) return std::numeric_limits<double>::infinity();
      continue;
    }
    stat += (counts[i] - e) * (counts[i] - e) / e;
  }
  return stat;
}

// The chi-square quantile at 1 - 1e-3 (Wilson-Hilferty; within 3% of the exact value for df >= 1,
// on the generous side). With a fixed seed each test is deterministic; the level says how unusual
// the one run we see may be before we call it a bug.
double chi_square_critical(size_t df) {
  const double k = double(df);
  const double z = 3.0902;  // standard normal quantile at 0.999
  const double c = 1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k));
  return k * c * c * c;
}

// Checks that the draws follow `expected` and that the test could see the difference from
// `wrong`, a near miss (a filter boundary off by one, a temperature ignored).
void expect_distribution(const std::vector<int>& counts, const std::vector<double>& expected,
                         const std::vector<double>& wrong) {
  const size_t df = support(expected).size() - 1;
  ASSERT_GE(df, 1u);
  const double critical = chi_square_critical(df);
  EXPECT_LT(chi_square(counts, expected), critical);
  EXPECT_GT(chi_square(counts, wrong), critical) << "the test cannot tell the near miss apart";
  for (size_t i = 0; i < counts.size(); ++i) {
    if (expected[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " should be filtered out";
    }
  }
}

std::vector<float> log_of(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(float(std::log(p)));
  return logits;
}

// ---- greedy ----

TEST(SamplerGreedy, PicksTheArgmax) {
  SamplingParams p;
  p.temperature = 0;
  Sampler sampler(p);
  std::vector<float> logits = {0.1f, -3.0f, 2.5f, 2.4f, kNegInf, 1.0f};
  EXPECT_EQ(sampler.sample(logits, {}, 0).token, 2);
  logits = {-5.0f, -4.0f, -7.0f};
  EXPECT_EQ(sampler.sample(logits, {}, 0).token, 1);
}

TEST(SamplerGreedy, TiesGoToTheLowestId) {
  SamplingParams p;
  p.temperature = 0;
  Sampler sampler(p);
  std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, 3.0f};
  EXPECT_EQ(sampler.sample(logits, {}, 0).token, 1);
  logits = {7.0f, 7.0f};
  EXPECT_EQ(sampler.sample(logits, {}, 0).token, 0);
}

TEST(SamplerGreedy, IgnoresFiltersAndSeed) {
  const std::vector<float> logits = {0.5f, 4.0f, 1.0f, 3.9f};
  for (uint64_t seed : {1u, 2u, 3u}) {
    SamplingParams p = with_seed(seed);
    p.temperature = 0;
    p.top_k = 2;
    p.top_p = 0.5f;
    p.min_p = 0.9f;
    Sampler sampler(p);
    for (int i = 0; i < 10; ++i) {
      std::vector<float> scratch = logits;
      EXPECT_EQ(sampler.sample(scratch, {}, 0).token, 1);
    }
  }
}

// A temperature so small that logits / temperature overflow is greedy, with finite logprobs.
TEST(SamplerGreedy, TinyTemperatureIsGreedy) {
  for (float t : {1e-40f, 1e-20f, 0.9e-5f}) {
    SamplingParams p = with_seed(7);
    p.temperature = t;
    p.logprobs = 2;
    Sampler sampler(p);
    std::vector<float> logits = {-3.0f, -1.0f, -2.0f, -8.0f};
    const SampledToken out = sampler.sample(logits, {}, 0);
    EXPECT_EQ(out.token, 1) << t;
    EXPECT_TRUE(std::isfinite(out.logprob)) << t;
  }
}

// ---- the sampled distribution, filter by filter ----

TEST(SamplerDistribution, TemperatureScalesLogits) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 0.0f};
  SamplingParams p = with_seed(11);
  p.temperature = 0.6f;
  expect_distribution(draw_counts(p, logits), reference_distribution(logits, 0.6, 0, 1, 0),
                      reference_distribution(logits, 0.7, 0, 1, 0));
}

TEST(SamplerDistribution, TemperatureOneIsPlainSoftmax) {
  const std::vector<float> logits = log_of({0.3, 0.05, 0.2, 0.25, 0.2});
  const std::vector<double> expected = {0.3, 0.05, 0.2, 0.25, 0.2};
  const std::vector<double> wrong = {0.28, 0.07, 0.2, 0.25, 0.2};
  expect_distribution(draw_counts(with_seed(12), logits), expected, wrong);
}

TEST(SamplerDistribution, TopKKeepsTheKLargest) {
  const std::vector<float> logits = {0.3f, 1.2f, -0.5f, 2.0f, 1.1f, 0.9f};
  SamplingParams p = with_seed(13);
  p.top_k = 3;
  const std::vector<double> expected = reference_distribution(logits, 1, 3, 1, 0);
  EXPECT_EQ(support(expected), (std::vector<int>{1, 3, 4}));
  expect_distribution(draw_counts(p, logits), expected, reference_distribution(logits, 1, 4, 1, 0));
}

TEST(SamplerDistribution, TopKBreaksTiesTowardLowerIds) {
  const std::vector<float> logits = {0.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  SamplingParams p = with_seed(14);
  p.top_k = 2;
  const std::vector<double> expected = {0, 0.5, 0.5, 0, 0};
  const std::vector<double> wrong = {0, 1.0 / 3, 1.0 / 3, 1.0 / 3, 0};
  expect_distribution(draw_counts(p, logits), expected, wrong);
}

TEST(SamplerDistribution, TopKAtOrAboveVocabIsOff) {
  const std::vector<float> logits = {0.2f, 0.1f, -0.4f};
  SamplingParams p = with_seed(15);
  p.top_k = 3;
  const std::vector<double> expected = reference_distribution(logits, 1, 0, 1, 0);
  expect_distribution(draw_counts(p, logits), expected, reference_distribution(logits, 1, 2, 1, 0));
  p.top_k = 1000;
  expect_distribution(draw_counts(p, logits), expected, reference_distribution(logits, 1, 2, 1, 0));
}

TEST(SamplerDistribution, TopPKeepsTheSmallestSetReachingP) {
  // Ranked: 0.40 (id 1), 0.25 (3), 0.15 (5), 0.10 (2), ... The mass before id 5 is 0.65 < 0.7, so
  // it stays; the mass before id 2 is 0.80, so it goes.
  const std::vector<float> logits = log_of({0.05, 0.4, 0.1, 0.25, 0.04, 0.15, 0.01});
  SamplingParams p = with_seed(16);
  p.top_p = 0.7f;
  const std::vector<double> expected = {0, 0.4 / 0.8, 0, 0.25 / 0.8, 0, 0.15 / 0.8, 0};
  const std::vector<double> one_less = {0, 0.4 / 0.65, 0, 0.25 / 0.65, 0, 0, 0};
  const std::vector<double> one_more = {0, 0.4 / 0.9, 0.1 / 0.9, 0.25 / 0.9, 0, 0.15 / 0.9, 0};
  const std::vector<int> counts = draw_counts(p, logits);
  expect_distribution(counts, expected, one_less);
  expect_distribution(counts, expected, one_more);
  const std::vector<double> reference = reference_distribution(logits, 1, 0, 0.7, 0);
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(reference[i], expected[i], 1e-6);
}

TEST(SamplerDistribution, TopPAppliesAfterTemperature) {
  // At T = 1 top_p = 0.7 keeps 3 tokens; at T = 2 the flatter distribution needs 4.
  const std::vector<float> logits = log_of({0.05, 0.4, 0.1, 0.25, 0.04, 0.15, 0.01});
  SamplingParams p = with_seed(17);
  p.temperature = 2;
  p.top_p = 0.7f;
  const std::vector<double> expected = reference_distribution(logits, 2, 0, 0.7, 0);
  EXPECT_EQ(support(expected), (std::vector<int>{1, 2, 3, 5}));
  const std::vector<double> top_p_first = reference_distribution(logits, 1, 0, 0.7, 0);
  std::vector<double> wrong(expected.size(), 0.0);  // filter at T = 1, then sample at T = 2
  double sum = 0;
  for (int id : support(top_p_first)) sum += (wrong[id] = std::sqrt(top_p_first[id]));
  for (double& w : wrong) w /= sum;
  expect_distribution(draw_counts(p, logits), expected, wrong);
}

TEST(SamplerDistribution, TopPOnALargerVocabulary) {
  // 100 equally likely tokens spread over a vocabulary of 2000 and 1900 unlikely ones (e^-8
  // each: 0.63% of the mass together). top_p = 0.99 keeps exactly the 100: the mass before the
  // 100th is 99/100.637 = 0.9837, before the 101st 0.9937. The quickselect has to find the cut
  // among ties, and the unlikely tokens are too heavy to be pruned before ranking.
  constexpr int kVocab = 2000, kHead = 100, kDrawsHere = 10000;
  std::vector<float> logits(kVocab, -8.0f);
  std::vector<double> expected(kVocab, 0.0);
  for (int i = 0; i < kHead; ++i) {
    logits[i * 19] = 0.0f;
    expected[i * 19] = 1.0 / kHead;
  }
  SamplingParams p = with_seed(18);
  p.top_p = 0.99f;
  const std::vector<int> counts = draw_counts(p, logits, kDrawsHere);
  EXPECT_LT(chi_square(counts, expected), chi_square_critical(kHead - 1));
  // Were top_p ignored, 10000 * 0.0063 = 63 draws would land in the tail: P(none) = e^-63.
  int tail = 0;
  for (int i = 0; i < kVocab; ++i) tail += expected[i] == 0 ? counts[i] : 0;
  EXPECT_EQ(tail, 0);
  for (int i = 0; i < kHead; ++i) EXPECT_GT(counts[i * 19], 0) << i;
}

TEST(SamplerDistribution, TopPPrunesOnlyTokensThatCannotStay) {
  // A peaked distribution over 20000 tokens: token 0 has 90% of the mass, the rest descend
  // smoothly. top_p = 0.95 keeps token 0 and about the next 3400; the pruning bound drops tokens
  // past about 13900 before ranking and must not cut into the kept set. If it did, the kept mass
  // and with it every logprob would move by far more than the tolerance.
  constexpr int kVocab = 20000, kDrawsHere = 200;
  std::vector<float> logits(kVocab);
  for (int i = 1; i < kVocab; ++i) logits[i] = -0.0002f * float(i);
  double rest = 0;
  for (int i = 1; i < kVocab; ++i) rest += std::exp(double(logits[i]));
  logits[0] = float(std::log(9.0 * rest));  // 90% of the mass
  SamplingParams p = with_seed(22);
  p.top_p = 0.95f;
  p.logprobs = 1;
  const std::vector<double> reference = reference_distribution(logits, 1, 0, 0.95, 0);
  const std::vector<int> kept = support(reference);
  ASSERT_GT(kept.size(), 100u);  // the cut lies deep in the tail
  Sampler sampler(p);
  std::vector<int> counts(kVocab, 0);
  for (int draw = 0; draw < kDrawsHere; ++draw) {
    std::vector<float> scratch = logits;
    const SampledToken t = sampler.sample(scratch, {}, 0);
    ++counts[t.token];
    // The logprob is normalized over exactly the reference's survivors.
    ASSERT_NEAR(t.logprob, std::log(reference[t.token]), 1e-4) << t.token;
  }
  for (int i = 0; i < kVocab; ++i) {
    if (reference[i] == 0) {
      ASSERT_EQ(counts[i], 0) << i;
    }
  }
  EXPECT_NEAR(counts[0] / double(kDrawsHere), reference[0], 0.07);  // 3.3 sigma
}

TEST(SamplerDistribution, MinPDropsTokensBelowAFractionOfTheTop) {
  // min_p = 0.2 of p_max = 0.5 is 0.1: 0.11 stays, 0.09 goes.
  const std::vector<float> logits = log_of({0.5, 0.2, 0.11, 0.09, 0.06, 0.04});
  SamplingParams p = with_seed(19);
  p.min_p = 0.2f;
  const std::vector<double> expected = {0.5 / 0.81, 0.2 / 0.81, 0.11 / 0.81, 0, 0, 0};
  const std::vector<double> one_more = {0.5 / 0.9, 0.2 / 0.9, 0.11 / 0.9, 0.09 / 0.9, 0, 0};
  expect_distribution(draw_counts(p, logits), expected, one_more);
}

TEST(SamplerDistribution, AllFiltersTogetherInOrder) {
  // T = 0.8 ranks ids 2, 9, 4, 6, 0, 8, ...: top_k = 5 drops 8 and below; top_p = 0.8 drops 0 (the
  // mass before it is 0.889); min_p = 0.7 drops 6 (0.687 of the top).
  const std::vector<float> logits = {1.5f, -0.3f, 2.2f, 0.7f, 2.0f, -1.0f, 1.9f, 0.2f, 1.0f, 2.1f};
  SamplingParams p = with_seed(20);
  p.temperature = 0.8f;
  p.top_k = 5;
  p.top_p = 0.8f;
  p.min_p = 0.7f;
  const std::vector<double> expected = reference_distribution(logits, 0.8, 5, 0.8, 0.7);
  EXPECT_EQ(support(expected), (std::vector<int>{2, 4, 9}));
  expect_distribution(draw_counts(p, logits), expected,
                      reference_distribution(logits, 0.8, 5, 0.8, 0.65));
}

TEST(SamplerDistribution, MaskedTokensAreNeverDrawn) {
  const std::vector<float> logits = {kNegInf, 0.0f, kNegInf, 0.0f, kNegInf};
  const std::vector<double> expected = {0, 0.5, 0, 0.5, 0};
  const std::vector<double> wrong = {0, 0.45, 0, 0.55, 0};
  expect_distribution(draw_counts(with_seed(21), logits), expected, wrong);
}

// ---- seeds ----

std::vector<int32_t> sequence(Sampler& sampler, int length) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < length; ++i) {
    std::vector<float> logits(100, 0.0f);  // uniform: every draw is fully random
    tokens.push_back(sampler.sample(logits, {}, 0).token);
  }
  return tokens;
}

TEST(SamplerSeed, SameSeedSameSequenceWhateverElseRuns) {
  Sampler alone(with_seed(42));
  const std::vector<int32_t> expected = sequence(alone, 200);

  // Interleaved with another request, as in a batch.
  Sampler a(with_seed(42)), b(with_seed(42)), other(with_seed(7));
  std::vector<int32_t> got;
  for (int i = 0; i < 200; ++i) {
    got.push_back(sequence(a, 1)[0]);
    sequence(other, 3);
  }
  EXPECT_EQ(got, expected);
  EXPECT_EQ(sequence(b, 200), expected);
}

TEST(SamplerSeed, DifferentSeedsDifferentSequences) {
  Sampler a(with_seed(1)), b(with_seed(2));
  EXPECT_NE(sequence(a, 50), sequence(b, 50));
}

TEST(SamplerSeed, WithoutASeedEachSamplerDiffers) {
  Sampler a{SamplingParams{}}, b{SamplingParams{}};
  EXPECT_NE(sequence(a, 50), sequence(b, 50));
}

// ---- penalties ----

TEST(Penalties, RepetitionDividesPositiveAndMultipliesNegativeOncePerToken) {
  SamplingParams p;
  p.repetition_penalty = 1.3f;
  std::vector<float> logits = {2.0f, -1.0f, 0.5f, 0.0f, 3.0f, -2.0f};
  const std::vector<int32_t> ids = {0, 1, 1, 3, /*output:*/ 1, 2, 0, 0};
  apply_penalties(logits, ids, 4, p);
  EXPECT_FLOAT_EQ(logits[0], 2.0f / 1.3f);   // in prompt and output, three times: once
  EXPECT_FLOAT_EQ(logits[1], -1.0f * 1.3f);  // negative: multiplied
  EXPECT_FLOAT_EQ(logits[2], 0.5f / 1.3f);   // output only
  EXPECT_EQ(logits[3], 0.0f);                // zero stays zero
  EXPECT_EQ(logits[4], 3.0f);                // absent: untouched
  EXPECT_EQ(logits[5], -2.0f);
}

TEST(Penalties, PresenceAndFrequencyCountOutputTokensOnly) {
  SamplingParams p;
  p.presence_penalty = 0.25f;
  p.frequency_penalty = 0.5f;
  std::vector<float> logits = {2.0f, -1.0f, 0.5f, 1.0f, 3.0f};
  const std::vector<int32_t> ids = {4, 4, 0, /*output:*/ 1, 2, 1, 1, 0};
  apply_penalties(logits, ids, 3, p);
  EXPECT_NEAR(logits[0], 2.0 - 1 * 0.5 - 0.25, 1e-6);   // once in the output
  EXPECT_NEAR(logits[1], -1.0 - 3 * 0.5 - 0.25, 1e-6);  // three times
  EXPECT_NEAR(logits[2], 0.5 - 1 * 0.5 - 0.25, 1e-6);
  EXPECT_EQ(logits[3], 1.0f);  // never seen
  EXPECT_EQ(logits[4], 3.0f);  // prompt only
}

TEST(Penalties, NegativePresenceAndFrequencyEncourageRepeats) {
  SamplingParams p;
  p.presence_penalty = -1.0f;
  p.frequency_penalty = -0.5f;
  std::vector<float> logits = {0.0f, 0.0f};
  const std::vector<int32_t> ids = {1, 1};
  apply_penalties(logits, ids, 0, p);
  EXPECT_EQ(logits[0], 0.0f);
  EXPECT_NEAR(logits[1], 2.0, 1e-6);
}

TEST(Penalties, RepetitionAppliesBeforePresenceAndFrequency) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 1.0f;
  p.frequency_penalty = 0.5f;
  std::vector<float> logits = {3.0f};
  const std::vector<int32_t> ids = {0, 0};
  apply_penalties(logits, ids, 1, p);
  EXPECT_NEAR(logits[0], 3.0 / 2 - 0.5 - 1.0, 1e-6);  // not (3 - 1.5) / 2
}

TEST(Penalties, OffMeansUntouched) {
  std::vector<float> logits = {1.0f, -2.0f};
  const std::vector<int32_t> ids = {0, 1, 7 /* out of range, but nothing is looked up */};
  apply_penalties(logits, ids, 1, SamplingParams{});
  EXPECT_EQ(logits, (std::vector<float>{1.0f, -2.0f}));
}

TEST(Penalties, TokenOutsideTheVocabularyIsAnError) {
  SamplingParams p;
  p.repetition_penalty = 1.1f;
  std::vector<float> logits(4, 0.0f);
  const std::vector<int32_t> ids = {1, 4};
  try {
    apply_penalties(logits, ids, 1, p);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  }
}

TEST(Penalties, SamplerAppliesThemBeforeChoosing) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 1.5f;
  Sampler sampler(p);
  std::vector<float> logits = {3.0f, 2.5f};
  const std::vector<int32_t> ids = {0};  // 3 / 1.5 = 2 < 2.5
  EXPECT_EQ(sampler.sample(logits, ids, 1).token, 1);
}

// ---- logprobs ----

// log_softmax(logits / temperature) over `kept` in double.
std::vector<double> reference_logprobs(const std::vector<float>& logits, double temperature,
                                       const std::vector<int>& kept) {
  double max_z = -std::numeric_limits<double>::infinity();
  for (int id : kept) max_z = std::max(max_z, double(logits[id]) / temperature);
  double sum = 0;
  for (int id : kept) sum += std::exp(double(logits[id]) / temperature - max_z);
  std::vector<double> out(logits.size(), -std::numeric_limits<double>::infinity());
  for (int id : kept) out[id] = double(logits[id]) / temperature - max_z - std::log(sum);
  return out;
}

void expect_logprobs(const SampledToken& got, const std::vector<double>& reference, size_t n) {
  EXPECT_NEAR(got.logprob, reference[size_t(got.token)], 1e-5);
  std::vector<int> ranked(reference.size());
  std::iota(ranked.begin(), ranked.end(), 0);
  std::stable_sort(ranked.begin(), ranked.end(), [&](int a, int b) { return reference[a] > reference[b]; });
  ASSERT_EQ(got.top_logprobs.size(), n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(got.top_logprobs[i].token, ranked[i]) << i;
    EXPECT_NEAR(got.top_logprobs[i].logprob, reference[size_t(ranked[i])], 1e-5) << i;
  }
}

TEST(Logprobs, AreTheLogSoftmaxOfTheFilteredDistribution) {
  const std::vector<float> logits = {1.5f, -0.3f, 2.2f, 0.7f, 2.0f, -1.0f, 1.9f, 0.2f, 1.0f, 2.1f};
  SamplingParams p = with_seed(3);
  p.temperature = 0.8f;
  p.top_k = 5;
  p.logprobs = 3;
  Sampler sampler(p);
  const std::vector<double> reference = reference_logprobs(logits, 0.8, {2, 9, 4, 6, 0});
  for (int i = 0; i < 20; ++i) {
    std::vector<float> scratch = logits;
    expect_logprobs(sampler.sample(scratch, {}, 0), reference, 3);
  }
}

TEST(Logprobs, ListOnlySurvivingTokens) {
  const std::vector<float> logits = {1.5f, -0.3f, 2.2f, 0.7f, 2.0f, -1.0f, 1.9f, 0.2f, 1.0f, 2.1f};
  SamplingParams p = with_seed(4);
  p.temperature = 0.8f;
  p.top_k = 5;
  p.top_p = 0.8f;
  p.min_p = 0.7f;
  p.logprobs = 5;
  Sampler sampler(p);
  std::vector<float> scratch = logits;
  expect_logprobs(sampler.sample(scratch, {}, 0), reference_logprobs(logits, 0.8, {2, 9, 4}), 3);
}

TEST(Logprobs, OnALargeVocabularyWithoutFilters) {
  constexpr int kVocab = 32000;
  std::vector<float> logits(kVocab);
  std::mt19937_64 rng(99);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& l : logits) l = normal(rng);
  SamplingParams p = with_seed(6);
  p.temperature = 1.3f;
  p.logprobs = kMaxLogprobs;
  Sampler sampler(p);
  std::vector<int> all(kVocab);
  std::iota(all.begin(), all.end(), 0);
  const std::vector<double> reference = reference_logprobs(logits, 1.3, all);
  std::vector<float> scratch = logits;
  expect_logprobs(sampler.sample(scratch, {}, 0), reference, kMaxLogprobs);
}

TEST(Logprobs, GreedyReportsThePenalizedSoftmaxAtTemperatureOne) {
  std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.0f};
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;
  p.logprobs = 2;
  Sampler sampler(p);
  const std::vector<int32_t> ids = {1};
  const std::vector<float> penalized = {0.5f, 1.0f, -1.0f, 1.0f};  // tie: id 1 before id 3
  const SampledToken got = sampler.sample(logits, ids, 1);
  EXPECT_EQ(got.token, 1);
  expect_logprobs(got, reference_logprobs(penalized, 1, {0, 1, 2, 3}), 2);
}

TEST(Logprobs, NoneUnlessAsked) {
  std::vector<float> logits = {0.5f, 2.0f};
  Sampler sampler(with_seed(1));
  EXPECT_TRUE(sampler.sample(logits, {}, 0).top_logprobs.empty());
}

TEST(Sampler, RejectsInvalidParams) {
  SamplingParams p;
  p.top_p = 0;
  EXPECT_THROW(Sampler{p}, Error);
}

}  // namespace
}  // namespace pagoda

// Token sampling on the GPU (backend/cuda/sampling.h) against a host reference written here from
// the semantics of engine/sampler.h, in double: z = logit / temperature (the float division
// both sides do), w = exp(z - max z), the top-k / top-p / min-p survivors from a full sort by
// (z descending, id ascending), and the inverse CDF of the survivors in id order.
//
// Exactness: greedy must be identical. A random draw must (a) land in the host's survivor set,
// and (b) be the host's inverse-CDF token at u = sampling_random_bits(seed, offset) / 2^64,
// except when u lies within 1e-6 of a boundary between two tokens' cumulative masses (the
// device's masses are floor(w * 2^40) of expf, relative error ~1e-7, so it may pick the
// neighbour there); the tests count those and allow a handful.
// Distribution: 20000 draws (offsets 0..19999) of one row; each token's frequency must be within
// 5 standard deviations (sqrt(p (1 - p) / N)) of the host's filtered softmax, and filtered-out
// tokens must never appear. A sampler that ignored a filter or the temperature is off by far more.
// GPU tests skip without a GPU (CI); they run on the device machine via `make gpu-test`.
#include "gpu_test.h"
#include "pagoda/backend/cuda/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <vector>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/core/error.h"

namespace pagoda::cuda {
namespace {

constexpr float kPadding = 1e30f;  // in columns past vocab: would win any argmax if read

std::vector<int32_t> sample_on_device(const std::vector<float>& logits, int64_t ld, int32_t vocab,
                                      const std::vector<SampleRow>& rows) {
  DeviceArray<float> d_logits;
  DeviceArray<SampleRow> d_rows;
  DeviceArray<int32_t> d_tokens(rows.size());
  d_logits.upload(logits);
  d_rows.upload(rows);
  check_cuda(cudaMemset(d_tokens.data(), 0xff, d_tokens.bytes()), "memset");
  sample_tokens(d_logits.data(), ld, vocab, d_rows.data(), int32_t(rows.size()), d_tokens.data(), nullptr);
  check_cuda(cudaDeviceSynchronize(), "sync");
  return d_tokens.download();
}

int32_t host_argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = int32_t(i);
  }
  return best;
}

// The filtered softmax of one row: p[i] > 0 exactly for the survivors.
std::vector<double> filtered_softmax(std::span<const float> logits, const SampleRow& row) {
  const size_t vocab = logits.size();
  std::vector<float> z(vocab);
  for (size_t i = 0; i < vocab; ++i) z[i] = logits[i] / row.temperature;
  const double max_z = *std::max_element(z.begin(), z.end());
  std::vector<double> w(vocab);
  for (size_t i = 0; i < vocab; ++i) w[i] = std::exp(double(z[i]) - max_z);
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });

  size_t kept = row.top_k > 0 && size_t(row.top_k) < vocab ? size_t(row.top_k) : vocab;
  if (row.top_p < 1.0f) {
    double total = 0;
    for (size_t r = 0; r < kept; ++r) total += w[order[r]];
    const double target = double(row.top_p) * total;
    double before = 0;
    size_t r = 0;
    while (r < kept && before < target) before += w[order[r++]];
    kept = r;
  }
  std::vector<double> p(vocab, 0.0);
  double sum = 0;
  for (size_t r = 0; r < kept; ++r) {
    const int32_t id = order[r];
    if (w[id] >= double(row.min_p)) sum += (p[id] = w[id]);
  }
  for (double& x : p) x /= sum;
  return p;
}

struct Draw {
  int32_t token;
  bool near_boundary;  // u within 1e-6 of a cumulative-mass boundary
};

Draw inverse_cdf(const std::vector<double>& p, uint64_t bits) {
  const double u = double(bits) * 0x1p-64;
  double cumulative = 0;
  int32_t last = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) continue;
    const double next = cumulative + p[i];
    if (u < next) return {int32_t(i), u - cumulative < 1e-6 || next - u < 1e-6};
    cumulative = next;
    last = int32_t(i);
  }
  return {last, true};
}

// Normal logits; quantized ones (steps of 0.25) tie often, which exercises the id-order rules.
std::vector<float> random_logits(size_t vocab, float scale, bool quantized, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, scale);
  std::vector<float> logits(vocab);
  for (float& l : logits) l = quantized ? std::round(4.f * normal(rng)) / 4.f : normal(rng);
  return logits;
}

// Copies rows of `vocab` logits into an [n, ld] matrix padded with kPadding.
std::vector<float> pad_rows(const std::vector<std::vector<float>>& rows, int64_t ld) {
  std::vector<float> matrix(rows.size() * size_t(ld), kPadding);
  for (size_t r = 0; r < rows.size(); ++r) std::copy(rows[r].begin(), rows[r].end(), matrix.begin() + r * ld);
  return matrix;
}

// Checks each random row's token against the reference: a survivor, and the inverse-CDF token
// unless near a boundary. Returns how many rows were near a boundary.
int check_draws(const std::vector<std::vector<float>>& logits, const std::vector<SampleRow>& rows,
                const std::vector<int32_t>& tokens) {
  int near_boundary = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    if (rows[r].temperature < 1e-5f) {
      EXPECT_EQ(tokens[r], host_argmax(logits[r])) << "greedy row " << r;
      continue;
    }
    const std::vector<double> p = filtered_softmax(logits[r], rows[r]);
    if (tokens[r] < 0 || size_t(tokens[r]) >= p.size()) {
      ADD_FAILURE() << "row " << r << ": token " << tokens[r] << " outside the vocabulary";
      continue;
    }
    EXPECT_GT(p[tokens[r]], 0.0) << "row " << r << ": token " << tokens[r] << " was filtered out (T "
                                 << rows[r].temperature << ", k " << rows[r].top_k << ", p "
                                 << rows[r].top_p << ", min_p " << rows[r].min_p << ")";
    const Draw expected = inverse_cdf(p, sampling_random_bits(rows[r].seed, rows[r].offset));
    if (expected.near_boundary) {
      ++near_boundary;
    } else {
      EXPECT_EQ(tokens[r], expected.token) << "row " << r;
    }
  }
  return near_boundary;
}

TEST(SamplingBits, RandomBitsArePhilox4x32_10) {
  // Random123's known answer for counter 0, key 0: words 0x6627e8d5 0xe169c58d ...
  EXPECT_EQ(sampling_random_bits(0, 0), 0x6627e8d5e169c58dULL);
  EXPECT_NE(sampling_random_bits(0, 1), sampling_random_bits(0, 0));
  EXPECT_NE(sampling_random_bits(1, 0), sampling_random_bits(0, 0));
  EXPECT_NE(sampling_random_bits(0, uint64_t(1) << 32), sampling_random_bits(0, 0));
}

TEST(SamplingShapes, RejectsBadShapes) {
  EXPECT_THROW(sample_tokens(nullptr, 10, 11, nullptr, 1, nullptr, nullptr), Error);  // ld < vocab
  EXPECT_THROW(sample_tokens(nullptr, 1 << 24, 1 << 24, nullptr, 1, nullptr, nullptr), Error);
}

class GpuSampling : public GpuTest {};

TEST_F(GpuSampling, GreedyIsTheHostArgmax) {
  const int32_t vocab = 1000;
  const int64_t ld = 1037;  // odd: rows start unaligned
  std::mt19937 rng(11);
  std::vector<std::vector<float>> logits;
  std::vector<SampleRow> rows;
  for (int r = 0; r < 48; ++r) {
    std::vector<float> l = random_logits(vocab, 4.f, true, rng);
    const float max = *std::max_element(l.begin(), l.end());
    switch (r % 6) {
      case 0:  // the max tied at later ids too
        for (int j = 0; j < 3; ++j) l[rng() % vocab] = max;
        break;
      case 1:  // -inf at half the ids
        for (int32_t i = 0; i < vocab; i += 2) l[i] = -INFINITY;
        break;
      case 2:  // one finite logit
        std::fill(l.begin(), l.end(), -INFINITY);
        l[rng() % vocab] = -3.f;
        break;
      case 3:  // all equal: id 0
        std::fill(l.begin(), l.end(), 1.5f);
        break;
      case 4:  // the max at the last valid column
        l[vocab - 1] = max + 1.f;
        break;
      default:
        break;
    }
    logits.push_back(l);
    // Greedy rows (temperature 0 and just below 1e-5) interleaved with random ones.
    const float temperature = r % 3 == 0 ? 0.f : r % 3 == 1 ? 9e-6f : 1.f;
    rows.push_back({temperature, 5, 0.9f, 0.f, uint64_t(r), 0});
  }
  const std::vector<int32_t> tokens = sample_on_device(pad_rows(logits, ld), ld, vocab, rows);
  EXPECT_LE(check_draws(logits, rows, tokens), 1);
  for (size_t r = 0; r < rows.size(); r += 3) EXPECT_EQ(tokens[r], host_argmax(logits[r])) << r;
}

TEST_F(GpuSampling, DrawsAreSurvivorsAtTheInverseCdf) {
  const int32_t vocab = 3000;
  std::mt19937 rng(12);
  std::vector<std::vector<float>> logits;
  std::vector<SampleRow> rows;
  uint64_t seed = 100;
  for (float temperature : {0.6f, 1.0f, 1.5f}) {
    for (int32_t top_k : {0, 1, 7, 50, vocab}) {
      for (float top_p : {1.0f, 0.95f, 0.6f}) {
        for (float min_p : {0.0f, 0.05f, 0.3f}) {
          for (int rep = 0; rep < 4; ++rep) {
            logits.push_back(random_logits(vocab, 2.f, rep % 2 == 0, rng));
            rows.push_back({temperature, top_k, top_p, min_p, seed++, uint64_t(rep) * 1000003});
          }
        }
      }
    }
  }
  const std::vector<int32_t> tokens = sample_on_device(pad_rows(logits, vocab), vocab, vocab, rows);
  EXPECT_LE(check_draws(logits, rows, tokens), 3) << "of " << rows.size() << " rows";
}

TEST_F(GpuSampling, TopKOneIsGreedy) {
  const int32_t vocab = 777;
  std::mt19937 rng(13);
  std::vector<std::vector<float>> logits;
  std::vector<SampleRow> rows;
  for (int r = 0; r < 64; ++r) {
    std::vector<float> l = random_logits(vocab, 1.f, true, rng);
    const float max = *std::max_element(l.begin(), l.end());
    for (int j = 0; j < r % 4; ++j) l[rng() % vocab] = max;  // ties at the max
    logits.push_back(l);
    rows.push_back({1.0f, 1, r % 2 ? 0.5f : 1.0f, r % 3 ? 0.1f : 0.f, uint64_t(r) * 77, uint64_t(r)});
  }
  const std::vector<int32_t> tokens = sample_on_device(pad_rows(logits, vocab), vocab, vocab, rows);
  for (size_t r = 0; r < rows.size(); ++r) EXPECT_EQ(tokens[r], host_argmax(logits[r])) << "row " << r;
}

TEST_F(GpuSampling, DrawDependsOnlyOnSeedAndOffset) {
  const int32_t vocab = 500;
  std::mt19937 rng(14);
  // 16 requests alone, then the same 16 scattered among 24 others.
  std::vector<std::vector<float>> alone_logits, mixed_logits;
  std::vector<SampleRow> alone, mixed;
  for (int r = 0; r < 16; ++r) {
    alone_logits.push_back(random_logits(vocab, 1.f, r % 2 == 0, rng));
    alone.push_back({0.5f + 0.1f * float(r), r % 3 ? 20 : 0, r % 2 ? 0.9f : 1.f, r % 4 ? 0.f : 0.02f,
                     uint64_t(1000 + r), uint64_t(r * r)});
  }
  std::vector<int> position(40, -1);
  std::vector<int> slots(40);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  for (int r = 0; r < 16; ++r) position[slots[r]] = r;
  for (int slot = 0; slot < 40; ++slot) {
    if (position[slot] >= 0) {
      mixed_logits.push_back(alone_logits[position[slot]]);
      mixed.push_back(alone[position[slot]]);
    } else {
      mixed_logits.push_back(random_logits(vocab, 3.f, false, rng));
      mixed.push_back({1.f, 0, 1.f, 0.f, rng(), rng()});
    }
  }
  const std::vector<int32_t> a = sample_on_device(pad_rows(alone_logits, vocab), vocab, vocab, alone);
  const std::vector<int32_t> b = sample_on_device(pad_rows(mixed_logits, vocab), vocab, vocab, mixed);
  for (int slot = 0; slot < 40; ++slot) {
    if (position[slot] >= 0) {
      EXPECT_EQ(b[slot], a[position[slot]]) << "request " << position[slot];
    }
  }
  const std::vector<int32_t> again = sample_on_device(pad_rows(mixed_logits, vocab), vocab, vocab, mixed);
  EXPECT_EQ(again, b);

  // A uniform row (all logits equal), 1000 offsets, seeds 1 and 2: the offsets spread the draws
  // (1000 uniform draws over 500 tokens hit ~432 distinct ones) and the seeds decorrelate them
  // (two independent sequences agree at ~2 of 1000 positions).
  const std::vector<float> flat(vocab, 0.f);
  std::vector<SampleRow> seed1, seed2;
  for (uint64_t offset = 0; offset < 1000; ++offset) {
    seed1.push_back({1.f, 0, 1.f, 0.f, 1, offset});
    seed2.push_back({1.f, 0, 1.f, 0.f, 2, offset});
  }
  const std::vector<float> flat_matrix = pad_rows(std::vector<std::vector<float>>(1000, flat), vocab);
  const std::vector<int32_t> t1 = sample_on_device(flat_matrix, vocab, vocab, seed1);
  const std::vector<int32_t> t2 = sample_on_device(flat_matrix, vocab, vocab, seed2);
  EXPECT_GT(std::set<int32_t>(t1.begin(), t1.end()).size(), 350u);
  int same = 0;
  for (size_t i = 0; i < t1.size(); ++i) same += t1[i] == t2[i];
  EXPECT_LT(same, 15);
}

TEST_F(GpuSampling, FrequenciesMatchTheFilteredSoftmax) {
  const int32_t vocab = 50;
  const int draws = 20000;
  std::mt19937 rng(15);
  const std::vector<float> logits = random_logits(vocab, 1.5f, false, rng);
  const std::vector<float> matrix = pad_rows(std::vector<std::vector<float>>(draws, logits), vocab);
  const SampleRow cases[] = {
      {1.0f, 0, 1.0f, 0.0f, 1234, 0},   // the plain softmax
      {0.7f, 0, 1.0f, 0.0f, 1234, 0},   // temperature
      {1.3f, 10, 1.0f, 0.0f, 99, 0},    // top-k
      {1.0f, 0, 0.8f, 0.0f, 7, 0},      // top-p
      {1.0f, 20, 0.9f, 0.05f, 8, 0},    // all three
  };
  for (const SampleRow& base : cases) {
    std::vector<SampleRow> rows(draws, base);
    for (int i = 0; i < draws; ++i) rows[i].offset = uint64_t(i);
    const std::vector<int32_t> tokens = sample_on_device(matrix, vocab, vocab, rows);
    std::vector<int> count(vocab, 0);
    for (int32_t t : tokens) {
      ASSERT_TRUE(t >= 0 && t < vocab) << t;
      ++count[t];
    }
    const std::vector<double> p = filtered_softmax(logits, base);
    for (int32_t i = 0; i < vocab; ++i) {
      const double frequency = double(count[i]) / draws;
      const double sigma = std::sqrt(p[i] * (1 - p[i]) / draws);
      EXPECT_NEAR(frequency, p[i], 5 * sigma + 1e-12)
          << "token " << i << " (T " << base.temperature << ", k " << base.top_k << ", p " << base.top_p
          << ", min_p " << base.min_p << ")";
    }
  }
}

TEST_F(GpuSampling, LargeVocabulary) {
  const int32_t vocab = 152064;
  const int64_t ld = vocab + 128;  // a padded vocabulary
  std::mt19937 rng(16);
  const SampleRow cases[] = {
      {0.0f, 0, 1.0f, 0.0f, 1, 0},         {0.8f, 40, 0.95f, 0.05f, 2, 5},  // the CLI's defaults
      {1.0f, 0, 1.0f, 0.0f, 3, 6},         {1.0f, 0, 0.9f, 0.0f, 4, 7},
      {0.7f, 1000, 1.0f, 0.0f, 5, 8},      {1.2f, 0, 0.5f, 0.01f, 6, 9},
      {1.0f, vocab - 1, 0.99f, 0.0f, 7, 10}, {2.0f, 0, 1.0f, 0.001f, 8, 11},
  };
  std::vector<std::vector<float>> logits;
  std::vector<SampleRow> rows;
  for (int rep = 0; rep < 2; ++rep) {
    for (const SampleRow& row : cases) {
      logits.push_back(random_logits(vocab, 3.f, rep == 1, rng));
      rows.push_back(row);
    }
  }
  const std::vector<int32_t> tokens = sample_on_device(pad_rows(logits, ld), ld, vocab, rows);
  EXPECT_LE(check_draws(logits, rows, tokens), 1);
}

}  // namespace
}  // namespace pagoda::cuda

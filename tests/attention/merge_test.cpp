#include "pagoda/attention/merge.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "reference.h"

namespace pagoda::attention {
namespace {

using testing::Random;

constexpr int32_t kHeadDim = 64;

struct State {
  std::vector<float> o = std::vector<float>(kHeadDim, 0.f);
  float lse = kEmptyLse;
};

State random_state(Random& rng) {
  State s;
  for (float& x : s.o) x = rng.uniform(-1, 1);
  s.lse = rng.uniform(-20, 20);
  return s;
}

State merged(State a, const State& b) {
  merge_state(a.o.data(), a.lse, b.o.data(), b.lse, kHeadDim);
  return a;
}

void expect_near(const State& a, const State& b, float tolerance) {
  EXPECT_NEAR(a.lse, b.lse, tolerance * std::max(1.f, std::abs(b.lse)));
  for (int32_t d = 0; d < kHeadDim; ++d) EXPECT_NEAR(a.o[size_t(d)], b.o[size_t(d)], tolerance) << d;
}

TEST(MergeState, EmptyStateIsTheIdentity) {
  Random rng(1);
  const State s = random_state(rng), empty;
  for (const State& m : {merged(s, empty), merged(empty, s)}) {
    EXPECT_EQ(m.lse, s.lse);
    EXPECT_EQ(m.o, s.o);
  }
}

// Both sides empty: max(lse) = -inf and exp(-inf - -inf) would be NaN; the merge must stay empty.
TEST(MergeState, TwoEmptyStatesStayEmptyWithoutNan) {
  const State m = merged(State{}, State{});
  EXPECT_EQ(m.lse, kEmptyLse);
  for (float x : m.o) EXPECT_EQ(x, 0.f);
}

TEST(MergeState, IsCommutativeAndAssociative) {
  Random rng(2);
  for (int trial = 0; trial < 100; ++trial) {
    const State a = random_state(rng), b = random_state(rng), c = random_state(rng);
    expect_near(merged(a, b), merged(b, a), 1e-6f);
    expect_near(merged(merged(a, b), c), merged(a, merged(b, c)), 2e-6f);
  }
}

// Far-apart lse values must not overflow: the weights are taken relative to the max.
TEST(MergeState, LargeLseDoesNotOverflow) {
  Random rng(3);
  State a = random_state(rng), b = random_state(rng);
  a.lse = 1000.f;  // exp(1000) overflows fp32; the merge only ever needs exp(-1)
  b.lse = 1001.f;
  const State m = merged(a, b);
  const double wa = 1 / (1 + std::exp(1.0)), wb = 1 - wa;
  EXPECT_NEAR(m.lse, 1001.0 + std::log1p(std::exp(-1.0)), 1e-4);
  for (int32_t d = 0; d < kHeadDim; ++d) EXPECT_NEAR(m.o[size_t(d)], wa * a.o[size_t(d)] + wb * b.o[size_t(d)], 1e-6);
}

// The states of two halves of a KV set, merged, equal attention over the whole set; for every
// split point, including the ends (one half empty).
TEST(MergeState, HalvesMergeToTheWhole) {
  testing::HostPool pool(DType::kF32, KvLayout::kHnd, 4, 16, 1, kHeadDim);
  testing::HostSequence seq;
  seq.blocks = {0, 1, 2, 3};
  Random rng(4);
  testing::fill_tokens(pool, seq, 0, 50, rng);
  std::vector<float> q(kHeadDim);
  for (float& x : q) x = rng.uniform(-4, 4);
  const auto whole = testing::reference_attention(q.data(), seq, 0, 1, kHeadDim, 0.125, 0, 50);
  for (int32_t split : {0, 1, 16, 25, 49, 50}) {
    State halves[2];
    const int32_t bounds[3] = {0, split, 50};
    for (int i = 0; i < 2; ++i) {
      const auto ref = testing::reference_attention(q.data(), seq, 0, 1, kHeadDim, 0.125, bounds[i], bounds[i + 1]);
      for (int32_t d = 0; d < kHeadDim; ++d) halves[i].o[size_t(d)] = float(ref.o[size_t(d)]);
      halves[i].lse = float(ref.lse);
    }
    const State m = merged(halves[0], halves[1]);
    EXPECT_NEAR(m.lse, whole.lse, 1e-5) << split;
    for (int32_t d = 0; d < kHeadDim; ++d) EXPECT_NEAR(m.o[size_t(d)], whole.o[size_t(d)], 1e-6) << split;
  }
}

}  // namespace
}  // namespace pagoda::attention

// Causal prefill attention over the paged pool against the exact reference: first chunks
// (start_pos 0), later chunks and prefix-cache hits (start_pos > 0), and sequences that share
// their leading blocks. Tolerance as for decode (decode_test.cpp): 2e-5 on o and lse.
#include "pagoda/backend/cpu/prefill_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <tuple>

#include "pagoda/backend/cpu/decode_attention.h"
#include "pagoda/attention/plan.h"
#include "pagoda/core/error.h"
#include "../attention/reference.h"

namespace pagoda::attention {
namespace {

using cpu::prefill_attention_cpu;
using cpu::run_decode_cpu;

using testing::HostPool;
using testing::HostSequence;
using testing::Random;

constexpr double kTolerance = 2e-5;
constexpr int32_t kNumKvHeads = 2;

// Runs prefill of tokens [start_pos, start_pos + num_new) of seq (already in the pool) and
// checks each row against the reference over tokens [0, start_pos + i].
void check_prefill(const AttentionShape& shape, HostPool& pool, const HostSequence& seq,
                   int32_t start_pos, int32_t num_new, Random& rng) {
  std::vector<float> q(size_t(num_new) * size_t(shape.num_q_heads) * size_t(shape.head_dim));
  for (float& x : q) x = rng.uniform(-4, 4);
  std::vector<float> out(q.size(), std::nanf("")), lse(size_t(num_new) * size_t(shape.num_q_heads));
  prefill_attention_cpu(shape, pool.view(), seq.blocks, start_pos, num_new, q.data(), out.data(), lse.data());
  const int32_t group = shape.group_size();
  for (int32_t i = 0; i < num_new; ++i) {
    for (int32_t h = 0; h < shape.num_q_heads; ++h) {
      const size_t row = size_t(i) * size_t(shape.num_q_heads) + size_t(h);
      const auto ref = testing::reference_attention(&q[row * size_t(shape.head_dim)], seq, h / group,
                                                    shape.num_kv_heads, shape.head_dim,
                                                    shape.softmax_scale, 0, start_pos + i + 1);
      ASSERT_NEAR(lse[row], ref.lse, kTolerance * std::max(1.0, std::abs(ref.lse))) << i << " " << h;
      for (int32_t d = 0; d < shape.head_dim; ++d) {
        ASSERT_NEAR(out[row * size_t(shape.head_dim) + size_t(d)], ref.o[size_t(d)], kTolerance)
            << "token " << i << " head " << h << " d " << d;
      }
    }
  }
}

class PrefillGrid : public ::testing::TestWithParam<
                        std::tuple<int32_t, int32_t, int32_t, KvLayout, DType, std::pair<int32_t, int32_t>>> {};

TEST_P(PrefillGrid, MatchesReference) {
  const auto [block_size, head_dim, group, layout, dtype, chunk] = GetParam();
  const auto [start_pos, num_new] = chunk;
  const int32_t length = start_pos + num_new;
  const int32_t num_blocks = (length + block_size - 1) / block_size;
  HostPool pool(dtype, layout, num_blocks + 2, block_size, kNumKvHeads, head_dim);
  Random rng(uint64_t(length) * 31 + uint64_t(head_dim));
  // Scattered distinct block ids, so that a wrong index reads another block's data.
  std::vector<int32_t> ids(size_t(pool.num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  for (size_t i = ids.size() - 1; i > 0; --i) std::swap(ids[i], ids[rng.next(i + 1)]);
  HostSequence seq;
  seq.blocks.assign(ids.begin(), ids.begin() + num_blocks);
  testing::fill_tokens(pool, seq, 0, length, rng);
  const AttentionShape shape{group * kNumKvHeads, kNumKvHeads, head_dim, block_size,
                             1.f / std::sqrt(float(head_dim))};
  check_prefill(shape, pool, seq, start_pos, num_new, rng);
}

std::string case_name(const ::testing::TestParamInfo<PrefillGrid::ParamType>& info) {
  const auto [block_size, head_dim, group, layout, dtype, chunk] = info.param;
  return "Bs" + std::to_string(block_size) + "_D" + std::to_string(head_dim) + "_G" +
         std::to_string(group) + "_" + (layout == KvLayout::kHnd ? "HND" : "NHD") + "_" +
         std::string(dtype_name(dtype)) + "_Start" + std::to_string(chunk.first) + "_New" +
         std::to_string(chunk.second);
}

INSTANTIATE_TEST_SUITE_P(
    Grid, PrefillGrid,
    ::testing::Combine(::testing::Values(16, 32), ::testing::Values(64, 128), ::testing::Values(1, 3, 4),
                       ::testing::Values(KvLayout::kHnd, KvLayout::kNhd),
                       ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                       // (start_pos, num_new): a whole prompt, one token, a chunk starting at a
                       // block boundary, one starting mid-block, and a long cached prefix.
                       ::testing::Values(std::pair{0, 1}, std::pair{0, 35}, std::pair{32, 32},
                                         std::pair{37, 50}, std::pair{300, 3})),
    case_name);

// Two sequences share a 2-block prompt prefix (same physical blocks) and diverge after it. Each
// is prefilled from the end of the cached prefix, as after a prefix-cache hit, and must equal the
// reference over its own tokens. Then one decode step over both agrees with the reference too.
TEST(Prefill, SequencesSharingLeadingBlocks) {
  const int32_t block_size = 16, head_dim = 64, prefix = 32;
  const AttentionShape shape{9, 3, head_dim, block_size, 0.125f};
  HostPool pool(DType::kBF16, KvLayout::kHnd, 8, block_size, shape.num_kv_heads, head_dim);
  Random rng(11);
  HostSequence a, b;
  a.blocks = {5, 0, 3, 7};
  b.blocks = {5, 0, 1};
  testing::fill_tokens(pool, a, 0, prefix, rng);
  b.k = a.k;  // the shared prefix: same blocks, same values
  b.v = a.v;
  b.length = prefix;
  testing::fill_tokens(pool, a, prefix, 60, rng);
  testing::fill_tokens(pool, b, prefix, 41, rng);
  check_prefill(shape, pool, a, prefix, 60 - prefix, rng);
  check_prefill(shape, pool, b, prefix, 41 - prefix, rng);
  check_prefill(shape, pool, b, 0, 41, rng);  // and the whole of b at once

  DecodeBatch batch;
  batch.add_sequence(a.blocks, 60);
  batch.add_sequence(b.blocks, 41);
  std::vector<float> q(2 * 9 * head_dim), out(q.size());
  for (float& x : q) x = rng.uniform(-4, 4);
  const DecodePlan plan = plan_decode(batch, shape, DeviceInfo{.num_workers = 4},
                                      PlanOptions{.max_kv_tokens_per_item = 16});
  run_decode_cpu(plan, batch, shape, pool.view(), q.data(), out.data());
  for (int32_t s = 0; s < 2; ++s) {
    for (int32_t h = 0; h < 9; ++h) {
      const size_t row = size_t(s) * 9 + size_t(h);
      const auto ref = testing::reference_attention(&q[row * head_dim], s == 0 ? a : b, h / 3, 3,
                                                    head_dim, 0.125, 0, s == 0 ? 60 : 41);
      for (int32_t d = 0; d < head_dim; ++d) ASSERT_NEAR(out[row * head_dim + size_t(d)], ref.o[size_t(d)], kTolerance);
    }
  }
}

TEST(Prefill, RejectsBlocksThatDoNotCoverTheChunk) {
  HostPool pool(DType::kF32, KvLayout::kHnd, 2, 16, 1, 64);
  const AttentionShape shape{1, 1, 64, 16, 0.125f};
  std::vector<float> q(64 * 20), out(q.size());
  const std::vector<int32_t> one_block = {0};
  EXPECT_THROW(prefill_attention_cpu(shape, pool.view(), one_block, 0, 20, q.data(), out.data()), Error);
  const std::vector<int32_t> outside = {0, 9};
  EXPECT_THROW(prefill_attention_cpu(shape, pool.view(), outside, 0, 20, q.data(), out.data()), Error);
}

}  // namespace
}  // namespace pagoda::attention

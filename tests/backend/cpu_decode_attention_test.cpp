// Decode attention through plan_decode + run_decode_cpu against the exact reference, over a grid
// of batch sizes, KV lengths, block sizes, head dims, GQA groups, pool layouts and dtypes, and
// plans without splits, with the planner's splits and with forced splits.
//
// Tolerance: f16/bf16 pools are compared with the reference over the same rounded values, so
// every dtype is held to the fp32 accumulation error of the executor: |o - ref| <= 2e-5 and
// |lse - ref| <= 2e-5 * max(1, |ref|) (observed: below 2e-6).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <tuple>

#include "pagoda/backend/cpu/decode_attention.h"
#include "pagoda/attention/plan.h"
#include "pagoda/core/error.h"
#include "../attention/reference.h"

namespace pagoda::attention {
namespace {

using cpu::run_decode_cpu;

using testing::HostPool;
using testing::HostSequence;
using testing::Random;

constexpr double kTolerance = 2e-5;
constexpr int32_t kNumKvHeads = 2;

// Plans: unsplit, the planner's own splits, and the finest forced split (every block an item).
// Odd chunk sizes are covered by plan_test and the SmolLM2 case.
enum class Split { kNone, kAuto, kOneBlock };

const char* split_name(Split s) {
  switch (s) {
    case Split::kNone: return "NoSplit";
    case Split::kAuto: return "AutoSplit";
    case Split::kOneBlock: return "Split1Block";
  }
  return "?";
}

PlanOptions options_for(Split split, int32_t block_size) {
  PlanOptions options;
  switch (split) {
    case Split::kNone: options.allow_split = false; break;
    case Split::kAuto: options.min_kv_tokens_per_item = 64; break;
    case Split::kOneBlock: options.max_kv_tokens_per_item = block_size; break;
  }
  return options;
}

// KV lengths of a batch: 1, exactly one block, one block + 1, ragged ones, and a long one.
std::vector<int32_t> lengths_for(int32_t batch, int32_t block_size) {
  const std::vector<int32_t> all = {1, block_size, block_size + 1, 3000, 2 * block_size - 1, 7,
                                    5 * block_size + 3, 100};
  if (batch == 3) return {block_size + 1, 3000, 1};
  return {all.begin(), all.begin() + batch};
}

struct Case {
  int32_t batch, block_size, head_dim, group;
  KvLayout layout;
  DType dtype;
  Split split;
};

struct Result {
  double max_o_error = 0, max_lse_error = 0;
};

// Builds the pool and batch for `lengths`, runs the plan, checks every row against the reference.
Result run_case(const Case& c, const std::vector<int32_t>& lengths, uint64_t seed) {
  const int32_t num_q_heads = c.group * kNumKvHeads;
  int32_t total_blocks = 0;
  for (int32_t length : lengths) total_blocks += (length + c.block_size - 1) / c.block_size;
  HostPool pool(c.dtype, c.layout, total_blocks + 3, c.block_size, kNumKvHeads, c.head_dim);

  // Scattered block ids, block 0 included, so that a wrong index reads someone else's data.
  std::vector<int32_t> free_ids(size_t(pool.num_blocks));
  std::iota(free_ids.begin(), free_ids.end(), 0);
  Random rng(seed);
  for (size_t i = free_ids.size() - 1; i > 0; --i) std::swap(free_ids[i], free_ids[rng.next(i + 1)]);

  DecodeBatch batch;
  std::vector<HostSequence> seqs(lengths.size());
  size_t next_id = 0;
  for (size_t s = 0; s < lengths.size(); ++s) {
    const int32_t num_blocks = (lengths[s] + c.block_size - 1) / c.block_size;
    seqs[s].blocks.assign(free_ids.begin() + long(next_id), free_ids.begin() + long(next_id + size_t(num_blocks)));
    next_id += size_t(num_blocks);
    testing::fill_tokens(pool, seqs[s], 0, lengths[s], rng);
    batch.add_sequence(seqs[s].blocks, lengths[s]);
  }
  // Large q: peaked softmax distributions, so that the running max changes between blocks.
  std::vector<float> q(lengths.size() * size_t(num_q_heads) * size_t(c.head_dim));
  for (float& x : q) x = rng.uniform(-4, 4);

  const AttentionShape shape{.num_q_heads = num_q_heads, .num_kv_heads = kNumKvHeads,
                             .head_dim = c.head_dim, .block_size = c.block_size,
                             .softmax_scale = 1.f / std::sqrt(float(c.head_dim))};
  const DecodePlan plan = plan_decode(batch, shape, DeviceInfo{.num_workers = 64},
                                      options_for(c.split, c.block_size));
  std::vector<float> out(q.size(), std::nanf("")), lse(lengths.size() * size_t(num_q_heads));
  run_decode_cpu(plan, batch, shape, pool.view(), q.data(), out.data(), lse.data());

  Result result;
  for (size_t s = 0; s < lengths.size(); ++s) {
    for (int32_t h = 0; h < num_q_heads; ++h) {
      const size_t row = s * size_t(num_q_heads) + size_t(h);
      const auto ref = testing::reference_attention(&q[row * size_t(c.head_dim)], seqs[s],
                                                    h / c.group, kNumKvHeads, c.head_dim,
                                                    shape.softmax_scale, 0, lengths[s]);
      for (int32_t d = 0; d < c.head_dim; ++d) {
        result.max_o_error = std::max(
            result.max_o_error, std::abs(double(out[row * size_t(c.head_dim) + size_t(d)]) - ref.o[size_t(d)]));
      }
      result.max_lse_error = std::max(result.max_lse_error,
                                      std::abs(double(lse[row]) - ref.lse) / std::max(1.0, std::abs(ref.lse)));
    }
  }
  return result;
}

class DecodeGrid : public ::testing::TestWithParam<
                       std::tuple<int32_t, int32_t, int32_t, int32_t, KvLayout, DType, Split>> {};

TEST_P(DecodeGrid, MatchesReference) {
  const auto [batch, block_size, head_dim, group, layout, dtype, split] = GetParam();
  const Case c{batch, block_size, head_dim, group, layout, dtype, split};
  // Batch 1 runs once per length, so every length is also seen alone.
  std::vector<std::vector<int32_t>> batches;
  if (batch == 1) {
    for (int32_t length : lengths_for(8, block_size)) batches.push_back({length});
  } else {
    batches.push_back(lengths_for(batch, block_size));
  }
  for (size_t i = 0; i < batches.size(); ++i) {
    const Result r = run_case(c, batches[i], 1000 + i);
    EXPECT_LE(r.max_o_error, kTolerance) << "lengths[0] = " << batches[i][0];
    EXPECT_LE(r.max_lse_error, kTolerance) << "lengths[0] = " << batches[i][0];
  }
}

std::string case_name(const ::testing::TestParamInfo<DecodeGrid::ParamType>& info) {
  const auto [batch, block_size, head_dim, group, layout, dtype, split] = info.param;
  return "B" + std::to_string(batch) + "_Bs" + std::to_string(block_size) + "_D" +
         std::to_string(head_dim) + "_G" + std::to_string(group) + "_" +
         (layout == KvLayout::kHnd ? "HND" : "NHD") + "_" + std::string(dtype_name(dtype)) + "_" +
         split_name(split);
}

INSTANTIATE_TEST_SUITE_P(
    Grid, DecodeGrid,
    ::testing::Combine(::testing::Values(1, 3, 8), ::testing::Values(16, 32),
                       ::testing::Values(64, 128), ::testing::Values(1, 3, 4),
                       ::testing::Values(KvLayout::kHnd, KvLayout::kNhd),
                       ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                       ::testing::Values(Split::kNone, Split::kAuto, Split::kOneBlock)),
    case_name);

// SmolLM2-135M's shape: 9 q heads over 3 kv heads, head_dim 64, 16-token blocks.
TEST(Decode, SmolLm2Shape) {
  const int32_t num_q_heads = 9, num_kv_heads = 3, head_dim = 64, block_size = 16;
  const std::vector<int32_t> lengths = {1, 16, 17, 300, 45};
  int32_t total_blocks = 0;
  for (int32_t length : lengths) total_blocks += (length + block_size - 1) / block_size;
  HostPool pool(DType::kF32, KvLayout::kHnd, total_blocks, block_size, num_kv_heads, head_dim);
  Random rng(7);
  DecodeBatch batch;
  std::vector<HostSequence> seqs(lengths.size());
  int32_t next_id = total_blocks;  // ids handed out from the top down
  for (size_t s = 0; s < lengths.size(); ++s) {
    for (int32_t b = 0; b < (lengths[s] + block_size - 1) / block_size; ++b) seqs[s].blocks.push_back(--next_id);
    testing::fill_tokens(pool, seqs[s], 0, lengths[s], rng);
    batch.add_sequence(seqs[s].blocks, lengths[s]);
  }
  std::vector<float> q(lengths.size() * num_q_heads * head_dim);
  for (float& x : q) x = rng.uniform(-4, 4);
  const AttentionShape shape{num_q_heads, num_kv_heads, head_dim, block_size, 0.125f};
  for (const PlanOptions& options : {PlanOptions{.allow_split = false},
                                     PlanOptions{.max_kv_tokens_per_item = 40}}) {  // 2-block items
    const DecodePlan plan = plan_decode(batch, shape, DeviceInfo{.num_workers = 8}, options);
    std::vector<float> out(q.size());
    run_decode_cpu(plan, batch, shape, pool.view(), q.data(), out.data());  // no lse wanted
    for (size_t s = 0; s < lengths.size(); ++s) {
      for (int32_t h = 0; h < num_q_heads; ++h) {
        const size_t row = s * num_q_heads + size_t(h);
        const auto ref = testing::reference_attention(&q[row * head_dim], seqs[s], h / 3,
                                                      num_kv_heads, head_dim, 0.125, 0, lengths[s]);
        for (int32_t d = 0; d < head_dim; ++d) {
          ASSERT_NEAR(out[row * head_dim + size_t(d)], ref.o[size_t(d)], kTolerance) << s << " " << h;
        }
      }
    }
  }
}

// A sequence with no KV yet gets the empty state, not NaN, split or not.
TEST(Decode, EmptySequenceGivesEmptyState) {
  HostPool pool(DType::kF32, KvLayout::kHnd, 4, 16, 1, 64);
  Random rng(3);
  HostSequence seq;
  seq.blocks = {2, 0};
  testing::fill_tokens(pool, seq, 0, 20, rng);
  DecodeBatch batch;
  batch.add_sequence({}, 0);
  batch.add_sequence(seq.blocks, 20);
  const AttentionShape shape{1, 1, 64, 16, 0.125f};
  std::vector<float> q(2 * 64, 0.5f), out(2 * 64, 1.f), lse(2);
  const DecodePlan plan = plan_decode(batch, shape, DeviceInfo{.num_workers = 16},
                                      PlanOptions{.max_kv_tokens_per_item = 16});
  run_decode_cpu(plan, batch, shape, pool.view(), q.data(), out.data(), lse.data());
  for (int32_t d = 0; d < 64; ++d) EXPECT_EQ(out[size_t(d)], 0.f);
  EXPECT_EQ(lse[0], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isfinite(lse[1]));
}

TEST(Decode, RejectsPoolThatDoesNotMatch) {
  HostPool pool(DType::kF32, KvLayout::kHnd, 2, 16, 1, 64);
  DecodeBatch batch;
  batch.add_sequence(std::vector<int32_t>{5}, 3);  // block 5 is outside the 2-block pool
  const AttentionShape shape{1, 1, 64, 16, 0.125f};
  const DecodePlan plan = plan_decode(batch, shape, DeviceInfo{});
  std::vector<float> q(64), out(64);
  EXPECT_THROW(run_decode_cpu(plan, batch, shape, pool.view(), q.data(), out.data()), Error);
  const AttentionShape other_dim{1, 1, 128, 16, 0.125f};
  EXPECT_THROW(run_decode_cpu(plan, batch, other_dim, pool.view(), q.data(), out.data()), Error);
}

}  // namespace
}  // namespace pagoda::attention

#include "pagoda/attention/plan.h"

#include <gtest/gtest.h>

#include <map>
#include <utility>

#include "pagoda/core/error.h"

namespace pagoda::attention {
namespace {

AttentionShape shape_of(int32_t num_q_heads, int32_t num_kv_heads, int32_t block_size = 16) {
  return {num_q_heads, num_kv_heads, 64, block_size, 0.125f};
}

// A batch whose sequence s has lengths[s] tokens in consecutive block ids.
DecodeBatch batch_of(const std::vector<int32_t>& lengths, int32_t block_size = 16) {
  DecodeBatch batch;
  int32_t next = 0;
  for (int32_t length : lengths) {
    std::vector<int32_t> ids;
    for (int32_t b = 0; b < (length + block_size - 1) / block_size; ++b) ids.push_back(next++);
    batch.add_sequence(ids, length);
  }
  return batch;
}

// Every (sequence, kv head) is covered by items whose token ranges tile [0, length) in order,
// block-aligned, with partial slots that its merge task lists exactly.
void expect_well_formed(const DecodePlan& plan, const DecodeBatch& batch, const AttentionShape& shape) {
  std::map<std::pair<int32_t, int32_t>, std::vector<WorkItem>> by_unit;
  for (const WorkItem& item : plan.items) by_unit[{item.seq, item.kv_head}].push_back(item);
  ASSERT_EQ(by_unit.size(), size_t(batch.num_seqs()) * size_t(shape.num_kv_heads));
  std::map<std::pair<int32_t, int32_t>, MergeTask> merges;
  for (const MergeTask& m : plan.merges) merges[{m.seq, m.kv_head}] = m;
  std::vector<int> slot_uses(size_t(plan.num_partials), 0);
  for (const auto& [unit, items] : by_unit) {
    const int32_t length = batch.kv_lengths[size_t(unit.first)];
    int32_t next = 0;
    for (const WorkItem& item : items) {
      EXPECT_EQ(item.token_begin, next);
      EXPECT_EQ(item.token_begin % shape.block_size, 0);
      EXPECT_EQ(item.block_begin, batch.block_offsets[size_t(item.seq)] + item.token_begin / shape.block_size);
      EXPECT_TRUE(item.token_end > item.token_begin || length == 0);
      next = item.token_end;
      if (item.partial >= 0) ++slot_uses[size_t(item.partial)];
    }
    EXPECT_EQ(next, length);
    if (items.size() == 1) {
      EXPECT_EQ(items[0].partial, -1);
      EXPECT_EQ(merges.count(unit), 0u);
    } else {
      ASSERT_EQ(merges.count(unit), 1u);
      const MergeTask& m = merges[unit];
      ASSERT_EQ(m.num_partials, int32_t(items.size()));
      for (size_t i = 0; i < items.size(); ++i) EXPECT_EQ(items[i].partial, m.partial_begin + int32_t(i));
    }
  }
  for (int uses : slot_uses) EXPECT_EQ(uses, 1);
}

TEST(PlanDecode, NoSplitWhenTheBatchFillsTheWorkers) {
  const DecodeBatch batch = batch_of({3000, 5, 17, 16});
  const AttentionShape shape = shape_of(8, 2);
  const DecodePlan plan = plan_decode(batch, shape, DeviceInfo{.num_workers = 8});
  EXPECT_EQ(plan.items.size(), 8u);
  EXPECT_TRUE(plan.merges.empty());
  EXPECT_EQ(plan.num_partials, 0);
  EXPECT_EQ(plan.kv_tokens_per_item, 0);
  expect_well_formed(plan, batch, shape);
}

TEST(PlanDecode, SplitsLongKvWhenTheBatchIsSmall) {
  const DecodeBatch batch = batch_of({3000});
  const AttentionShape shape = shape_of(9, 3);
  const DecodePlan plan = plan_decode(batch, shape, DeviceInfo{.num_workers = 32});
  // At most 32 items: 10 per kv head, and 304 is the smallest whole-block chunk that cuts 3000
  // tokens into 10 (288 would make 11).
  EXPECT_EQ(plan.kv_tokens_per_item, 304);
  EXPECT_EQ(plan.items.size(), 3u * 10u);
  EXPECT_EQ(plan.merges.size(), 3u);
  expect_well_formed(plan, batch, shape);
}

// An H200-like device: 132 SMs x 2 resident CTAs. 8 sequences x 8 kv heads = 64 units: each is
// cut into 4 equal pieces (256 items, one round); 5 pieces would need a second round.
TEST(PlanDecode, SplitFillsOneRoundOfWorkersWithEqualPieces) {
  const DecodeBatch batch = batch_of(std::vector<int32_t>(8, 32768));
  const AttentionShape shape = shape_of(32, 8);
  const DecodePlan plan = plan_decode(batch, shape, DeviceInfo{.num_workers = 264});
  EXPECT_EQ(plan.kv_tokens_per_item, 8192);
  EXPECT_EQ(plan.items.size(), 256u);
  expect_well_formed(plan, batch, shape);
}

// One long and one one-token sequence: the long one is cut so that it does not run alone on
// one worker while the others idle.
TEST(PlanDecode, SplitCutsTheLongSequenceOfAMixedBatch) {
  const DecodeBatch batch = batch_of({1, 32768});
  const AttentionShape shape = shape_of(32, 8);
  const DecodePlan plan = plan_decode(batch, shape, DeviceInfo{.num_workers = 264});
  // 8 items for the short sequence leave 256: 32 pieces of 1024 per kv head.
  EXPECT_EQ(plan.kv_tokens_per_item, 1024);
  EXPECT_EQ(plan.items.size(), 8u + 8u * 32u);
  EXPECT_EQ(plan.merges.size(), 8u);
  expect_well_formed(plan, batch, shape);
}

TEST(PlanDecode, AutomaticSplitsRespectTheMinimumAndLeaveShortSequencesWhole) {
  const DecodeBatch batch = batch_of({1000, 40});
  const AttentionShape shape = shape_of(4, 1);
  const DecodePlan plan = plan_decode(batch, shape, DeviceInfo{.num_workers = 64},
                                      PlanOptions{.min_kv_tokens_per_item = 250});
  EXPECT_EQ(plan.kv_tokens_per_item, 256);  // 1040 / 64 is below the minimum: 250 -> 256
  EXPECT_EQ(plan.items.size(), 4u + 1u);
  expect_well_formed(plan, batch, shape);
}

TEST(PlanDecode, ForcedSplitRoundsDownToWholeBlocks) {
  const DecodeBatch batch = batch_of({100, 33, 32, 1}, 32);
  const AttentionShape shape = shape_of(2, 2, 32);
  for (auto [requested, chunk] : {std::pair{70, 64}, std::pair{5, 32}, std::pair{32, 32}}) {
    const DecodePlan plan = plan_decode(batch, shape, DeviceInfo{.num_workers = 1},
                                        PlanOptions{.max_kv_tokens_per_item = requested});
    EXPECT_EQ(plan.kv_tokens_per_item, chunk);
    expect_well_formed(plan, batch, shape);
  }
}

TEST(PlanDecode, SplitCanBeTurnedOff) {
  const DecodeBatch batch = batch_of({5000});
  const AttentionShape shape = shape_of(1, 1);
  const DecodePlan plan = plan_decode(batch, shape, DeviceInfo{.num_workers = 128},
                                      PlanOptions{.allow_split = false, .max_kv_tokens_per_item = 16});
  EXPECT_EQ(plan.items.size(), 1u);
  expect_well_formed(plan, batch, shape);
}

TEST(PlanDecode, EmptySequenceIsOneEmptyItem) {
  const DecodeBatch batch = batch_of({0, 20});
  const AttentionShape shape = shape_of(1, 1);
  const DecodePlan plan = plan_decode(batch, shape, DeviceInfo{.num_workers = 64},
                                      PlanOptions{.max_kv_tokens_per_item = 16});
  expect_well_formed(plan, batch, shape);
  EXPECT_EQ(plan.items[0].token_end, 0);
}

// Sequences that share leading blocks are planned from ids and lengths alone: a plan does not
// change when the shared ids are swapped for private ones.
TEST(PlanDecode, DependsOnLayoutOfIdsNotTheirValues) {
  DecodeBatch shared, private_ids;
  shared.add_sequence(std::vector<int32_t>{0, 1, 2}, 40);
  shared.add_sequence(std::vector<int32_t>{0, 1, 3}, 35);
  private_ids.add_sequence(std::vector<int32_t>{0, 1, 2}, 40);
  private_ids.add_sequence(std::vector<int32_t>{4, 5, 6}, 35);
  const AttentionShape shape = shape_of(3, 1);
  const DecodePlan a = plan_decode(shared, shape, DeviceInfo{.num_workers = 8}, PlanOptions{.max_kv_tokens_per_item = 16});
  const DecodePlan b = plan_decode(private_ids, shape, DeviceInfo{.num_workers = 8}, PlanOptions{.max_kv_tokens_per_item = 16});
  ASSERT_EQ(a.items.size(), b.items.size());
  for (size_t i = 0; i < a.items.size(); ++i) {
    EXPECT_EQ(a.items[i].block_begin, b.items[i].block_begin);
    EXPECT_EQ(a.items[i].token_end, b.items[i].token_end);
  }
}

TEST(PlanDecode, ZeroWorkersCountsAsOne) {
  const DecodeBatch batch = batch_of({3000});
  const AttentionShape shape = shape_of(1, 1);
  const DecodePlan plan = plan_decode(batch, shape, DeviceInfo{.num_workers = 0});
  EXPECT_EQ(plan.items.size(), 1u);
}

TEST(PlanDecode, RejectsInconsistentInput) {
  EXPECT_THROW(plan_decode(batch_of({16}), shape_of(3, 2), DeviceInfo{}), Error);  // 3 % 2
  DecodeBatch too_few_blocks;
  too_few_blocks.add_sequence(std::vector<int32_t>{0}, 17);
  EXPECT_THROW(plan_decode(too_few_blocks, shape_of(1, 1), DeviceInfo{}), Error);
  DecodeBatch broken = batch_of({16});
  broken.block_offsets.push_back(7);
  EXPECT_THROW(plan_decode(broken, shape_of(1, 1), DeviceInfo{}), Error);
  try {
    plan_decode(too_few_blocks, shape_of(1, 1), DeviceInfo{});
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  }
}

}  // namespace
}  // namespace pagoda::attention

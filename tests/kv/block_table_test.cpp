#include "pagoda/kv/block_table.h"

#include <gtest/gtest.h>

#include "pagoda/core/error.h"

namespace pagoda::kv {
namespace {

constexpr int32_t kBlockSize = 4;

TEST(BlockTable, AppendAllocatesBlocksAsTokensCrossBoundaries) {
  BlockPool pool(8, kBlockSize);
  BlockTable table;
  EXPECT_EQ(blocks_needed(table, 1, pool), 1);
  EXPECT_FALSE(append_tokens(table, 1, pool).has_value());
  EXPECT_EQ(table.block_ids.size(), 1u);
  EXPECT_EQ(blocks_needed(table, 3, pool), 0);
  append_tokens(table, 3, pool);  // fills block 0 exactly
  EXPECT_EQ(table.block_ids.size(), 1u);
  EXPECT_EQ(blocks_needed(table, 9, pool), 3);
  append_tokens(table, 9, pool);
  EXPECT_EQ(table.length, 13);
  EXPECT_EQ(table.block_ids.size(), 4u);
  EXPECT_EQ(pool.num_free(), 4);
  append_tokens(table, 0, pool);
  EXPECT_EQ(table.length, 13);
}

TEST(BlockTable, ExhaustionLeavesNoPartialState) {
  BlockPool pool(3, kBlockSize);
  BlockTable table;
  append_tokens(table, 5, pool);  // 2 blocks
  const BlockTable before = table;
  try {
    append_tokens(table, 8, pool);  // needs 2 more, 1 free
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfMemory);
  }
  EXPECT_EQ(table.block_ids, before.block_ids);
  EXPECT_EQ(table.length, before.length);
  EXPECT_EQ(pool.num_free(), 1);
  append_tokens(table, 7, pool);  // exactly what is left
  EXPECT_EQ(pool.num_free(), 0);
}

TEST(BlockTable, ForkSharesLeadingBlocksAndReleaseReturnsThem) {
  BlockPool pool(8, kBlockSize);
  BlockTable parent;
  append_tokens(parent, 10, pool);  // blocks a b c, c holding 2 tokens
  BlockTable child = fork(parent, 8, pool);  // shares a b
  EXPECT_EQ(child.length, 8);
  ASSERT_EQ(child.block_ids.size(), 2u);
  EXPECT_EQ(child.block_ids[0], parent.block_ids[0]);
  EXPECT_EQ(pool.refcount(parent.block_ids[0]), 2);
  EXPECT_EQ(pool.refcount(parent.block_ids[2]), 1);
  // The fork ends on a block boundary: appending allocates, nothing is copied.
  EXPECT_FALSE(append_tokens(child, 1, pool).has_value());
  EXPECT_NE(child.block_ids[2], parent.block_ids[2]);

  release(parent, pool);
  EXPECT_TRUE(parent.block_ids.empty());
  EXPECT_EQ(parent.length, 0);
  EXPECT_EQ(pool.refcount(child.block_ids[0]), 1);  // the child still holds the prefix
  release(child, pool);
  EXPECT_EQ(pool.num_free(), 8);
}

TEST(BlockTable, AppendingToASharedPartialBlockCopiesIt) {
  BlockPool pool(8, kBlockSize);
  BlockTable parent;
  append_tokens(parent, 6, pool);  // block 1 holds 2 tokens
  BlockTable child = fork(parent, 6, pool);
  const BlockId shared_tail = parent.block_ids[1];
  EXPECT_EQ(blocks_needed(child, 1, pool), 1);
  const std::optional<BlockCopy> copy = append_tokens(child, 1, pool);
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->src, shared_tail);
  EXPECT_EQ(child.block_ids[1], copy->dst);
  EXPECT_EQ(child.block_ids[0], parent.block_ids[0]);
  EXPECT_EQ(pool.refcount(shared_tail), 1);  // now the parent's alone
  EXPECT_EQ(pool.refcount(copy->dst), 1);
  // The parent's tail is private again: it appends in place.
  EXPECT_FALSE(append_tokens(parent, 2, pool).has_value());
  EXPECT_EQ(parent.block_ids[1], shared_tail);
}

TEST(BlockTable, CopyOnWriteExhaustionLeavesNoPartialState) {
  BlockPool pool(2, kBlockSize);
  BlockTable parent;
  append_tokens(parent, 6, pool);  // both blocks
  BlockTable child = fork(parent, 6, pool);
  EXPECT_THROW(append_tokens(child, 1, pool), Error);
  EXPECT_EQ(child.block_ids, parent.block_ids);
  EXPECT_EQ(child.length, 6);
  EXPECT_EQ(pool.refcount(parent.block_ids[1]), 2);
  EXPECT_EQ(pool.num_free(), 0);
}

TEST(BlockTable, RejectsBadArguments) {
  BlockPool pool(4, kBlockSize);
  BlockTable table;
  append_tokens(table, 3, pool);
  EXPECT_THROW(fork(table, 4, pool), Error);
  EXPECT_THROW(fork(table, -1, pool), Error);
  EXPECT_THROW(append_tokens(table, -2, pool), Error);
  EXPECT_EQ(table.length, 3);
}

}  // namespace
}  // namespace pagoda::kv

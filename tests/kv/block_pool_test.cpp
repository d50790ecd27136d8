#include "pagoda/kv/block_pool.h"

#include <gtest/gtest.h>

#include <set>

#include "pagoda/core/error.h"

namespace pagoda::kv {
namespace {

ErrorKind kind_of(auto&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.kind();
  }
  ADD_FAILURE() << "no error thrown";
  return ErrorKind::kInternal;
}

TEST(BlockPool, HandsOutEveryIdOnceIncludingZero) {
  BlockPool pool(5, 16);
  std::set<BlockId> ids;
  for (int i = 0; i < 5; ++i) {
    const std::optional<BlockId> id = pool.try_allocate();
    ASSERT_TRUE(id.has_value());
    EXPECT_EQ(pool.refcount(*id), 1);
    ids.insert(*id);
  }
  EXPECT_EQ(ids, (std::set<BlockId>{0, 1, 2, 3, 4}));
  EXPECT_EQ(pool.num_free(), 0);
}

TEST(BlockPool, ExhaustionIsNulloptOrOutOfMemory) {
  BlockPool pool(2, 16);
  pool.allocate();
  pool.allocate();
  EXPECT_FALSE(pool.try_allocate().has_value());
  EXPECT_EQ(kind_of([&] { pool.allocate(); }), ErrorKind::kOutOfMemory);
  EXPECT_EQ(pool.num_free(), 0);
}

TEST(BlockPool, RefcountsFreeOnLastRelease) {
  BlockPool pool(3, 16);
  const BlockId id = pool.allocate();
  pool.retain(id);
  pool.retain(id);
  EXPECT_EQ(pool.refcount(id), 3);
  pool.release(id);
  pool.release(id);
  EXPECT_EQ(pool.num_free(), 2);  // still held once
  pool.release(id);
  EXPECT_EQ(pool.refcount(id), 0);
  EXPECT_EQ(pool.num_free(), 3);
  // A freed block is handed out again (last in, first out).
  EXPECT_EQ(pool.allocate(), id);
}

TEST(BlockPool, MisuseThrowsInsteadOfCorruptingTheFreeList) {
  BlockPool pool(2, 16);
  const BlockId id = pool.allocate();
  pool.release(id);
  EXPECT_EQ(kind_of([&] { pool.release(id); }), ErrorKind::kInternal);  // double release
  EXPECT_EQ(kind_of([&] { pool.retain(id); }), ErrorKind::kInternal);   // retain of a free block
  EXPECT_EQ(kind_of([&] { pool.refcount(2); }), ErrorKind::kInternal);
  EXPECT_EQ(kind_of([&] { pool.retain(-1); }), ErrorKind::kInternal);
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(kind_of([] { BlockPool(0, 16); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(kind_of([] { BlockPool(4, 0); }), ErrorKind::kInvalidArgument);
}

}  // namespace
}  // namespace pagoda::kv

#include "pagoda/kv/block_table.h"

#include "pagoda/core/error.h"

namespace pagoda::kv {
namespace {

int32_t blocks_for(int64_t tokens, int32_t block_size) {
  return int32_t((tokens + block_size - 1) / block_size);
}

// Appending writes into the last block only when it is partially filled; if another sequence
// also holds it, that write must go to a private copy.
bool needs_copy_on_write(const BlockTable& table, int32_t n, const BlockPool& pool) {
  return n > 0 && table.length % pool.block_size() != 0 &&
         pool.refcount(table.block_ids.back()) > 1;
}

}  // namespace

int32_t blocks_needed(const BlockTable& table, int32_t n, const BlockPool& pool) {
  if (n < 0) fail(ErrorKind::kInvalidArgument, "cannot append {} tokens", n);
  const int32_t grow = blocks_for(int64_t(table.length) + n, pool.block_size()) -
                       blocks_for(table.length, pool.block_size());
  return grow + (needs_copy_on_write(table, n, pool) ? 1 : 0);
}

std::optional<BlockCopy> append_tokens(BlockTable& table, int32_t n, BlockPool& pool) {
  const int32_t needed = blocks_needed(table, n, pool);
  if (int64_t(table.length) + n > INT32_MAX) {
    fail(ErrorKind::kInvalidArgument, "sequence length {} + {} overflows", table.length, n);
  }
  // Check before taking anything, so that failure leaves no partial state behind.
  if (needed > pool.num_free()) {
    fail(ErrorKind::kOutOfMemory, "KV block pool exhausted: {} blocks needed for {} more tokens, {} free",
         needed, n, pool.num_free());
  }
  std::optional<BlockCopy> copy;
  if (needs_copy_on_write(table, n, pool)) {
    copy = BlockCopy{.src = table.block_ids.back(), .dst = pool.allocate()};
    table.block_ids.back() = copy->dst;
    pool.release(copy->src);  // still held by the other sequences
  }
  const int32_t target = blocks_for(int64_t(table.length) + n, pool.block_size());
  while (int32_t(table.block_ids.size()) < target) table.block_ids.push_back(pool.allocate());
  table.length += n;
  return copy;
}

BlockTable fork(const BlockTable& parent, int32_t length, BlockPool& pool) {
  if (length < 0 || length > parent.length) {
    fail(ErrorKind::kInvalidArgument, "fork length {} outside [0, {}]", length, parent.length);
  }
  BlockTable child;
  child.length = length;
  child.block_ids.assign(parent.block_ids.begin(),
                         parent.block_ids.begin() + blocks_for(length, pool.block_size()));
  for (BlockId id : child.block_ids) pool.retain(id);
  return child;
}

void release(BlockTable& table, BlockPool& pool) {
  for (BlockId id : table.block_ids) pool.release(id);
  table.block_ids.clear();
  table.length = 0;
}

}  // namespace pagoda::kv

// BlockTable: a sequence's KV as (block ids, length). Token t of the sequence lives in block
// block_ids[t / block_size] at slot t % block_size. Sequences that share a prefix share the
// leading ids (same physical blocks, refcounted in the BlockPool); the planner reads this
// identity and never compares token contents.
//
// Invariant kept by these helpers: block_ids.size() == ceil(length / block_size), and every id
// holds one reference of the pool on behalf of this table.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "pagoda/kv/block_pool.h"

namespace pagoda::kv {

struct BlockTable {
  std::vector<BlockId> block_ids;  // [ceil(length / block_size)]
  int32_t length = 0;              // tokens
};

// A block the caller must copy (every layer, K and V: KvCache::copy_block) before writing new
// tokens: appending to a partially filled last block that another sequence also holds gives this
// sequence a private copy instead of overwriting the other's tokens (copy on write).
struct BlockCopy {
  BlockId src;
  BlockId dst;
};

// Free blocks that append_tokens(table, n, pool) would take (including a copy-on-write block).
int32_t blocks_needed(const BlockTable& table, int32_t n, const BlockPool& pool);

// Grows the sequence by n tokens, allocating blocks as needed. When the pool cannot supply them,
// throws Error(kOutOfMemory) and leaves both the table and the pool unchanged. Returns the copy
// the caller must perform before writing, if the last block had to be made private.
std::optional<BlockCopy> append_tokens(BlockTable& table, int32_t n, BlockPool& pool);

// A new sequence whose first `length` tokens (length <= parent.length) are the parent's: it
// holds the same ceil(length / block_size) leading blocks, each retained once more. Allocates
// nothing, so it cannot fail for lack of blocks.
BlockTable fork(const BlockTable& parent, int32_t length, BlockPool& pool);

// Releases every block of the table and empties it.
void release(BlockTable& table, BlockPool& pool);

}  // namespace pagoda::kv

// BlockPool: the ids of a KV pool's blocks, with reference counts. Sequences that share a prompt
// prefix hold the same leading block ids; a block returns to the free list when its last holder
// releases it. The pool hands out ids only: the memory behind them is a KvCache (or a GPU pool)
// of the same num_blocks. Block id 0 is a valid block; there is no padding block.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace pagoda::kv {

using BlockId = int32_t;

class BlockPool {
 public:
  // num_blocks blocks of block_size tokens each, all free.
  BlockPool(int32_t num_blocks, int32_t block_size);

  // A free block with refcount 1, or nullopt when none is left. O(1).
  std::optional<BlockId> try_allocate();
  // Same, but throws Error(kOutOfMemory) when the pool is exhausted.
  BlockId allocate();

  // One more holder of an allocated block.
  void retain(BlockId id);
  // One holder fewer; at zero the block is free again. O(1).
  void release(BlockId id);

  int32_t refcount(BlockId id) const;
  int32_t num_free() const { return int32_t(free_.size()); }
  int32_t num_blocks() const { return int32_t(refcounts_.size()); }
  int32_t block_size() const { return block_size_; }

 private:
  // Retaining or releasing a free or unknown id is a bug in the caller that would corrupt the
  // free list silently, so it throws Error(kInternal) even in release builds.
  void check_allocated(BlockId id, const char* what) const;

  int32_t block_size_;
  std::vector<int32_t> refcounts_;  // [num_blocks]; 0 = free
  std::vector<BlockId> free_;       // stack of free ids
};

}  // namespace pagoda::kv

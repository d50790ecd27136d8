#include "pagoda/kv/block_pool.h"

#include "pagoda/core/error.h"

namespace pagoda::kv {

BlockPool::BlockPool(int32_t num_blocks, int32_t block_size)
    : block_size_(block_size), refcounts_(size_t(num_blocks > 0 ? num_blocks : 0), 0) {
  if (num_blocks <= 0 || block_size <= 0) {
    fail(ErrorKind::kInvalidArgument, "block pool needs num_blocks > 0 and block_size > 0, got {} and {}",
         num_blocks, block_size);
  }
  // Pushed in reverse so that allocation hands out 0, 1, 2, ...: easier to read in tests and logs.
  free_.reserve(size_t(num_blocks));
  for (BlockId id = num_blocks - 1; id >= 0; --id) free_.push_back(id);
}

std::optional<BlockId> BlockPool::try_allocate() {
  if (free_.empty()) return std::nullopt;
  const BlockId id = free_.back();
  free_.pop_back();
  refcounts_[size_t(id)] = 1;
  return id;
}

BlockId BlockPool::allocate() {
  if (std::optional<BlockId> id = try_allocate()) return *id;
  fail(ErrorKind::kOutOfMemory, "KV block pool exhausted: all {} blocks in use", num_blocks());
}

void BlockPool::retain(BlockId id) {
  check_allocated(id, "retain");
  ++refcounts_[size_t(id)];
}

void BlockPool::release(BlockId id) {
  check_allocated(id, "release");
  if (--refcounts_[size_t(id)] == 0) free_.push_back(id);
}

int32_t BlockPool::refcount(BlockId id) const {
  if (id < 0 || id >= num_blocks()) {
    fail(ErrorKind::kInternal, "block id {} out of range [0, {})", id, num_blocks());
  }
  return refcounts_[size_t(id)];
}

void BlockPool::check_allocated(BlockId id, const char* what) const {
  if (refcount(id) == 0) fail(ErrorKind::kInternal, "{} of free block {}", what, id);
}

}  // namespace pagoda::kv

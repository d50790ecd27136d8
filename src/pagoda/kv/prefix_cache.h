// PrefixCache: KV blocks of computed sequences, found again by their tokens (automatic prefix
// caching: SGLang's RadixAttention, vLLM's block hashes). A request whose prompt starts with
// tokens some earlier sequence already computed reuses those blocks instead of recomputing them.
//
// A radix tree over token ids at block granularity: the path from the root to a node spells a
// prefix of whole blocks, and the node holds the last of those blocks. Only full blocks are
// cached: a partially filled block is still being written, and its id means nothing to another
// sequence. One node holds one block (the tree's edges are not compressed into multi-block
// runs): nodes are created, shared and evicted a block at a time, so no node is ever split, and
// the per-node overhead is small next to a block of KV (16 tokens x layers x heads).
//
// The cache holds one BlockPool reference on every block it stores, so a cached block outlives
// the sequences that computed it. evict() frees blocks only the cache holds (refcount 1), least
// recently used first, and only leaves: a block's KV is valid only after its whole prefix, so a
// prefix block goes only once nothing cached below it remains.
//
// Complexity (L = tokens passed, N = cached blocks): match and insert O(L) (one hash and one
// token comparison per block, expected O(1) child lookup); evict O(N + k log N) for k blocks
// freed; num_evictable_blocks O(N). Not thread-safe: the engine thread owns it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "pagoda/kv/block_pool.h"

namespace pagoda::kv {

class PrefixCache {
 public:
  // The pool must outlive the cache; the cache releases its references on clear() and at
  // destruction.
  explicit PrefixCache(BlockPool& pool);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // The blocks of the longest cached prefix of `tokens` in whole blocks (at most
  // tokens.size() / block_size of them), in order. Retains nothing: a caller that keeps them
  // retains each one. Marks them as used now (LRU).
  std::vector<BlockId> match(std::span<const int32_t> tokens);

  // Records the tokens.size() / block_size full blocks of a computed sequence: block_ids[i]
  // holds tokens [i * block_size, (i + 1) * block_size). A block not cached yet is retained
  // once for the cache; where the same token prefix is cached already, the cached block stays
  // and the caller's block (a duplicate computed concurrently) remains the caller's alone.
  // Returns the cached block of every position, so the caller may switch to them and release
  // its duplicates. Marks the path as used now. block_ids needs at least that many ids.
  std::vector<BlockId> insert(std::span<const int32_t> tokens, std::span<const BlockId> block_ids);

  // Frees up to n blocks that only the cache holds, least recently used leaves first (a parent
  // becomes a candidate once its last child is gone). Returns how many were freed.
  int32_t evict(int32_t n);

  int32_t num_cached_blocks() const { return num_cached_; }
  // Blocks evict() could free now: held only by the cache, and nothing below them is held by
  // anyone else. Blocks counted here are as good as free for admission.
  int32_t num_evictable_blocks() const;
  int32_t block_size() const { return pool_.block_size(); }

  // Drops every cached block (releases the cache's reference on each).
  void clear();

 private:
  struct Node {
    std::vector<int32_t> tokens;  // [block_size] this block's token ids; empty at the root
    BlockId block = -1;           // -1 at the root
    Node* parent = nullptr;
    // Keyed by the hash of the child's tokens; equal hashes are told apart by the tokens.
    std::unordered_multimap<uint64_t, std::unique_ptr<Node>> children;
    uint64_t last_access = 0;  // clock_ at the last match or insert through this node
  };

  Node* find_child(Node& parent, std::span<const int32_t> block_tokens, uint64_t hash) const;
  void remove_leaf(Node& leaf);

  BlockPool& pool_;
  Node root_;
  int32_t num_cached_ = 0;
  uint64_t clock_ = 0;  // advances once per match or insert
};

}  // namespace pagoda::kv

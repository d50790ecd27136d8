// Synthetic prefix-tree decode batches in the notation of shared/workloads/README.md, for the
// prefix-attention benchmark and tests: `COUNTS_LENGTHS`, e.g. `1,4,16_128,256,1024` is one root
// of 128 tokens, 4 children of 256 tokens, and 16 queries with 1024 private tokens each. A level's
// nodes are spread evenly over the nodes of the level above; the last level's nodes are the
// queries. Each node owns its own blocks, so the batch's block tables share exactly the tree's
// prefixes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/attention/decode_batch.h"

namespace pagoda::attention {

struct PrefixTreeSpec {
  std::vector<int32_t> counts;   // nodes per level, root level first
  std::vector<int32_t> lengths;  // KV tokens of each node of the level
  std::string text;              // as given

  int32_t num_queries() const { return counts.back(); }
};

// Throws Error(kInvalidArgument) naming what is wrong: not COUNTS_LENGTHS, a count or length
// that is not a positive number, levels of different lengths, a level whose count is not a
// multiple of the level above's, or more than 2^30 tokens in the tree, in one query or in all the
// queries' tables together.
PrefixTreeSpec parse_prefix_tree(std::string_view text);

// Blocks the tree's nodes own: each inner node's length must be a multiple of block_size (a
// shared block is read whole), the queries' private tails need not be.
int64_t tree_num_blocks(const PrefixTreeSpec& spec, int32_t block_size);

// The decode batch of the tree: query i (in level order) reads its ancestors' blocks, then its
// own. Block ids are 0 .. tree_num_blocks - 1, shuffled by `seed` (0: in order) so that a node's
// pages are scattered over the pool as in a real paged cache. Throws Error(kInvalidArgument) when
// an inner node's length is not a multiple of block_size.
DecodeBatch make_tree_batch(const PrefixTreeSpec& spec, int32_t block_size, uint64_t seed = 0);

}  // namespace pagoda::attention

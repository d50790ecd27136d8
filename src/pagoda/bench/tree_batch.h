// Synthetic prefix-tree decode batches in the notation of bench/workloads/README.md, for the
// prefix-attention benchmark and tests: `COUNTS_LENGTHS`, e.g. `1,4,16_128,256,1024` is one root
// of 128 tokens, 4 children of 256 tokens, and 16 queries with 1024 private tokens each. A level's
// nodes are spread evenly over the nodes of the level above; the last level's nodes are the
// queries. Each node owns its own blocks, so the batch's block tables share exactly the tree's
// prefixes.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/attention/decode_batch.h"

namespace pagoda::bench {

struct PrefixTreeSpec {
  std::vector<int32_t> counts;   // nodes per level, root level first
  std::vector<int32_t> lengths;  // KV tokens of each node of the level
  std::string text;              // as given

  int32_t num_queries() const { return counts.back(); }
};

// The prefix-tree batches of the PAT artifact's kernel benchmark (benchmark/run_kernel_bench.sh of
// github.com/flashserve/PAT), in its order. `listed`: one of the eight of bench/workloads/README.md,
// those pat_reference.md gives PAT's figures for, which the prefix-attention targets are set on.
struct BenchmarkTree {
  const char* text;
  bool listed;
};
inline constexpr std::array<BenchmarkTree, 20> kPatBenchmarkTrees = {{
    {"1,10_4096,416", true},
    {"1,256_256,32", false},
    {"1,1024_2048,32", false},
    {"1,2,64_1024,256,256", false},
    {"1,4,256_32,256,32", true},
    {"1,8,512_32,512,256", false},
    {"1,8,512_32,2048,256", true},
    {"1,8,512_512,512,256", false},
    {"1,4,8,256_32,256,256,32", false},
    {"1,4,16,512_1024,256,128,32", true},
    {"1,4,16,64,256,1024_256,32,256,64,32,256", false},
    {"1,16,32,64,128,1024_256,128,64,32,32,32", true},
    {"1,16,32,64,256,1024_256,128,64,32,32,32", false},
    {"1,8,16,32,64,128,1024_256,128,64,32,32,32,32", false},
    {"1,8,16,32,64,256,1024_256,128,64,32,32,32,32", false},
    {"2,8,16,256_256,256,32,32", true},
    {"4,16,256,512_512,32,128,32", false},
    {"8,16,32,256_512,512,256,32", true},
    {"256_1024", false},
    {"256_4096", true},
}};

// Batches as the benchmarks take them: `listed` (the eight above) and `pat` (all twenty) stand for
// those sets, in the artifact's order; any other item is a tree as given, unparsed.
std::vector<std::string> expand_benchmark_trees(const std::vector<std::string>& items);

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
attention::DecodeBatch make_tree_batch(const PrefixTreeSpec& spec, int32_t block_size, uint64_t seed = 0);

}  // namespace pagoda::bench

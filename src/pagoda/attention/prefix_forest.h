// The prefix forest of a decode batch (the PAT paper, "PAT: Accelerating LLM Decoding via
// Prefix-Aware Attention with Resource Efficient Multi-Tile Kernel", arXiv:2511.22333, §5.1):
// block tables in, a forest out whose every root-to-node path is a prefix shared by the node's
// queries. A node is a maximal run of block positions over which the same set of queries reads the same
// blocks; it ends where that set splits (queries continue into different blocks) or a query's KV
// ends. Identity is by block id only, never by token contents (a block table's ids are the
// sharing: the prefix cache gives requests with the same prefix the same blocks), and a
// block is the same for two queries only if both also read the same number of its tokens, so a
// node's token range is the same for all its queries.
#pragma once

#include <cstdint>
#include <vector>

#include "pagoda/attention/decode_batch.h"

namespace pagoda::attention {

struct PrefixNode {
  int32_t block_begin;  // block positions [block_begin, block_end) of each query's table
  int32_t block_end;
  int32_t token_begin;  // KV tokens [token_begin, token_end) of each query: block_begin * block_size
  int32_t token_end;    //   up to the last token the queries read in block block_end - 1
  int32_t query_begin;  // PrefixForest::queries[query_begin, query_end): every query whose path
  int32_t query_end;    //   runs through this node; those ending here come first
  int32_t num_ending;   // queries whose KV ends at this node
  int32_t parent;       // node index, -1 for a root
  int32_t first_child;  // node index, -1 for none; siblings chain through next_sibling
  int32_t next_sibling;

  int32_t num_queries() const { return query_end - query_begin; }
  int32_t num_tokens() const { return token_end - token_begin; }
};

struct PrefixForest {
  std::vector<PrefixNode> nodes;  // preorder: a parent comes before its children
  std::vector<int32_t> queries;   // sequence indices of the batch, grouped by node
  std::vector<int32_t> roots;
  std::vector<int32_t> empty_queries;  // sequences with no KV: in no node
};

// Throws Error(kInvalidArgument) if a sequence has fewer blocks than its length needs.
PrefixForest build_prefix_forest(const DecodeBatch& batch, int32_t block_size);

}  // namespace pagoda::attention

#include "pagoda/attention/prefix_forest.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "pagoda/attention/plan.h"

namespace pagoda::attention {
namespace {

class ForestBuilder {
 public:
  ForestBuilder(const DecodeBatch& batch, int32_t block_size) : batch_(batch), block_size_(block_size) {}

  PrefixForest build() {
    forest_.queries.reserve(size_t(batch_.num_seqs()));
    forest_.nodes.reserve(2 * size_t(batch_.num_seqs()));  // a node splits queries or ends some
    num_blocks_.resize(size_t(batch_.num_seqs()));
    for (int32_t s = 0; s < batch_.num_seqs(); ++s) {
      const int32_t length = batch_.kv_lengths[size_t(s)];
      num_blocks_[size_t(s)] = int32_t((int64_t(length) + block_size_ - 1) / block_size_);
      (length > 0 ? forest_.queries : forest_.empty_queries).push_back(s);
    }
    keyed_.resize(forest_.queries.size());
    add_children(0, int32_t(forest_.queries.size()), 0, -1);
    return std::move(forest_);
  }

 private:
  const int32_t* table(int32_t seq) const { return batch_.block_ids.data() + batch_.block_offsets[size_t(seq)]; }

  int32_t num_blocks(int32_t seq) const { return num_blocks_[size_t(seq)]; }

  // Tokens seq reads from its block at `position`.
  int32_t tokens(int32_t seq, int32_t position) const {
    return std::min(block_size_, batch_.kv_lengths[size_t(seq)] - position * block_size_);
  }

  // What makes block position p of a sequence the same as another's: the block id and how many of
  // its tokens the sequence reads, in one word (one comparison in the sort).
  uint64_t key(int32_t seq, int32_t position) const {
    return uint64_t(uint32_t(table(seq)[position])) << 32 | uint32_t(tokens(seq, position));
  }

  // Queries [begin, end) of forest_.queries all continue past block position `position`: sorts
  // them by their key there and makes one child of `parent` per key.
  void add_children(int32_t begin, int32_t end, int32_t position, int32_t parent) {
    // Sorted by key: (key, query) pairs sort without recomputing keys. keyed_ is indexed like
    // forest_.queries: a child's recursion rewrites only its own run, after the run was found.
    auto* keyed = keyed_.data();
    for (int32_t i = begin; i < end; ++i) keyed[i] = {key(forest_.queries[size_t(i)], position), forest_.queries[size_t(i)]};
    std::sort(keyed + begin, keyed + end);
    for (int32_t i = begin; i < end; ++i) forest_.queries[size_t(i)] = keyed[i].second;
    int32_t previous_child = -1;
    for (int32_t run = begin; run < end;) {
      int32_t run_end = run + 1;
      while (run_end < end && keyed[run_end].first == keyed[run].first) ++run_end;
      const int32_t child = add_node(run, run_end, position, parent);
      if (parent < 0) {
        forest_.roots.push_back(child);
      } else if (previous_child < 0) {
        forest_.nodes[size_t(parent)].first_child = child;
      }
      if (previous_child >= 0) forest_.nodes[size_t(previous_child)].next_sibling = child;
      previous_child = child;
      run = run_end;
    }
  }

  // A node for queries [begin, end), which share the block at `position`: extends it while they
  // all go on sharing, then recurses into the children.
  int32_t add_node(int32_t begin, int32_t end, int32_t position, int32_t parent) {
    auto* q = forest_.queries.data();
    // The longest run of block ids every query repeats from the first one's table...
    const int32_t* first = table(q[begin]);
    int32_t block_end = num_blocks(q[begin]);
    for (int32_t i = begin + 1; i < end; ++i) block_end = std::min(block_end, num_blocks(q[i]));
    for (int32_t i = begin + 1; i < end && block_end > position + 1; ++i) {
      const int32_t* other = table(q[i]);
      // Usually all of the run matches: memcmp checks it with vector loads, mismatch finds where not.
      const size_t run_bytes = size_t(block_end - position - 1) * sizeof(int32_t);
      if (std::memcmp(first + position + 1, other + position + 1, run_bytes) != 0) {
        block_end = int32_t(std::mismatch(first + position + 1, first + block_end, other + position + 1).first - first);
      }
    }
    // ...which ends a block early if its last block is some query's partial last one and the
    // others read another number of its tokens (before it, every block is read whole by all).
    if (block_end > position + 1) {
      const int32_t last_tokens = tokens(q[begin], block_end - 1);
      for (int32_t i = begin + 1; i < end; ++i) {
        if (tokens(q[i], block_end - 1) != last_tokens) {
          --block_end;
          break;
        }
      }
    }
    // Queries ending here first, then the rest (which form the children).
    const auto ending_end = std::partition(q + begin, q + end, [&](int32_t s) { return num_blocks(s) == block_end; });
    const int32_t num_ending = int32_t(ending_end - (q + begin));
    const int32_t node = int32_t(forest_.nodes.size());
    forest_.nodes.push_back({.block_begin = position,
                             .block_end = block_end,
                             .token_begin = position * block_size_,
                             .token_end = (block_end - 1) * block_size_ + tokens(q[begin], block_end - 1),
                             .query_begin = begin,
                             .query_end = end,
                             .num_ending = num_ending,
                             .parent = parent,
                             .first_child = -1,
                             .next_sibling = -1});
    if (begin + num_ending < end) add_children(begin + num_ending, end, block_end, node);
    return node;
  }

  const DecodeBatch& batch_;
  const int32_t block_size_;
  std::vector<std::pair<uint64_t, int32_t>> keyed_;  // add_children's (key, query) pairs
  std::vector<int32_t> num_blocks_;  // per sequence: blocks its KV fills, divided out once
  PrefixForest forest_;
};

}  // namespace

PrefixForest build_prefix_forest(const DecodeBatch& batch, int32_t block_size) {
  validate_block_tables(batch, block_size);
  return ForestBuilder(batch, block_size).build();
}

}  // namespace pagoda::attention

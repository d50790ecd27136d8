#include "pagoda/attention/prefix_forest.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "pagoda/attention/plan.h"

namespace pagoda::attention {
namespace {

// What makes block position p of a sequence the same as another's: the block id and how many of
// its tokens the sequence reads.
struct BlockKey {
  int32_t id;
  int32_t tokens;
  auto operator<=>(const BlockKey&) const = default;
};

class ForestBuilder {
 public:
  ForestBuilder(const DecodeBatch& batch, int32_t block_size) : batch_(batch), block_size_(block_size) {}

  PrefixForest build() {
    forest_.queries.reserve(size_t(batch_.num_seqs()));
    forest_.nodes.reserve(2 * size_t(batch_.num_seqs()));  // a node splits queries or ends some
    for (int32_t s = 0; s < batch_.num_seqs(); ++s) {
      (batch_.kv_lengths[size_t(s)] > 0 ? forest_.queries : forest_.empty_queries).push_back(s);
    }
    add_children(0, int32_t(forest_.queries.size()), 0, -1);
    return std::move(forest_);
  }

 private:
  const int32_t* table(int32_t seq) const { return batch_.block_ids.data() + batch_.block_offsets[size_t(seq)]; }

  int32_t num_blocks(int32_t seq) const {
    return int32_t((int64_t(batch_.kv_lengths[size_t(seq)]) + block_size_ - 1) / block_size_);
  }

  BlockKey key(int32_t seq, int32_t position) const {
    const int32_t length = batch_.kv_lengths[size_t(seq)];
    return {batch_.block_ids[size_t(batch_.block_offsets[size_t(seq)] + position)],
            std::min(block_size_, length - position * block_size_)};
  }

  // Queries [begin, end) of forest_.queries all continue past block position `position`: sorts
  // them by their key there and makes one child of `parent` per key.
  void add_children(int32_t begin, int32_t end, int32_t position, int32_t parent) {
    // Sorted by key: (key, query) pairs sort without recomputing keys.
    std::vector<std::pair<BlockKey, int32_t>> keyed;
    keyed.reserve(size_t(end - begin));
    for (int32_t i = begin; i < end; ++i) keyed.push_back({key(forest_.queries[size_t(i)], position), forest_.queries[size_t(i)]});
    std::sort(keyed.begin(), keyed.end());
    for (int32_t i = begin; i < end; ++i) forest_.queries[size_t(i)] = keyed[size_t(i - begin)].second;
    int32_t previous_child = -1;
    for (int32_t run = begin; run < end;) {
      int32_t run_end = run + 1;
      while (run_end < end && keyed[size_t(run_end - begin)].first == keyed[size_t(run - begin)].first) ++run_end;
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
      block_end = int32_t(std::mismatch(first + position + 1, first + block_end, table(q[i]) + position + 1).first - first);
    }
    // ...which ends a block early if its last block is some query's partial last one and the
    // others read another number of its tokens (before it, every block is read whole by all).
    if (block_end > position + 1) {
      const int32_t tokens = key(q[begin], block_end - 1).tokens;
      for (int32_t i = begin + 1; i < end; ++i) {
        if (key(q[i], block_end - 1).tokens != tokens) {
          --block_end;
          break;
        }
      }
    }
    // Queries ending here first, then the rest (which form the children).
    const auto ending_end = std::partition(q + begin, q + end, [&](int32_t s) { return num_blocks(s) == block_end; });
    const int32_t num_ending = int32_t(ending_end - (q + begin));
    const BlockKey last = key(q[begin], block_end - 1);
    const int32_t node = int32_t(forest_.nodes.size());
    forest_.nodes.push_back({.block_begin = position,
                             .block_end = block_end,
                             .token_begin = position * block_size_,
                             .token_end = (block_end - 1) * block_size_ + last.tokens,
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
  PrefixForest forest_;
};

}  // namespace

PrefixForest build_prefix_forest(const DecodeBatch& batch, int32_t block_size) {
  validate_block_tables(batch, block_size);
  return ForestBuilder(batch, block_size).build();
}

}  // namespace pagoda::attention

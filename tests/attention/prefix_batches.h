// Test helpers for prefix-aware attention: random decode batches whose block tables share
// prefixes at several levels, as a paged cache with prefix sharing makes them. Every node of a
// random tree owns fresh blocks; inner nodes fill whole blocks, leaves end anywhere. Besides
// plain trees they hold the cases the prefix forest must tell apart: queries whose KV ends at an
// inner node (a prefix of others' KV), identical sequences, sequences with no KV, spare blocks
// past a sequence's end, and forks that read different numbers of tokens of one shared block.
// Block ids are shuffled (a node's pages lie anywhere in the pool) and so is the sequence order
// (the query order is not the tree order).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "pagoda/attention/decode_batch.h"
#include "reference.h"

namespace pagoda::attention::testing {

struct RandomTreeOptions {
  int32_t block_size = 16;
  int32_t max_roots = 3;
  int32_t max_depth = 3;         // inner levels
  int32_t max_fanout = 5;        // children of a node
  int32_t max_inner_blocks = 4;  // an inner node's length, in whole blocks
  int32_t max_leaf_tokens = 200;
  bool forks = true;        // siblings that read different token counts of one block
  bool spare_blocks = true;  // unused blocks after a sequence's last token
  bool empty_seqs = true;    // sequences with no KV
};

struct RandomTreeBatch {
  DecodeBatch batch;
  int32_t num_blocks = 0;  // ids are 0 .. num_blocks - 1, each used
};

class RandomTreeBuilder {
 public:
  RandomTreeBuilder(Random& rng, const RandomTreeOptions& options) : rng_(rng), o_(options) {}

  RandomTreeBatch build() {
    std::vector<int32_t> none;
    const int32_t roots = 1 + int32_t(rng_.next(uint64_t(o_.max_roots)));
    for (int32_t r = 0; r < roots; ++r) child(none, 0);
    if (o_.empty_seqs) {
      for (int32_t i = int32_t(rng_.next(3)); i > 0; --i) seqs_.push_back({{}, 0});
    }
    // Shuffled ids and sequence order.
    std::vector<int32_t> id_of(static_cast<size_t>(next_id_));
    std::iota(id_of.begin(), id_of.end(), 0);
    shuffle(id_of);
    shuffle(seqs_);
    RandomTreeBatch out;
    out.num_blocks = next_id_;
    for (auto& [table, length] : seqs_) {
      for (int32_t& id : table) id = id_of[size_t(id)];
      out.batch.add_sequence(table, length);
    }
    return out;
  }

 private:
  int32_t fresh() { return next_id_++; }

  template <typename T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng_.next(i)]);
  }

  void add(std::vector<int32_t> table, int32_t length) {
    if (o_.spare_blocks && rng_.next(8) == 0) table.push_back(fresh());
    seqs_.push_back({std::move(table), length});
  }

  // A child of the node whose path is `table` (whole blocks): an inner node or a leaf.
  void child(const std::vector<int32_t>& table, int32_t depth) {
    if (depth < o_.max_depth && rng_.next(3) != 0) {
      std::vector<int32_t> inner = table;
      for (int32_t b = 1 + int32_t(rng_.next(uint64_t(o_.max_inner_blocks))); b > 0; --b) inner.push_back(fresh());
      // Queries whose whole KV is this prefix: they end at an inner node.
      if (rng_.next(5) == 0) {
        for (int32_t i = 1 + int32_t(rng_.next(2)); i > 0; --i) add(inner, int32_t(inner.size()) * o_.block_size);
      }
      for (int32_t c = 1 + int32_t(rng_.next(uint64_t(o_.max_fanout))); c > 0; --c) child(inner, depth + 1);
    } else {
      leaf(table);
    }
  }

  void leaf(const std::vector<int32_t>& table) {
    const int32_t bs = o_.block_size;
    const int32_t prefix = int32_t(table.size()) * bs;
    const int32_t tokens = 1 + int32_t(rng_.next(uint64_t(o_.max_leaf_tokens)));
    std::vector<int32_t> own = table;
    for (int32_t b = 0; b < (tokens + bs - 1) / bs; ++b) own.push_back(fresh());
    add(own, prefix + tokens);
    if (rng_.next(8) == 0) add(own, prefix + tokens);  // an identical sequence
    if (o_.forks && rng_.next(6) == 0) {
      // A fork that reads another number of tokens of the leaf's first block (1..bs), then
      // maybe blocks of its own.
      const int32_t first = std::min(bs, tokens);
      int32_t read = 1 + int32_t(rng_.next(uint64_t(bs - 1)));
      if (read >= first) ++read;
      std::vector<int32_t> fork = table;
      fork.push_back(own[table.size()]);
      int32_t length = prefix + read;
      if (read == bs && rng_.next(2) == 0) {
        const int32_t more = 1 + int32_t(rng_.next(uint64_t(o_.max_leaf_tokens)));
        for (int32_t b = 0; b < (more + bs - 1) / bs; ++b) fork.push_back(fresh());
        length += more;
      }
      add(fork, length);
    }
  }

  Random& rng_;
  const RandomTreeOptions o_;
  int32_t next_id_ = 0;
  std::vector<std::pair<std::vector<int32_t>, int32_t>> seqs_;
};

inline RandomTreeBatch random_tree_batch(Random& rng, const RandomTreeOptions& options) {
  return RandomTreeBuilder(rng, options).build();
}

}  // namespace pagoda::attention::testing

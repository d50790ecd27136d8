// The prefix forest of a decode batch: one node per node of the spec trees of
// bench/workloads/README.md, and on random batches with multi-level sharing every node maximal
// and every query's path covering its KV exactly, in order.
#include "pagoda/attention/prefix_forest.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "pagoda/attention/prefix_plan.h"
#include "pagoda/bench/tree_batch.h"
#include "pagoda/core/error.h"
#include "prefix_batches.h"
#include "reference.h"

namespace pagoda::attention {
namespace {

using bench::expand_benchmark_trees;
using bench::parse_prefix_tree;
using bench::tree_num_blocks;
using bench::make_tree_batch;
using bench::PrefixTreeSpec;

using testing::Random;

// The key of block position p of a sequence, as the forest compares them: the id and the tokens
// the sequence reads in it.
std::pair<int32_t, int32_t> key_at(const DecodeBatch& batch, int32_t seq, int32_t p, int32_t bs) {
  return {batch.blocks_of(seq)[size_t(p)], std::min(bs, batch.kv_lengths[size_t(seq)] - p * bs)};
}

std::vector<int32_t> children_of(const PrefixForest& f, int32_t node) {
  std::vector<int32_t> out;
  for (int32_t c = f.nodes[size_t(node)].first_child; c >= 0; c = f.nodes[size_t(c)].next_sibling) out.push_back(c);
  return out;
}

// Every property of a forest that the batch alone determines.
void check_forest(const PrefixForest& f, const DecodeBatch& batch, int32_t bs) {
  // Queries: the sequences with KV, each once; the empty ones, in order.
  std::vector<int32_t> with_kv, without_kv;
  for (int32_t s = 0; s < batch.num_seqs(); ++s) (batch.kv_lengths[size_t(s)] > 0 ? with_kv : without_kv).push_back(s);
  std::vector<int32_t> queries = f.queries;
  std::sort(queries.begin(), queries.end());
  ASSERT_EQ(queries, with_kv);
  ASSERT_EQ(f.empty_queries, without_kv);

  // Links: preorder, every non-root in its parent's sibling chain, the roots and their children
  // partitioning the query ranges in order.
  std::vector<int32_t> seen_as_child(f.nodes.size(), 0);
  std::vector<int32_t> roots;
  for (size_t n = 0; n < f.nodes.size(); ++n) {
    const PrefixNode& node = f.nodes[n];
    if (node.parent < 0) roots.push_back(int32_t(n));
    ASSERT_LT(node.parent, int32_t(n)) << "preorder";
    int32_t next_query = node.query_begin + node.num_ending;
    for (int32_t c : children_of(f, int32_t(n))) {
      ASSERT_EQ(f.nodes[size_t(c)].parent, int32_t(n));
      ASSERT_EQ(f.nodes[size_t(c)].query_begin, next_query);
      next_query = f.nodes[size_t(c)].query_end;
      ++seen_as_child[size_t(c)];
    }
    ASSERT_EQ(next_query, node.query_end);
  }
  ASSERT_EQ(roots, f.roots);
  int32_t next_query = 0;
  for (int32_t r : f.roots) {
    ASSERT_EQ(f.nodes[size_t(r)].block_begin, 0);
    ASSERT_EQ(f.nodes[size_t(r)].query_begin, next_query);
    next_query = f.nodes[size_t(r)].query_end;
  }
  ASSERT_EQ(next_query, int32_t(f.queries.size()));
  for (size_t n = 0; n < f.nodes.size(); ++n) ASSERT_EQ(seen_as_child[n], f.nodes[n].parent < 0 ? 0 : 1);

  for (size_t n = 0; n < f.nodes.size(); ++n) {
    const PrefixNode& node = f.nodes[n];
    SCOPED_TRACE("node " + std::to_string(n));
    ASSERT_LT(node.block_begin, node.block_end);
    ASSERT_EQ(node.token_begin, node.block_begin * bs);
    ASSERT_GT(node.token_end, (node.block_end - 1) * bs);
    ASSERT_LE(node.token_end, node.block_end * bs);
    ASSERT_GT(node.num_queries(), 0);
    ASSERT_GE(node.num_ending, 0);
    ASSERT_LE(node.num_ending, node.num_queries());
    if (node.parent >= 0) {
      ASSERT_EQ(node.block_begin, f.nodes[size_t(node.parent)].block_end);
    }
    // Shared: every query reads the same ids and the same tokens of each of them.
    const int32_t first = f.queries[size_t(node.query_begin)];
    for (int32_t i = node.query_begin; i < node.query_end; ++i) {
      const int32_t s = f.queries[size_t(i)];
      const int32_t length = batch.kv_lengths[size_t(s)];
      for (int32_t p = node.block_begin; p < node.block_end; ++p) {
        ASSERT_EQ(key_at(batch, s, p, bs), key_at(batch, first, p, bs));
      }
      // Those ending here end at token_end; the others go on past the node's last block.
      if (i < node.query_begin + node.num_ending) {
        ASSERT_EQ(length, node.token_end) << "seq " << s;
      } else {
        ASSERT_GT(length, node.block_end * bs) << "seq " << s;
      }
    }
    // Maximal: at block_end a query ends, or the children differ in key (so at least two).
    const std::vector<int32_t> kids = children_of(f, int32_t(n));
    if (node.num_ending == 0) {
      ASSERT_GE(kids.size(), 2u);
    }
    if (!kids.empty()) {
      ASSERT_EQ(node.token_end, node.block_end * bs);
    }
    for (size_t a = 0; a < kids.size(); ++a) {
      for (size_t b = a + 1; b < kids.size(); ++b) {
        const PrefixNode &ca = f.nodes[size_t(kids[a])], &cb = f.nodes[size_t(kids[b])];
        ASSERT_NE(key_at(batch, f.queries[size_t(ca.query_begin)], node.block_end, bs),
                  key_at(batch, f.queries[size_t(cb.query_begin)], node.block_end, bs));
      }
    }
  }
  for (size_t a = 0; a < f.roots.size(); ++a) {
    for (size_t b = a + 1; b < f.roots.size(); ++b) {
      ASSERT_NE(key_at(batch, f.queries[size_t(f.nodes[size_t(f.roots[a])].query_begin)], 0, bs),
                key_at(batch, f.queries[size_t(f.nodes[size_t(f.roots[b])].query_begin)], 0, bs));
    }
  }

  // Paths: each query ends at exactly one node, and the nodes from its root down to there cover
  // [0, length) in order.
  std::vector<int32_t> end_node(size_t(batch.num_seqs()), -1);
  for (size_t n = 0; n < f.nodes.size(); ++n) {
    const PrefixNode& node = f.nodes[n];
    for (int32_t i = node.query_begin; i < node.query_begin + node.num_ending; ++i) {
      ASSERT_EQ(end_node[size_t(f.queries[size_t(i)])], -1);
      end_node[size_t(f.queries[size_t(i)])] = int32_t(n);
    }
  }
  for (int32_t s : with_kv) {
    std::vector<int32_t> path;
    for (int32_t n = end_node[size_t(s)]; n >= 0; n = f.nodes[size_t(n)].parent) path.push_back(n);
    ASSERT_FALSE(path.empty()) << "seq " << s << " ends nowhere";
    std::reverse(path.begin(), path.end());
    int32_t next = 0;
    for (int32_t n : path) {
      const PrefixNode& node = f.nodes[size_t(n)];
      ASSERT_EQ(node.token_begin, next);
      const auto begin = f.queries.begin() + node.query_begin, end = f.queries.begin() + node.query_end;
      ASSERT_NE(std::find(begin, end, s), end) << "seq " << s << " not listed by node " << n;
      next = node.token_end;
    }
    ASSERT_EQ(next, batch.kv_lengths[size_t(s)]);
  }
}

int32_t depth_of(const PrefixForest& f, int32_t node) {
  int32_t depth = 0;
  for (int32_t n = f.nodes[size_t(node)].parent; n >= 0; n = f.nodes[size_t(n)].parent) ++depth;
  return depth;
}

// The README's trees (every inner node has at least two children, so no two levels fuse): one
// node per tree node, with its level's token range and its share of the queries.
TEST(PrefixForest, SpecTreesGiveOneNodePerTreeNode) {
  for (const char* text : {"1,4,16_128,256,1024", "2,8,16,256_256,256,32,32", "1,10_4096,416", "256_4096",
                           "1,4,256_32,256,32", "1,4,16,512_1024,256,128,32"}) {
    for (int32_t bs : {16, 32}) {
      SCOPED_TRACE(std::string(text) + " block size " + std::to_string(bs));
      const PrefixTreeSpec spec = parse_prefix_tree(text);
      const DecodeBatch batch = make_tree_batch(spec, bs, /*seed=*/7);
      const PrefixForest f = build_prefix_forest(batch, bs);
      check_forest(f, batch, bs);
      ASSERT_EQ(f.nodes.size(), size_t(std::accumulate(spec.counts.begin(), spec.counts.end(), 0)));
      EXPECT_EQ(f.roots.size(), size_t(spec.counts[0]));
      std::vector<int32_t> per_level(spec.counts.size(), 0);
      for (size_t n = 0; n < f.nodes.size(); ++n) {
        const PrefixNode& node = f.nodes[n];
        const size_t level = size_t(depth_of(f, int32_t(n)));
        ASSERT_LT(level, spec.counts.size());
        ++per_level[level];
        const int32_t begin = std::accumulate(spec.lengths.begin(), spec.lengths.begin() + long(level), 0);
        EXPECT_EQ(node.token_begin, begin);
        EXPECT_EQ(node.token_end, begin + spec.lengths[level]);
        EXPECT_EQ(node.num_queries(), spec.num_queries() / spec.counts[level]);
        EXPECT_EQ(node.num_ending, level + 1 == spec.counts.size() ? 1 : 0);
      }
      EXPECT_EQ(per_level, spec.counts);
    }
  }
}

TEST(PrefixForest, ExampleTreeExactly) {
  // 1,4,16_128,256,1024 in 16-token blocks: the root is blocks [0, 8), its children [8, 24),
  // the leaves [24, 88).
  const DecodeBatch batch = make_tree_batch(parse_prefix_tree("1,4,16_128,256,1024"), 16);
  const PrefixForest f = build_prefix_forest(batch, 16);
  ASSERT_EQ(f.nodes.size(), 21u);
  ASSERT_EQ(f.roots, std::vector<int32_t>{0});
  const PrefixNode& root = f.nodes[0];
  EXPECT_EQ(root.block_begin, 0);
  EXPECT_EQ(root.block_end, 8);
  EXPECT_EQ(root.token_end, 128);
  EXPECT_EQ(root.num_queries(), 16);
  EXPECT_EQ(root.num_ending, 0);
  EXPECT_EQ(children_of(f, 0).size(), 4u);
  for (int32_t c : children_of(f, 0)) {
    EXPECT_EQ(f.nodes[size_t(c)].block_begin, 8);
    EXPECT_EQ(f.nodes[size_t(c)].block_end, 24);
    EXPECT_EQ(f.nodes[size_t(c)].num_queries(), 4);
    // make_tree_batch spreads queries evenly in level order: child i holds queries 4i .. 4i+3.
    std::vector<int32_t> q(f.queries.begin() + f.nodes[size_t(c)].query_begin,
                           f.queries.begin() + f.nodes[size_t(c)].query_end);
    std::sort(q.begin(), q.end());
    EXPECT_EQ(q[3] - q[0], 3);
    EXPECT_EQ(q[0] % 4, 0);
    for (int32_t leaf : children_of(f, c)) {
      EXPECT_EQ(f.nodes[size_t(leaf)].block_begin, 24);
      EXPECT_EQ(f.nodes[size_t(leaf)].block_end, 88);
      EXPECT_EQ(f.nodes[size_t(leaf)].token_end, 1408);
    }
  }
}

TEST(PrefixForest, RandomBatchesAreMaximalAndCoverEveryQuery) {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    Random rng(seed);
    testing::RandomTreeOptions options;
    options.block_size = rng.next(2) ? 16 : 32;
    const auto [batch, num_blocks] = testing::random_tree_batch(rng, options);
    SCOPED_TRACE("seed " + std::to_string(seed));
    ASSERT_NO_FATAL_FAILURE(check_forest(build_prefix_forest(batch, options.block_size), batch, options.block_size));
  }
}

TEST(PrefixForest, EmptySequenceIsInNoNode) {
  DecodeBatch batch;
  batch.add_sequence(std::vector<int32_t>{}, 0);
  batch.add_sequence(std::vector<int32_t>{4, 5}, 20);
  batch.add_sequence(std::vector<int32_t>{9}, 0);  // a block, but no token read yet
  const PrefixForest f = build_prefix_forest(batch, 16);
  check_forest(f, batch, 16);
  EXPECT_EQ(f.empty_queries, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(f.queries, std::vector<int32_t>{1});
  ASSERT_EQ(f.nodes.size(), 1u);
  EXPECT_EQ(f.nodes[0].token_end, 20);

  DecodeBatch only_empty;
  only_empty.add_sequence(std::vector<int32_t>{}, 0);
  const PrefixForest g = build_prefix_forest(only_empty, 16);
  EXPECT_TRUE(g.nodes.empty());
  EXPECT_TRUE(g.roots.empty());
  EXPECT_EQ(g.empty_queries, std::vector<int32_t>{0});
}

TEST(PrefixForest, IdenticalSequencesAreOneNode) {
  DecodeBatch batch;
  batch.add_sequence(std::vector<int32_t>{3, 1, 2}, 40);
  batch.add_sequence(std::vector<int32_t>{3, 1, 2}, 40);
  const PrefixForest f = build_prefix_forest(batch, 16);
  check_forest(f, batch, 16);
  ASSERT_EQ(f.nodes.size(), 1u);
  EXPECT_EQ(f.nodes[0].block_end, 3);
  EXPECT_EQ(f.nodes[0].token_end, 40);
  EXPECT_EQ(f.nodes[0].num_queries(), 2);
  EXPECT_EQ(f.nodes[0].num_ending, 2);
  EXPECT_EQ(f.nodes[0].first_child, -1);
}

// Sequence 1 reads the first 32 tokens of sequence 0's KV: it ends at an inner node.
TEST(PrefixForest, QueryWhoseKvIsAPrefixEndsAtAnInnerNode) {
  DecodeBatch batch;
  batch.add_sequence(std::vector<int32_t>{7, 8, 9}, 45);
  batch.add_sequence(std::vector<int32_t>{7, 8}, 32);
  batch.add_sequence(std::vector<int32_t>{7, 8, 11}, 33);
  const PrefixForest f = build_prefix_forest(batch, 16);
  check_forest(f, batch, 16);
  ASSERT_EQ(f.nodes.size(), 3u);
  const PrefixNode& root = f.nodes[0];
  EXPECT_EQ(root.block_end, 2);
  EXPECT_EQ(root.token_end, 32);
  EXPECT_EQ(root.num_queries(), 3);
  EXPECT_EQ(root.num_ending, 1);
  EXPECT_EQ(f.queries[size_t(root.query_begin)], 1);  // the ending query comes first
  EXPECT_GE(root.first_child, 0);
  EXPECT_EQ(children_of(f, 0).size(), 2u);
}

// Two sequences hold block 2 but read 8 and 13 of its tokens: the block is not the same for
// both, so the shared node stops before it and each gets its own child there.
TEST(PrefixForest, BlockReadToDifferentLengthsIsNotShared) {
  DecodeBatch batch;
  batch.add_sequence(std::vector<int32_t>{0, 1, 2}, 40);
  batch.add_sequence(std::vector<int32_t>{0, 1, 2}, 45);
  const PrefixForest f = build_prefix_forest(batch, 16);
  check_forest(f, batch, 16);
  ASSERT_EQ(f.nodes.size(), 3u);
  EXPECT_EQ(f.nodes[0].block_end, 2);
  EXPECT_EQ(f.nodes[0].token_end, 32);
  EXPECT_EQ(f.nodes[0].num_ending, 0);
  std::vector<int32_t> ends;
  for (int32_t c : children_of(f, 0)) {
    EXPECT_EQ(f.nodes[size_t(c)].block_begin, 2);
    EXPECT_EQ(f.nodes[size_t(c)].block_end, 3);
    EXPECT_EQ(f.nodes[size_t(c)].num_queries(), 1);
    ends.push_back(f.nodes[size_t(c)].token_end);
  }
  std::sort(ends.begin(), ends.end());
  EXPECT_EQ(ends, (std::vector<int32_t>{40, 45}));

  // A fork read 4 tokens of block 1, the other sequence all 16 and went on: again two nodes
  // from block 1 on, not one node through it.
  DecodeBatch fork;
  fork.add_sequence(std::vector<int32_t>{0, 1}, 20);
  fork.add_sequence(std::vector<int32_t>{0, 1, 5}, 40);
  const PrefixForest g = build_prefix_forest(fork, 16);
  check_forest(g, fork, 16);
  ASSERT_EQ(g.nodes.size(), 3u);
  EXPECT_EQ(g.nodes[0].block_end, 1);
  EXPECT_EQ(g.nodes[0].token_end, 16);

  // Only the first block differs in tokens read: two roots.
  DecodeBatch roots;
  roots.add_sequence(std::vector<int32_t>{6}, 5);
  roots.add_sequence(std::vector<int32_t>{6}, 9);
  const PrefixForest h = build_prefix_forest(roots, 16);
  check_forest(h, roots, 16);
  EXPECT_EQ(h.roots.size(), 2u);
}

TEST(PrefixForest, RejectsTooFewBlocks) {
  DecodeBatch batch;
  batch.add_sequence(std::vector<int32_t>{0, 1}, 20);
  batch.add_sequence(std::vector<int32_t>{0}, 17);  // 17 tokens need 2 blocks
  try {
    build_prefix_forest(batch, 16);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  }
  DecodeBatch broken;
  broken.add_sequence(std::vector<int32_t>{0}, 3);
  broken.block_offsets.back() = 2;  // past the ids
  EXPECT_THROW(build_prefix_forest(broken, 16), Error);
  EXPECT_THROW(build_prefix_forest(DecodeBatch{}, 0), Error);
}

// The benchmarks' named sets: the eight of bench/workloads/README.md among the PAT artifact's
// twenty, each a tree the parser takes; other items pass through in place.
TEST(TreeBatch, NamedBenchmarkSetsExpandInTheArtifactsOrder) {
  const std::vector<std::string> listed = expand_benchmark_trees({"listed"});
  EXPECT_EQ(listed, (std::vector<std::string>{"1,10_4096,416", "1,4,256_32,256,32", "1,8,512_32,2048,256",
                                              "1,4,16,512_1024,256,128,32", "1,16,32,64,128,1024_256,128,64,32,32,32",
                                              "2,8,16,256_256,256,32,32", "8,16,32,256_512,512,256,32", "256_4096"}));
  const std::vector<std::string> pat = expand_benchmark_trees({"1_16", "pat", "2_32"});
  ASSERT_EQ(pat.size(), 22u);
  EXPECT_EQ(pat.front(), "1_16");
  EXPECT_EQ(pat[1], "1,10_4096,416");
  EXPECT_EQ(pat[2], "1,256_256,32");
  EXPECT_EQ(pat[20], "256_4096");
  EXPECT_EQ(pat.back(), "2_32");
  for (size_t i = 1; i + 1 < pat.size(); ++i) {
    EXPECT_EQ(std::count(pat.begin(), pat.end(), pat[i]), 1) << pat[i];
    EXPECT_NO_THROW(parse_prefix_tree(pat[i])) << pat[i];
  }
  EXPECT_TRUE(expand_benchmark_trees({}).empty());
}

// tree_batch: the README notation.
TEST(TreeBatch, ParsesTheReadmeExample) {
  const PrefixTreeSpec spec = parse_prefix_tree("1,4,16_128,256,1024");
  EXPECT_EQ(spec.counts, (std::vector<int32_t>{1, 4, 16}));
  EXPECT_EQ(spec.lengths, (std::vector<int32_t>{128, 256, 1024}));
  EXPECT_EQ(spec.num_queries(), 16);
  EXPECT_EQ(spec.text, "1,4,16_128,256,1024");
  EXPECT_EQ(tree_num_blocks(spec, 16), 8 + 4 * 16 + 16 * 64);
  for (uint64_t seed : {0, 5}) {
    const DecodeBatch batch = make_tree_batch(spec, 16, seed);
    ASSERT_EQ(batch.num_seqs(), 16);
    for (int32_t s = 0; s < 16; ++s) {
      EXPECT_EQ(batch.kv_lengths[size_t(s)], 128 + 256 + 1024);
      EXPECT_EQ(batch.blocks_of(s).size(), 88u);
    }
    // "a perfect kernel reads 128 + 4*256 + 16*1024 tokens of KV once"
    EXPECT_EQ(unique_kv_tokens(batch, 16), 128 + 4 * 256 + 16 * 1024);
    // Ids 0 .. 1095, each a block of one tree node: all used.
    std::vector<int32_t> ids = batch.block_ids;
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    ASSERT_EQ(ids.size(), 1096u);
    EXPECT_EQ(ids.front(), 0);
    EXPECT_EQ(ids.back(), 1095);
    // Queries 0..3 share their second-level node, 3 and 4 only the root.
    EXPECT_EQ(batch.blocks_of(0)[8], batch.blocks_of(3)[8]);
    EXPECT_NE(batch.blocks_of(3)[8], batch.blocks_of(4)[8]);
    EXPECT_EQ(batch.blocks_of(3)[7], batch.blocks_of(4)[7]);
    EXPECT_NE(batch.blocks_of(0)[24], batch.blocks_of(1)[24]);
  }
  // Seed 0 keeps ids in level order; another seed scatters them.
  EXPECT_EQ(make_tree_batch(spec, 16, 0).block_ids[0], 0);
  EXPECT_NE(make_tree_batch(spec, 16, 5).block_ids, make_tree_batch(spec, 16, 0).block_ids);
  EXPECT_EQ(make_tree_batch(spec, 16, 5).block_ids, make_tree_batch(spec, 16, 5).block_ids);
}

TEST(TreeBatch, LeavesNeedNotFillTheirLastBlock) {
  const DecodeBatch batch = make_tree_batch(parse_prefix_tree("1,10_4096,416"), 32);
  ASSERT_EQ(batch.num_seqs(), 10);
  EXPECT_EQ(batch.kv_lengths[0], 4512);
  EXPECT_EQ(batch.blocks_of(0).size(), 128u + 13u);
  const DecodeBatch ragged = make_tree_batch(parse_prefix_tree("2,6_64,5"), 16);
  EXPECT_EQ(ragged.kv_lengths, std::vector<int32_t>(6, 69));
  EXPECT_EQ(unique_kv_tokens(ragged, 16), 2 * 64 + 6 * 5);
}

TEST(TreeBatch, RejectsMalformedSpecsNamingThem) {
  for (const char* text : {"1,4,16", "1,4_128_256", "", "_", "1,4_", "_128,256", "1,x_128,256", "1,4_128,2.5",
                           "1,4_128,", "1,,4_1,2,3", "0,4_128,256", "1,4_0,256", "-1,4_128,256", "1,4_128",
                           "1,2,3_16,16,16", "2,3_16,16", " 1_16", "1_16 ", "2_2000000000",
                           "1,4_99999999999,1"}) {
    SCOPED_TRACE(text);
    try {
      parse_prefix_tree(text);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(std::string("'") + text), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(parse_prefix_tree("3_1"));
  EXPECT_NO_THROW(parse_prefix_tree("1,3,9_1,1,1"));
}

TEST(TreeBatch, SharedNodesMustFillWholeBlocks) {
  const PrefixTreeSpec spec = parse_prefix_tree("1,4_100,50");
  try {
    make_tree_batch(spec, 16);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("1,4_100,50"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(make_tree_batch(spec, 4));  // 100 tokens fill 25 blocks of 4
  EXPECT_THROW(make_tree_batch(parse_prefix_tree("1,2,4_32,24,8"), 16), Error);  // the middle level
  EXPECT_THROW(make_tree_batch(parse_prefix_tree("1,4_32,50"), 0), Error);
}

}  // namespace
}  // namespace pagoda::attention

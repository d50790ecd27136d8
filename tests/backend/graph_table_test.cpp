// The CUDA backend's rule for replaying a captured graph (backend/cuda/graph_table.h), on the
// host: graphs here are integers, and destroying one records it.
#include "pagoda/backend/cuda/graph_table.h"

#include <gtest/gtest.h>

#include <vector>

namespace pagoda::cuda {
namespace {

struct Table {
  std::vector<int> destroyed;
  GraphTable<int> graphs{[this](int g) { destroyed.push_back(g); }};
};

constexpr GraphKey kPaged4{.rows = 4, .attention = GraphAttention::kPaged, .launch_shape = 0, .generation = 7};

TEST(GraphTable, ReplaysOnlyTheExactKey) {
  Table t;
  EXPECT_EQ(t.graphs.find(kPaged4), nullptr);
  t.graphs.insert(kPaged4, 1);
  ASSERT_NE(t.graphs.find(kPaged4), nullptr);
  EXPECT_EQ(*t.graphs.find(kPaged4), 1);
  // Each field of the key on its own tells graphs apart: rows, attention kind, launch shape.
  GraphKey rows8 = kPaged4, prefix = kPaged4, merge_shape = kPaged4;
  rows8.rows = 8;
  prefix.attention = GraphAttention::kPrefix;
  merge_shape.attention = GraphAttention::kPrefix;
  merge_shape.launch_shape = 2;
  for (const GraphKey& other : {rows8, prefix, merge_shape}) EXPECT_EQ(t.graphs.find(other), nullptr);
  t.graphs.insert(rows8, 2);
  t.graphs.insert(prefix, 3);
  t.graphs.insert(merge_shape, 4);
  EXPECT_EQ(*t.graphs.find(kPaged4), 1);
  EXPECT_EQ(*t.graphs.find(rows8), 2);
  EXPECT_EQ(*t.graphs.find(prefix), 3);
  EXPECT_EQ(*t.graphs.find(merge_shape), 4);
  EXPECT_EQ(t.graphs.size(), 4u);
  EXPECT_TRUE(t.destroyed.empty());
  EXPECT_EQ(t.graphs.invalidations(), 0);
}

// A new generation (a buffer some graph captured was reallocated) destroys every graph, once,
// and the graphs captured after it are kept.
TEST(GraphTable, ANewGenerationDestroysEveryGraphOnce) {
  Table t;
  GraphKey rows8 = kPaged4;
  rows8.rows = 8;
  t.graphs.insert(kPaged4, 1);
  t.graphs.insert(rows8, 2);
  GraphKey moved = kPaged4;
  moved.generation = 8;
  EXPECT_EQ(t.graphs.find(moved), nullptr);
  EXPECT_EQ(t.destroyed, (std::vector<int>{1, 2}));
  EXPECT_EQ(t.graphs.invalidations(), 1);
  EXPECT_EQ(t.graphs.size(), 0u);
  t.graphs.insert(moved, 3);
  EXPECT_EQ(*t.graphs.find(moved), 3);
  EXPECT_EQ(t.graphs.invalidations(), 1);
  // The old key cannot come back: looking it up is another change of generation.
  EXPECT_EQ(t.graphs.find(kPaged4), nullptr);
  EXPECT_EQ(t.destroyed, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(t.graphs.invalidations(), 2);
}

TEST(GraphTable, AGenerationChangeWithoutGraphsIsNoInvalidation) {
  Table t;
  GraphKey key = kPaged4;
  for (uint64_t g = 1; g < 5; ++g) {
    key.generation = g;
    EXPECT_EQ(t.graphs.find(key), nullptr);
  }
  EXPECT_EQ(t.graphs.invalidations(), 0);
}

TEST(GraphTable, ReplacingAndClearingDestroyTheGraphs) {
  std::vector<int> destroyed;
  {
    GraphTable<int> graphs([&](int g) { destroyed.push_back(g); });
    graphs.insert(kPaged4, 1);
    graphs.insert(kPaged4, 2);  // a capture again under the same key replaces the first
    EXPECT_EQ(destroyed, (std::vector<int>{1}));
    EXPECT_EQ(*graphs.find(kPaged4), 2);
    GraphKey prefix = kPaged4;
    prefix.attention = GraphAttention::kPrefix;
    graphs.insert(prefix, 3);
  }  // the table's end destroys what it holds
  EXPECT_EQ(destroyed, (std::vector<int>{1, 2, 3}));
}

}  // namespace
}  // namespace pagoda::cuda

// GraphTable: the CUDA graphs a backend captured, by key, and the one rule for replaying one: a
// graph is valid iff its key equals the current step's key.
//
// A capture bakes in the step's launch configuration and the addresses of every buffer its ops
// read. The key holds all of it that can change between steps: the padded rows, the attention
// kind and the attention's launch shape, and the generation of the buffers (a number that
// changes whenever any of them is reallocated and never comes back to an old value). The table
// keeps graphs of one generation only: the first lookup under a new one destroys the others,
// which can never be valid again, and counts an invalidation.
//
// Plain C++ (the graph type and how to destroy one are the caller's), so that the rule is tested
// without a GPU (tests/backend/graph_table_test.cpp).
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <utility>

namespace pagoda::cuda {

enum class GraphAttention : uint8_t { kPaged, kPrefix };

struct GraphKey {
  int32_t rows = 0;  // StepBatch::graph_rows
  GraphAttention attention = GraphAttention::kPaged;
  int32_t launch_shape = 0;  // what the attention's launches fix besides its buffers (prefix: the
                             // merge's warps per row, PrefixWorkspace::graph_shape(); paged: 0)
  uint64_t generation = 0;   // of every buffer the step's ops read

  auto operator<=>(const GraphKey&) const = default;
};

template <typename Graph>
class GraphTable {
 public:
  explicit GraphTable(std::function<void(Graph)> destroy) : destroy_(std::move(destroy)) {}
  ~GraphTable() { clear(); }
  GraphTable(const GraphTable&) = delete;
  GraphTable& operator=(const GraphTable&) = delete;

  // The graph captured under exactly this key, or null. A key of another generation than the
  // table's first destroys every graph held (one invalidation, when there were any).
  const Graph* find(const GraphKey& key) {
    use_generation(key.generation);
    const auto it = graphs_.find(key);
    return it == graphs_.end() ? nullptr : &it->second;
  }

  // Keeps graph, captured for key; replaces (and destroys) one already kept under it.
  void insert(const GraphKey& key, Graph graph) {
    use_generation(key.generation);
    if (const auto it = graphs_.find(key); it != graphs_.end()) {
      destroy_(it->second);
      it->second = graph;
      return;
    }
    graphs_.emplace(key, graph);
  }

  void clear() {
    for (auto& [key, graph] : graphs_) destroy_(graph);
    graphs_.clear();
  }

  size_t size() const { return graphs_.size(); }
  // How many times graphs were destroyed because the buffers' generation changed.
  int64_t invalidations() const { return invalidations_; }

 private:
  void use_generation(uint64_t generation) {
    if (generation == generation_) return;
    if (!graphs_.empty()) ++invalidations_;
    clear();
    generation_ = generation;
  }

  std::function<void(Graph)> destroy_;
  std::map<GraphKey, Graph> graphs_;  // all of generation_
  uint64_t generation_ = 0;
  int64_t invalidations_ = 0;
};

}  // namespace pagoda::cuda

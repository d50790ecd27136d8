// `pagoda bench prefix-attention`: the prefix-aware decode kernel (backend/cuda/prefix_attention.h)
// on synthetic prefix-tree batches (tree_batch.h), every figure next to its bound, beside the paged
// decode kernel on the same batch; or, with --plan-only, the planner's host time alone.
#pragma once

#include <string>
#include <vector>

namespace pagoda::bench {

struct PrefixBenchOptions {
  std::vector<std::string> trees{"listed"};  // expand_benchmark_trees's names, or trees
  std::vector<std::string> heads{"32/32", "16/8", "32/8", "64/8"};
  int head_dim = 128;
  int block_size = 16;
  std::string dtype = "fp16";
  int runs = 20;
  int warmup = 3;
  int workers = 132;  // --plan-only: the device the plan is made for (an H100/H200 has 132 SMs)
  bool plan_only = false;
  bool list_trees = false;
  std::string out;  // empty: bench/results/<device slug>/prefix_attention.json
};

// Runs it, prints its table and writes its JSON (--list-trees: prints the batches only). Throws
// Error(kInvalidArgument) for options out of range, Error(kUnsupported) for a GPU run in a build
// without CUDA.
void run_prefix_attention_bench(PrefixBenchOptions options);

}  // namespace pagoda::bench

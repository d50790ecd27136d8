// `pagoda bench attention`: GPU decode attention (backend/cuda/decode_attention.h) over a sweep of
// batch x context x head shapes, every figure next to its streaming-read bound, the group-tiled
// kernel beside the per-head decode kernel (attention.cpp says how it is measured).
#pragma once

#include <string>
#include <vector>

#include "pagoda/attention/plan.h"

namespace pagoda::bench {

struct AttentionBenchOptions {
  std::vector<int> batches{1, 8, 32, 64, 128, 256};
  // 4096 is there because the decode-attention targets are set at 4K (docs/experiments/decode-attention.md).
  std::vector<int> contexts{512, 2048, 4096, 8192, 32768};
  std::vector<std::string> heads{"32/32", "32/8", "28/4", "40/8"};  // q heads / kv heads
  int head_dim = 128;
  int block_size = 16;
  std::string dtype = "fp16";
  std::string layout = "hnd";
  int runs = 20;
  int warmup = 3;
  std::vector<std::string> variants{"tiled", "tiled_prefetch", "baseline", "baseline_prefetch"};
  int prefetch_distance = 0;
  int min_split_tokens = attention::PlanOptions{}.min_kv_tokens_per_item;
  std::string out;     // empty: bench/results/<device slug>/attention.json
  std::string filter;  // run only configs whose name contains this
  double max_kv_gb = 0;  // 0: 70% of free device memory
  bool baseline_all = false;
  bool max_kv_given = false;  // --max-kv-gb was given
  // More than f16: compare the KV dtypes instead (attention_kv_dtypes.cpp), f16 first.
  std::vector<std::string> kv_cache_dtypes{"f16"};
};

// Runs the sweep, prints its table and writes its JSON. Throws Error(kInvalidArgument) for options
// out of range, Error(kUnsupported) in a build without CUDA.
void run_attention_bench(const AttentionBenchOptions& options);

// The KV-dtype comparison of --kv-cache-dtype f16,fp8,int2: each dtype's median, the fraction of
// its own streaming bound, and its speedup over f16 (run_attention_bench calls it).
void run_attention_kv_dtype_bench(const AttentionBenchOptions& options);

}  // namespace pagoda::bench

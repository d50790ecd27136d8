// `pagoda bench quant-matmul`: the CUDA backend's matmul on GGUF block-quantized weights
// (backend/cuda/quant_matmul.h) at Llama-3-8B's projection shapes, per type and batch, against
// its bytes bound (the weights' quantized bytes / streaming bandwidth measured in the same run),
// beside the same shape on f16 weights (cuBLASLt, the path for weights dequantized at load).
#pragma once

#include <string>
#include <vector>

namespace pagoda::bench {

struct QuantMatmulBenchOptions {
  std::vector<std::string> types{"q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k"};
  std::vector<int> batches{1, 8, 16, 64, 256};
  // m x k: Llama-3-8B's o (and q) projection, gate/up fused, down.
  std::vector<std::string> shapes{"4096x4096", "28672x4096", "4096x14336"};
  int runs = 20;
  std::string out;  // empty: bench/results/<device slug>/quantized-weights.json
};

// Runs the sweep, prints a markdown table and writes the JSON. Throws Error(kInvalidArgument)
// for options out of range, Error(kUnsupported) in a build without CUDA.
void run_quant_matmul_bench(const QuantMatmulBenchOptions& options);

}  // namespace pagoda::bench

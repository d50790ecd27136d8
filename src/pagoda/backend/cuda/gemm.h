// The model's linear layers on cuBLASLt: out[m, n] = x[m, k] @ w[n, k]^T (+ bias[n]), fp16 or
// bf16 operands, fp32 accumulation.
//
// Algorithm choice, once per (m, n, k, dtype, out_dtype, bias), kept in a map with the matmul
// descriptor and layouts, so that every later call (every decode step, and the replay of a
// captured CUDA graph) only enqueues the matmul. When the caller asks (the backend does for the
// decode steps it replays as graphs: a few batch sizes, run thousands of times) and m <= 256, the
// first call times up to 32 of cuBLASLt's heuristic picks on the real operands, from a cold L2,
// and keeps the fastest: there the GEMM is bound by reading w once, and the heuristic's top
// pick falls well short of that bound (it leaves SMs idle on some shapes and adds split-K
// reductions on others; docs/experiments/engine.md). Larger m (prefill) takes
// the top pick: compute-bound tiles are what the heuristic models well, and prefill chunk sizes
// vary too much to time each.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "pagoda/core/dtype.h"

namespace pagoda::cuda {

class Gemm {
 public:
  // Creates the cuBLASLt handle and a fixed 32 MiB workspace (split-K algorithms use it; graph
  // capture needs its address fixed).
  Gemm();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // x: [m, k], w: [n, k], bias: [n] or null, all of dtype (f16 or bf16); out: [m, n] of out_dtype
  // (dtype, or kF32 for the logits). Row-major contiguous, 16-byte aligned, n and k multiples of
  // 8. A bias needs out_dtype == dtype (cuBLASLt's bias has the output's type). One stream at a
  // time: calls share the workspace. Throws pagoda::Error for a shape or type outside this.
  // tune: time cuBLASLt's candidates the first time this shape is seen (see above).
  void run(const void* x, const void* w, const void* bias, void* out, int64_t m, int64_t n, int64_t k,
           DType dtype, DType out_dtype, cudaStream_t stream, bool tune = false);

 private:
  struct Shape {
    int64_t m, n, k;
    DType dtype, out_dtype;
    bool bias;
    bool tune;
    auto operator<=>(const Shape&) const = default;
  };
  // Everything cublasLtMatmul needs for one Shape, chosen once; owns its cuBLASLt objects.
  struct Plan {
    Plan() = default;
    Plan(const Plan&) = delete;
    Plan& operator=(const Plan&) = delete;
    ~Plan();
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t w_layout = nullptr;    // A: w as column-major [k, n], transposed
    cublasLtMatrixLayout_t x_layout = nullptr;    // B: x as column-major [k, m]
    cublasLtMatrixLayout_t out_layout = nullptr;  // C = D: out as column-major [n, m]
    cublasLtMatmulAlgo_t algo{};
  };

  Plan& plan_for(const Shape& shape, const void* x, const void* w, const void* bias, void* out, cudaStream_t stream);
  // The fastest of `candidates` on these operands (a first call, outside any graph capture).
  cublasLtMatmulAlgo_t fastest(Plan& plan, const std::vector<cublasLtMatmulHeuristicResult_t>& candidates,
                               const void* x, const void* w, void* out, cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  void* l2_flush_ = nullptr;  // written between timed candidates so each reads w from memory
  std::map<Shape, std::unique_ptr<Plan>> plans_;
};

}  // namespace pagoda::cuda

// The model's linear layers on cuBLASLt: out[m, n] = x[m, k] @ w[n, k]^T (+ bias[n]), fp16 or
// bf16 operands, fp32 accumulation.
//
// Algorithm choice: the first call with a given (m, n, k, dtype, out_dtype, bias) asks cuBLASLt's
// heuristic once and keeps its top result, with the matmul descriptor and the matrix layouts,
// in a map; every later call (every decode step, and the replay of a captured CUDA graph) only
// enqueues the matmul. The top heuristic pick is good enough here: at decode (m = 1..256
// against weights up to 28672 x 8192) the GEMM is bound by reading w once, which any
// reasonable tile does at close to full bandwidth, so timing candidates would buy little.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <compare>
#include <cstdint>
#include <map>
#include <memory>

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
  void run(const void* x, const void* w, const void* bias, void* out, int64_t m, int64_t n, int64_t k,
           DType dtype, DType out_dtype, cudaStream_t stream);

 private:
  struct Shape {
    int64_t m, n, k;
    DType dtype, out_dtype;
    bool bias;
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

  Plan& plan_for(const Shape& shape);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::map<Shape, std::unique_ptr<Plan>> plans_;
};

}  // namespace pagoda::cuda

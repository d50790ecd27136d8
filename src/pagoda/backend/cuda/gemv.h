// out[m, n] = x[m, k] @ w[n, k]^T (+ bias[n]) for decode batches of at most kGemvMaxRows rows,
// where a GEMM is a weight stream: one warp per weight row, 16-byte loads, fp32 accumulation.
//
// Launched with programmatic dependent launch: its CTAs start while the kernel before it (which
// calls launch_dependents early: the RMSNorms, SwiGLU, the attention merge) still runs, pull their
// weight rows into L2, and only then wait for that kernel's output. The weights do not depend on
// the previous op, so the ramp of the weight stream overlaps it instead of following it.
//
// Bytes: n x k x 2 of weights, once, plus m x k and m x n of activations; FLOPs: 2 m n k.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "pagoda/core/dtype.h"

namespace pagoda::cuda {

inline constexpr int64_t kGemvMaxRows = 8;

// Whether gemv runs these operands: 1..kGemvMaxRows rows, k a multiple of 8, f16 or bf16
// operands, out of the operands' type or f32, 16-byte aligned x and w.
bool gemv_supported(int64_t m, int64_t k, DType dtype, DType out_dtype, const void* x, const void* w);

// Only enqueues the kernel on stream (graph-capturable). Callers check gemv_supported first.
void gemv(const void* x, const void* w, const void* bias, void* out, int64_t m, int64_t n, int64_t k, DType dtype,
          DType out_dtype, cudaStream_t stream);

}  // namespace pagoda::cuda

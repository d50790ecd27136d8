// CPU matmul out[n, m] = x[n, k] @ w[m, k]^T with f32 activations and f32/f16/bf16 weights, or
// GGUF block-quantized ones (quant_matmul.h).
//
// Decode multiplies a handful of rows by every weight once: memory bound, so the weights stay
// f16/bf16 and are widened in registers (F16C / shifts) inside a row-parallel kernel that reads
// each weight byte once per step. Prefill (many rows) is compute bound: weights are widened a
// panel at a time and OpenBLAS sgemm does the arithmetic.
#pragma once

#include "pagoda/core/tensor.h"

namespace pagoda::cpu {

// Rows of x at or below this go through the streaming kernel; above it, through sgemm.
inline constexpr int64_t kStreamingMaxRows = 8;

void matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor out);

}  // namespace pagoda::cpu

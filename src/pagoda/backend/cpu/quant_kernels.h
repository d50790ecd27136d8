// The quantized dot-product kernels' shared contract: the 8-bit activation layout and the
// signature every ISA variant implements. The kernels themselves are quant_kernels_body.h,
// compiled once per instruction set (quant_kernels_avx2.cpp, quant_kernels_avx512.cpp) and
// chosen at run time by quant_matmul.cpp.
//
// Activations are quantized per block of 32 to int8 with an f32 scale, as llama.cpp's q8_0 does,
// so that a weight block's dot product is one integer multiply-add instruction per 32 weights
// instead of 32 widening conversions and FMAs; the per-block sum lets formats with a minimum
// (q4_1, q5_1, the K-quants) and offset formats (q4_0, q5_0) add their constant term once per
// block: sum_i (d q_i + m) (dx xq_i) = d dx sum_i q_i xq_i + m (dx sum_i xq_i).
#pragma once

#include <cstddef>
#include <cstdint>

#include "pagoda/core/dtype.h"

namespace pagoda::cpu {

// Rows of activations quantized to int8 in blocks of 32 elements.
struct Q8Rows {
  const int8_t* q = nullptr;   // [rows, k]
  const float* d = nullptr;    // [rows, k / 32]: x ~= d * q within each block
  const float* s = nullptr;    // [rows, k / 32]: d * sum of the block's q
  int64_t k = 0;
};

// out[r * out_stride + j] = dot(x row r, weight row j) for r in [0, rows), j in [first, last),
// weight rows of w_row_bytes bytes in the file's block layout of type w.
using QuantGemmFn = void (*)(DType w, const uint8_t* weights, size_t w_row_bytes, int64_t first, int64_t last,
                             const Q8Rows& x, int64_t rows, float* out, int64_t out_stride);

void quant_gemm_avx2(DType w, const uint8_t* weights, size_t w_row_bytes, int64_t first, int64_t last,
                     const Q8Rows& x, int64_t rows, float* out, int64_t out_stride);
void quant_gemm_avx512(DType w, const uint8_t* weights, size_t w_row_bytes, int64_t first, int64_t last,
                       const Q8Rows& x, int64_t rows, float* out, int64_t out_stride);

}  // namespace pagoda::cpu

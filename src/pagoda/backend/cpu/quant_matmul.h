// CPU matmul out[n, m] = x[n, k] @ w[m, k]^T with w in a GGUF block-quantized type (q4_0, q4_1,
// q5_0, q5_1, q8_0, q4_k, q5_k, q6_k), read straight from the file's blocks.
//
// Decode reads each weight byte once per step, so keeping the file's 4-6 bits per weight instead
// of f16's 16 cuts the bytes a step reads about threefold. The activations are quantized to int8
// per block of 32 (quant_kernels.h), then every 32 weights cost one integer dot product; the same
// kernel serves prefill, where a tile of 4 activation rows shares each unpacked weight group.
// Bytes read: m * k / block_elements * block_bytes of weights plus n * k * (1 + 8 / 32) of
// activations; multiply-adds: n * m * k.
#pragma once

#include "pagoda/core/tensor.h"

namespace pagoda::cpu {

// The instruction set of the kernels; the best one the CPU runs is chosen at run time.
enum class QuantIsa : uint8_t { kAvx2, kAvx512Vnni };

bool quant_isa_supported(QuantIsa isa);
QuantIsa best_quant_isa();
const char* quant_isa_name(QuantIsa isa);

// x [n, k] f32, w [m, k] block-quantized (k a multiple of its block), bias [m] f32 or null,
// out [n, m] f32.
void quant_matmul(const Tensor& x, const Tensor& w, const float* bias, Tensor out);
void quant_matmul(const Tensor& x, const Tensor& w, const float* bias, Tensor out, QuantIsa isa);

// Quantizes n rows of k floats (k a multiple of 32) in blocks of 32: q = round(x / d) with
// d = max |x| / 127, and s = d * sum(q) per block. Exposed for the kernels' tests.
void quantize_rows_q8(const float* x, int64_t x_stride, int64_t n, int64_t k, int8_t* q, float* d, float* s);

}  // namespace pagoda::cpu

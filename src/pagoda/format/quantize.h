// Quantizers for GGUF block types: the inverse of dequantize.h, writing ggml's block layouts.
// Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 follow ggml's reference quantizers step for step, so their
// bytes equal those of ggml and of the `gguf` Python package's quantize. Q4_K, Q5_K and Q6_K use
// the plain scale choice (each sub-block's range, then the super-block scale that quantizes the
// sub-block scales), not ggml's iterative search for the scale of least squared error: a valid
// file of the format, a little less accurate than llama-quantize's.
#pragma once

#include <cstdint>

#include "pagoda/format/ggml_type.h"

namespace pagoda {

// True for the types quantize_row writes: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k,
// q5_k, q6_k.
bool can_quantize(GgmlType type);

// Writes n finite values (a multiple of the type's block size) as n / block_size blocks to dst
// (n / block_size * block_bytes bytes). Throws Error(kUnsupported) for a type it cannot write and
// kInvalidArgument when n is not a multiple of the block size.
void quantize_row(GgmlType type, const float* src, void* dst, int64_t n);

}  // namespace pagoda

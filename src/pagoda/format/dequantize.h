// Dequantizers for GGUF tensor types: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K.
// Each reproduces ggml's reference dequantization exactly (same operation order in fp32), which
// is also what the `gguf` Python package and Hugging Face transformers compute.
#pragma once

#include <cstdint>

#include "pagoda/format/ggml_type.h"

namespace pagoda {

// Dequantizes n elements (a multiple of the type's block size) starting at a block boundary.
// Throws Error(kUnsupported) for a type it cannot dequantize and kInvalidArgument when n is not
// a multiple of the block size.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

}  // namespace pagoda

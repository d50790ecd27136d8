// Element types of tensors. Besides the dense types, the GGUF block-quantized types that the CPU
// backend multiplies directly (format/ggml_type.h has ggml's full list and their layouts): a
// tensor of such a type holds whole blocks of block_elements(t) elements in block_bytes(t) bytes
// each, its strides still counted in elements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace pagoda {

enum class DType : uint8_t { kF32, kF16, kBF16, kI32, kI64, kU8, kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0, kQ4_K, kQ5_K, kQ6_K };

constexpr bool is_block_quantized(DType t) { return t >= DType::kQ4_0; }

// Elements per block: 1 for the dense types.
constexpr int64_t block_elements(DType t) {
  switch (t) {
    case DType::kQ4_0: case DType::kQ4_1: case DType::kQ5_0: case DType::kQ5_1: case DType::kQ8_0: return 32;
    case DType::kQ4_K: case DType::kQ5_K: case DType::kQ6_K: return 256;
    default: return 1;
  }
}

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
    default: return 0;  // a block-quantized type has no per-element size: see dtype_bytes
  }
}

// Bytes of one block (of one element for the dense types).
constexpr size_t block_bytes(DType t) {
  switch (t) {
    case DType::kQ4_0: return 18;
    case DType::kQ4_1: return 20;
    case DType::kQ5_0: return 22;
    case DType::kQ5_1: return 24;
    case DType::kQ8_0: return 34;
    case DType::kQ4_K: return 144;
    case DType::kQ5_K: return 176;
    case DType::kQ6_K: return 210;
    default: return dtype_size(t);
  }
}

// Bytes of `elements` consecutive elements (a whole number of blocks).
constexpr size_t dtype_bytes(DType t, int64_t elements) {
  return size_t(elements / block_elements(t)) * block_bytes(t);
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
    case DType::kQ4_0: return "q4_0";
    case DType::kQ4_1: return "q4_1";
    case DType::kQ5_0: return "q5_0";
    case DType::kQ5_1: return "q5_1";
    case DType::kQ8_0: return "q8_0";
    case DType::kQ4_K: return "q4_k";
    case DType::kQ5_K: return "q5_k";
    case DType::kQ6_K: return "q6_k";
  }
  return "?";
}

}  // namespace pagoda

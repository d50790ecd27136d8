// Element types of dense tensors. GGUF block-quantized types live in format/ggml_type.h: they
// are storage formats the loader dequantizes, not types the backends compute in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace pagoda {

enum class DType : uint8_t { kF32, kF16, kBF16, kI32, kI64, kU8 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
  }
  return "?";
}

}  // namespace pagoda

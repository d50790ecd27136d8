// GGUF tensor element types (ggml's numbering) and their block layouts. Block-quantized types
// are storage formats: the loader dequantizes them (dequantize.h); backends compute in
// f32/f16/bf16.
#pragma once

#include <cstdint>
#include <string_view>

namespace pagoda {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kBF16 = 30,
};

struct GgmlTypeTraits {
  std::string_view name;  // "q4_1"; "unknown" for numbers pagoda does not know
  int64_t block_size;     // elements per block (1 for f32/f16/bf16); 0 when unknown
  int64_t block_bytes;    // bytes per block; 0 when unknown
  bool can_dequantize;    // dequantize_row supports it
};

// Total for any 32-bit value (a file may hold any number).
GgmlTypeTraits ggml_type_traits(uint32_t type);

}  // namespace pagoda

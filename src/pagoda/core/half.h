// fp16 and bf16 storage types and their exact conversions to and from fp32.
// Scalar bit manipulation, so the same code runs in every build (sanitizers, fuzzers, CPU
// reference); hot loops that convert many values use F16C in backend/cpu instead.
#pragma once

#include <bit>
#include <cstdint>

namespace pagoda {

struct f16 {
  uint16_t bits;
};
struct bf16 {
  uint16_t bits;
};

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0x1f) {  // inf / nan
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {  // normal
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // zero
    bits = sign;
  } else {  // subnormal: renormalise
    int e = -1;
    do {
      ++e;
      mantissa <<= 1;
    } while ((mantissa & 0x400) == 0);
    bits = sign | uint32_t(112 - e) << 23 | ((mantissa & 0x3ff) << 13);
  }
  return std::bit_cast<float>(bits);
}

// Round to nearest even, with overflow to inf and gradual underflow.
inline uint16_t f32_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t abs = x & 0x7fffffff;
  if (abs >= 0x7f800000u) return uint16_t(sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 : 0));
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                                 // below 2^-14: subnormal or zero
    if (abs < 0x33000000u) return uint16_t(sign);          // below half of the smallest subnormal
    // value = mantissa * 2^(exponent - 150) and the fp16 subnormal unit is 2^-24.
    const uint32_t shift = 126 - (abs >> 23);  // 14..24
    const uint32_t mantissa = (abs & 0x7fffff) | 0x800000;
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1))) ++half;
    return uint16_t(sign | half);
  }
  uint32_t half = ((abs - 0x38000000u) >> 13);
  const uint32_t rest = abs & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;
  return uint16_t(sign | half);
}

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffff) > 0x7f800000u) return uint16_t((x >> 16) | 0x40);  // quiet nan
  return uint16_t((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

}  // namespace pagoda

#include "pagoda/backend/cpu/kv_quantize.h"

#include <algorithm>
#include <cmath>

namespace pagoda::cpu {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

float stochastic_uniform(uint64_t stream, uint64_t index) {
  return float(splitmix64(stream ^ splitmix64(index)) >> 40) * 0x1p-24f;
}

uint64_t kv_stream(uint64_t seed, int32_t layer, int32_t kind, int32_t head) {
  return splitmix64(seed ^ splitmix64((uint64_t(uint32_t(layer)) << 33) | (uint64_t(uint32_t(kind)) << 32) |
                                      uint64_t(uint32_t(head))));
}

int32_t quantize_int2(const float* x, int64_t stride, int32_t n, uint64_t stream, uint64_t index0,
                      uint64_t index_stride, uint8_t* codes, Int2Params& params, bool stochastic) {
  float lo = x[0], hi = x[0];
  for (int32_t i = 1; i < n; ++i) {
    lo = std::min(lo, x[i * stride]);
    hi = std::max(hi, x[i * stride]);
  }
  params.min = f16{f32_to_f16(lo)};
  params.scale = f16{f32_to_f16((hi - lo) / 3.f)};
  const float min = f16_to_f32(params.min.bits), scale = f16_to_f32(params.scale.bits);
  int32_t sum = 0;
  for (int32_t i = 0; i < n; ++i) {
    int32_t code = 0;
    if (scale > 0.f) {
      // Clamped (and a NaN made 0) before any conversion to an integer.
      const float ratio = (x[i * stride] - min) / scale;
      const float t = ratio > 0.f ? std::min(ratio, 3.f) : 0.f;
      const float floor_t = std::floor(t);
      const float u = stochastic ? stochastic_uniform(stream, index0 + uint64_t(i) * index_stride) : 0.5f;
      code = std::clamp(int32_t(floor_t) + (u < t - floor_t ? 1 : 0), 0, 3);
    }
    codes[i] = uint8_t(code);
    sum += code;
  }
  return sum;
}

void pack_int2(const uint8_t* codes, int32_t n, uint8_t* packed) {
  for (int32_t i = 0; i < n; i += 4) {
    uint8_t byte = 0;
    for (int32_t j = 0; j < 4 && i + j < n; ++j) byte = uint8_t(byte | (codes[i + j] << (2 * j)));
    packed[i / 4] = byte;
  }
}

int32_t quantize_uint8(const float* x, int32_t n, uint8_t* codes, Uint8Params& params) {
  float lo = x[0], hi = x[0];
  for (int32_t i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  params.min = lo;
  params.scale = (hi - lo) / 255.f;
  int32_t sum = 0;
  for (int32_t i = 0; i < n; ++i) {
    const float ratio = params.scale > 0.f ? (x[i] - lo) / params.scale : 0.f;
    const auto code = int32_t(std::nearbyint(ratio > 0.f ? std::min(ratio, 255.f) : 0.f));
    codes[i] = uint8_t(code);
    sum += code;
  }
  return sum;
}

float e4m3_to_f32(uint8_t code) {
  const float sign = (code & 0x80) ? -1.f : 1.f;
  const int32_t exponent = (code >> 3) & 0xf, mantissa = code & 7;
  if (exponent == 15 && mantissa == 7) return std::nanf("");
  if (exponent == 0) return sign * std::ldexp(float(mantissa), -9);
  return sign * std::ldexp(1.f + float(mantissa) / 8.f, exponent - 7);
}

uint8_t f32_to_e4m3(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  if (a >= 448.f) return sign | 0x7e;
  if (a < 0x1p-6f) return uint8_t(sign | uint8_t(std::nearbyint(a * 0x1p9f)));  // 8 is the smallest normal
  int exponent = 0;
  const float fraction = std::frexp(a, &exponent);  // a = fraction * 2^exponent, fraction in [0.5, 1)
  int32_t biased = exponent - 1 + 7;
  int32_t mantissa = int32_t(std::nearbyint((2.f * fraction - 1.f) * 8.f));
  if (mantissa == 8) {
    mantissa = 0;
    ++biased;
  }
  if (biased > 15 || (biased == 15 && mantissa == 7)) return sign | 0x7e;
  return uint8_t(sign | (biased << 3) | mantissa);
}

}  // namespace pagoda::cpu

// The KV number formats on the device, bit for bit those of backend/cpu/kv_quantize.h (the GPU
// and CPU caches must hold the same codes: tests compare them byte for byte): the counter-based
// stochastic-rounding generator, e4m3 encoding, and the randomized Hadamard signs. Plain fp32
// IEEE arithmetic only (no fast-math intrinsics, no contraction where the CPU rounds twice).
#pragma once

#include <cstdint>

namespace pagoda::cuda::kernels {

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// cpu::stochastic_uniform: a draw in [0, 1) for element `index` of `stream`.
__device__ __forceinline__ float stochastic_uniform(uint64_t stream, uint64_t index) {
  return float(splitmix64(stream ^ splitmix64(index)) >> 40) * 0x1p-24f;
}

// cpu::kv_stream: the stream of (layer, K 0 / V 1, kv head) under seed.
__device__ __forceinline__ uint64_t kv_stream(uint64_t seed, int32_t layer, int32_t kind, int32_t head) {
  return splitmix64(seed ^ splitmix64((uint64_t(uint32_t(layer)) << 33) | (uint64_t(uint32_t(kind)) << 32) |
                                      uint64_t(uint32_t(head))));
}

// cpu::quantize_int2's code of one element, given the f16-rounded min and scale (as floats) and
// the element's draw u.
__device__ __forceinline__ int32_t int2_code(float x, float min, float scale, float u) {
  if (!(scale > 0.f)) return 0;
  const float ratio = __fdiv_rn(__fsub_rn(x, min), scale);
  const float t = ratio > 0.f ? fminf(ratio, 3.f) : 0.f;
  const float floor_t = floorf(t);
  const int32_t code = int32_t(floor_t) + (u < __fsub_rn(t, floor_t) ? 1 : 0);
  return code < 0 ? 0 : code > 3 ? 3 : code;
}

// cpu::f32_to_e4m3: round to nearest even, saturating to ±448, NaN to 0x7f.
__device__ __forceinline__ uint8_t f32_to_e4m3(float x) {
  if (isnan(x)) return 0x7f;
  const uint8_t sign = signbit(x) ? 0x80 : 0;
  const float a = fabsf(x);
  if (a >= 448.f) return sign | 0x7e;
  if (a < 0x1p-6f) return uint8_t(sign | uint8_t(rintf(__fmul_rn(a, 0x1p9f))));
  int exponent = 0;
  const float fraction = frexpf(a, &exponent);
  int32_t biased = exponent - 1 + 7;
  int32_t mantissa = int32_t(rintf(__fmul_rn(__fsub_rn(__fmul_rn(2.f, fraction), 1.f), 8.f)));
  if (mantissa == 8) {
    mantissa = 0;
    ++biased;
  }
  if (biased > 15 || (biased == 15 && mantissa == 7)) return sign | 0x7e;
  return uint8_t(sign | (biased << 3) | mantissa);
}

// e4m3 code to float (exact; codes never hold the NaN the encoder saturates away from).
__device__ __forceinline__ float e4m3_to_f32(uint32_t code) {
  const float sign = (code & 0x80) ? -1.f : 1.f;
  const int32_t exponent = (code >> 3) & 0xf, mantissa = code & 7;
  if (exponent == 0) return sign * ldexpf(float(mantissa), -9);
  return sign * ldexpf(1.f + float(mantissa) * 0.125f, exponent - 7);
}

// cpu::hadamard_rotate's sign of element i.
__device__ __forceinline__ bool hadamard_flips(int32_t i) { return (0x9e3779b97f4a7c15ull >> (i % 64)) & 1; }

}  // namespace pagoda::cuda::kernels

// The number formats of the quantized KV cache (core/quantized_paged_kv.h) and of the operands
// attention quantizes on the fly, as scalar reference code:
//   int2: asymmetric 2-bit codes with a min and a scale per partition, stochastic rounding from a
//         counter-based generator keyed by where the element is, so that the same token at the
//         same position quantizes the same however it was batched, cached or recomputed;
//   uint8: asymmetric 8-bit codes of a query partition or of a partition of softmax numerators
//          (round to nearest: these are transient, and exact zeros must stay exact);
//   e4m3: fp8 with 4 exponent bits, 3 mantissa bits, bias 7, no infinities, saturating at 448.
#pragma once

#include <cstdint>

#include "pagoda/core/half.h"

namespace pagoda::cpu {

// A uniform draw in [0, 1) for element `index` of stream `stream` (splitmix64 of the pair).
float stochastic_uniform(uint64_t stream, uint64_t index);

// The stream of layer `layer`, K (0) or V (1), kv head `head`, under `seed`.
uint64_t kv_stream(uint64_t seed, int32_t layer, int32_t kind, int32_t head);

// Quantizes n values x[i * stride] to 2-bit codes: min and scale are rounded to f16 first and the
// codes are of the rounded pair, so min + scale * code is what attention reconstructs. Stochastic:
// element i rounds up with probability frac((x - min) / scale), drawn as stochastic_uniform(stream,
// index0 + i * index_stride): unbiased, but its error variance is up to three times nearest
// rounding's. Otherwise to the nearest code (halves down). Returns the sum of the codes.
struct Int2Params {
  f16 min;
  f16 scale;
};
int32_t quantize_int2(const float* x, int64_t stride, int32_t n, uint64_t stream, uint64_t index0,
                      uint64_t index_stride, uint8_t* codes, Int2Params& params, bool stochastic = true);

// Code i (0..3) of a packed run (4 codes a byte, code i in bits 2 (i % 4)).
inline uint8_t int2_code(const uint8_t* packed, int64_t i) { return (packed[i >> 2] >> ((i & 3) * 2)) & 3; }
void pack_int2(const uint8_t* codes, int32_t n, uint8_t* packed);

// Asymmetric 8-bit codes of n values (round to nearest): x ~ min + scale * code. Returns the sum
// of the codes. A constant run gets scale 0 and codes 0.
struct Uint8Params {
  float min = 0.f;
  float scale = 0.f;
};
int32_t quantize_uint8(const float* x, int32_t n, uint8_t* codes, Uint8Params& params);

float e4m3_to_f32(uint8_t code);
// Round to nearest even, saturating to ±448; NaN becomes the e4m3 NaN.
uint8_t f32_to_e4m3(float x);

}  // namespace pagoda::cpu

// Bit-exact agreement with ggml's reference quantizers and gguf-py needs each `a * b + c` rounded
// twice, as they do: no fused multiply-add (see dequantize.cpp).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "pagoda/format/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "pagoda/core/error.h"
#include "pagoda/core/half.h"

namespace pagoda {
namespace {

void store_f16(uint8_t* p, float x) {
  const uint16_t h = f32_to_f16(x);
  p[0] = uint8_t(h);
  p[1] = uint8_t(h >> 8);
}

float round_trip_f16(float x) { return f16_to_f32(f32_to_f16(x)); }

// Round half to even, as ggml's nearest_int (the K-quants' rounding).
int nearest_int(float x) { return int(std::nearbyint(x)); }

// The value of largest magnitude, sign kept; the first one on ties (ggml's loop and numpy's argmax).
float signed_absmax(const float* x, int n) {
  float amax = 0.f, max = 0.f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void min_max(const float* x, int n, float& min, float& max) {
  min = x[0];
  max = x[0];
  for (int j = 1; j < n; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
}

// Block sizes in bytes, as in dequantize.cpp's layouts.
constexpr int kQ8_0Bytes = 34, kQ4_0Bytes = 18, kQ4_1Bytes = 20, kQ5_0Bytes = 22, kQ5_1Bytes = 24;
constexpr int kQ4_KBytes = 144, kQ5_KBytes = 176, kQ6_KBytes = 210;

void block_q8_0(const float* x, uint8_t* y) {
  float amax = 0.f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  store_f16(y, d);
  for (int j = 0; j < 32; ++j) y[2 + j] = uint8_t(int8_t(std::round(x[j] * id)));
}

// Q4_0 and Q5_0: symmetric, the largest magnitude maps to the lowest level (-8 or -16).
void block_q4_0(const float* x, uint8_t* y) {
  const float d = signed_absmax(x, 32) / -8.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  store_f16(y, d);
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(15, int(int8_t(x[j] * id + 8.5f)));
    const int hi = std::min(15, int(int8_t(x[j + 16] * id + 8.5f)));
    y[2 + j] = uint8_t(lo | hi << 4);
  }
}

void block_q5_0(const float* x, uint8_t* y) {
  const float d = signed_absmax(x, 32) / -16.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  store_f16(y, d);
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(31, int(int8_t(x[j] * id + 16.5f)));
    const int hi = std::min(31, int(int8_t(x[j + 16] * id + 16.5f)));
    y[6 + j] = uint8_t((lo & 0xf) | (hi & 0xf) << 4);
    qh |= uint32_t(lo >> 4) << j | uint32_t(hi >> 4) << (j + 16);
  }
  for (int b = 0; b < 4; ++b) y[2 + b] = uint8_t(qh >> (8 * b));
}

// Q4_1 and Q5_1: minimum and step, the range split into 15 or 31 steps.
void block_q4_1(const float* x, uint8_t* y) {
  float min, max;
  min_max(x, 32, min, max);
  const float d = (max - min) / 15.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  store_f16(y, d);
  store_f16(y + 2, min);
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(15, int(int8_t((x[j] - min) * id + 0.5f)));
    const int hi = std::min(15, int(int8_t((x[j + 16] - min) * id + 0.5f)));
    y[4 + j] = uint8_t(lo | hi << 4);
  }
}

void block_q5_1(const float* x, uint8_t* y) {
  float min, max;
  min_max(x, 32, min, max);
  const float d = (max - min) / 31.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  store_f16(y, d);
  store_f16(y + 2, min);
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(31, int(int8_t((x[j] - min) * id + 0.5f)));
    const int hi = std::min(31, int(int8_t((x[j + 16] - min) * id + 0.5f)));
    y[8 + j] = uint8_t((lo & 0xf) | (hi & 0xf) << 4);
    qh |= uint32_t(lo >> 4) << j | uint32_t(hi >> 4) << (j + 16);
  }
  for (int b = 0; b < 4; ++b) y[4 + b] = uint8_t(qh >> (8 * b));
}

// Q4_K and Q5_K share their scales: per sub-block of 32, a step (range / levels) and a minimum
// (minus the smallest value, at least 0), each quantized to 6 bits against the super-block's d and
// dmin, packed into 12 bytes (the inverse of dequantize.cpp's q4_k_scale_min). Writes the 16-byte
// head (d, dmin, scales) and the level of every weight in 0..levels.
void k_quant_scales(const float* x, int levels, uint8_t* head, uint8_t* level) {
  float step[8], minimum[8];
  float max_step = 0.f, max_minimum = 0.f;
  for (int j = 0; j < 8; ++j) {
    float lo, hi;
    min_max(x + 32 * j, 32, lo, hi);
    lo = std::min(lo, 0.f);
    step[j] = (hi - lo) / float(levels);
    minimum[j] = -lo;
    max_step = std::max(max_step, step[j]);
    max_minimum = std::max(max_minimum, minimum[j]);
  }
  const float inv_step = max_step > 0.f ? 63.f / max_step : 0.f;
  const float inv_minimum = max_minimum > 0.f ? 63.f / max_minimum : 0.f;
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    ls[j] = uint8_t(std::min(63, nearest_int(inv_step * step[j])));
    lm[j] = uint8_t(std::min(63, nearest_int(inv_minimum * minimum[j])));
  }
  store_f16(head, max_step / 63.f);
  store_f16(head + 2, max_minimum / 63.f);
  uint8_t* scales = head + 4;
  std::memset(scales, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      scales[j] = ls[j];
      scales[j + 4] = lm[j];
    } else {
      scales[j + 4] = uint8_t((ls[j] & 0xf) | (lm[j] & 0xf) << 4);
      scales[j - 4] |= uint8_t((ls[j] >> 4) << 6);
      scales[j] |= uint8_t((lm[j] >> 4) << 6);
    }
  }
  // The weights are quantized against the scales as the reader will see them (through f16).
  const float d = round_trip_f16(max_step / 63.f), dmin = round_trip_f16(max_minimum / 63.f);
  for (int j = 0; j < 8; ++j) {
    const float dl = d * float(ls[j]), ml = dmin * float(lm[j]);
    for (int l = 0; l < 32; ++l) {
      const int q = dl != 0.f ? nearest_int((x[32 * j + l] + ml) / dl) : 0;
      level[32 * j + l] = uint8_t(std::clamp(q, 0, levels));
    }
  }
}

void block_q4_k(const float* x, uint8_t* y) {
  uint8_t level[256];
  k_quant_scales(x, 15, y, level);
  uint8_t* qs = y + 16;
  for (int chunk = 0; chunk < 4; ++chunk)
    for (int l = 0; l < 32; ++l) qs[32 * chunk + l] = uint8_t(level[64 * chunk + l] | level[64 * chunk + 32 + l] << 4);
}

void block_q5_k(const float* x, uint8_t* y) {
  uint8_t level[256];
  k_quant_scales(x, 31, y, level);
  uint8_t* qh = y + 16;
  uint8_t* qs = y + 48;
  std::memset(qh, 0, 32);
  for (int chunk = 0; chunk < 4; ++chunk) {
    for (int l = 0; l < 32; ++l) {
      const int lo = level[64 * chunk + l], hi = level[64 * chunk + 32 + l];
      qs[32 * chunk + l] = uint8_t((lo & 0xf) | (hi & 0xf) << 4);
      qh[l] |= uint8_t((lo >> 4) << (2 * chunk) | (hi >> 4) << (2 * chunk + 1));
    }
  }
}

// Q6_K: per sub-block of 16 a signed step (its largest magnitude maps to level -32), the steps
// quantized to int8 against the super-block's d.
void block_q6_k(const float* x, uint8_t* y) {
  float step[16];
  float max_step = 0.f;
  for (int j = 0; j < 16; ++j) {
    step[j] = signed_absmax(x + 16 * j, 16) / -32.f;
    if (std::fabs(step[j]) > std::fabs(max_step)) max_step = step[j];
  }
  uint8_t* ql = y;
  uint8_t* qh = y + 128;
  int8_t* scales = reinterpret_cast<int8_t*>(y + 192);
  const float inv = max_step != 0.f ? -128.f / max_step : 0.f;
  store_f16(y + 208, max_step != 0.f ? 1.f / inv : 0.f);
  const float d = round_trip_f16(max_step != 0.f ? 1.f / inv : 0.f);
  int8_t level[256];
  for (int j = 0; j < 16; ++j) {
    scales[j] = int8_t(std::clamp(nearest_int(inv * step[j]), -128, 127));
    const float dl = d * float(scales[j]);
    for (int l = 0; l < 16; ++l) {
      const int q = dl != 0.f ? nearest_int(x[16 * j + l] / dl) : 0;
      level[16 * j + l] = int8_t(std::clamp(q, -32, 31));
    }
  }
  std::memset(qh, 0, 64);
  for (int half = 0; half < 2; ++half) {
    const int8_t* q = level + 128 * half;
    for (int l = 0; l < 32; ++l) {
      const int q1 = q[l] + 32, q2 = q[l + 32] + 32, q3 = q[l + 64] + 32, q4 = q[l + 96] + 32;
      ql[64 * half + l] = uint8_t((q1 & 0xf) | (q3 & 0xf) << 4);
      ql[64 * half + l + 32] = uint8_t((q2 & 0xf) | (q4 & 0xf) << 4);
      qh[32 * half + l] = uint8_t((q1 >> 4) | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6);
    }
  }
}

template <int kBlockSize, int kBlockBytes, void (*kQuantizeBlock)(const float*, uint8_t*)>
void quantize_blocks(const float* src, void* dst, int64_t n) {
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kBlockSize; ++i) kQuantizeBlock(src + i * kBlockSize, out + i * kBlockBytes);
}

}  // namespace

bool can_quantize(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: case GgmlType::kF16: case GgmlType::kBF16: case GgmlType::kQ8_0:
    case GgmlType::kQ4_0: case GgmlType::kQ4_1: case GgmlType::kQ5_0: case GgmlType::kQ5_1:
    case GgmlType::kQ4_K: case GgmlType::kQ5_K: case GgmlType::kQ6_K:
      return true;
    default:
      return false;
  }
}

void quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
  const GgmlTypeTraits traits = ggml_type_traits(uint32_t(type));
  if (!can_quantize(type))
    fail(ErrorKind::kUnsupported,
         "cannot quantize to {}: pagoda writes f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k and q6_k",
         traits.name);
  if (n < 0 || n % traits.block_size != 0)
    fail(ErrorKind::kInvalidArgument, "cannot quantize {} values to {}: not a multiple of its block size {}", n,
         traits.name, traits.block_size);
  uint8_t* out = static_cast<uint8_t*>(dst);
  switch (type) {
    case GgmlType::kF32: std::memcpy(dst, src, size_t(n) * sizeof(float)); return;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) store_f16(out + 2 * i, src[i]);
      return;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t b = f32_to_bf16(src[i]);
        out[2 * i] = uint8_t(b);
        out[2 * i + 1] = uint8_t(b >> 8);
      }
      return;
    case GgmlType::kQ8_0: return quantize_blocks<32, kQ8_0Bytes, block_q8_0>(src, dst, n);
    case GgmlType::kQ4_0: return quantize_blocks<32, kQ4_0Bytes, block_q4_0>(src, dst, n);
    case GgmlType::kQ4_1: return quantize_blocks<32, kQ4_1Bytes, block_q4_1>(src, dst, n);
    case GgmlType::kQ5_0: return quantize_blocks<32, kQ5_0Bytes, block_q5_0>(src, dst, n);
    case GgmlType::kQ5_1: return quantize_blocks<32, kQ5_1Bytes, block_q5_1>(src, dst, n);
    case GgmlType::kQ4_K: return quantize_blocks<256, kQ4_KBytes, block_q4_k>(src, dst, n);
    case GgmlType::kQ5_K: return quantize_blocks<256, kQ5_KBytes, block_q5_k>(src, dst, n);
    case GgmlType::kQ6_K: return quantize_blocks<256, kQ6_KBytes, block_q6_k>(src, dst, n);
    default: fail(ErrorKind::kInternal, "ggml type {} is marked quantizable but has no quantizer", traits.name);
  }
}

}  // namespace pagoda

// Bit-exact agreement with ggml and gguf-py needs each `a * b + c` rounded twice, as they do.
// GCC contracts it into one fused multiply-add by default (-ffp-contract=fast, and the x86-64-v3
// floor has FMA), clang within an expression; both would change the last bit. The pragma comes
// before the includes so inline helpers (f16_to_f32) get the same options: GCC does not inline
// across differing optimize options.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "pagoda/format/dequantize.h"

#include <bit>
#include <cstring>

#include "pagoda/core/error.h"
#include "pagoda/core/half.h"

namespace pagoda {
namespace {

// Block layouts as stored in GGUF (little-endian, packed). Byte arrays only, so a block can sit
// at any address: tensor data are 32-byte aligned but a fuzzer's or caller's buffer may not be.
struct BlockQ4_0 {
  uint8_t d[2];    // fp16 scale
  uint8_t qs[16];  // 32 x 4-bit: element j in the low nibble of qs[j], j + 16 in the high one
};
struct BlockQ4_1 {
  uint8_t d[2];  // fp16 scale
  uint8_t m[2];  // fp16 minimum
  uint8_t qs[16];
};
struct BlockQ5_0 {
  uint8_t d[2];
  uint8_t qh[4];  // bit j is the fifth bit of element j (u32, little-endian)
  uint8_t qs[16];
};
struct BlockQ5_1 {
  uint8_t d[2];
  uint8_t m[2];
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ8_0 {
  uint8_t d[2];
  int8_t qs[32];
};
// 256 weights in 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit minimum packed into 12
// bytes; the fp16 super-block scales d and dmin multiply them.
struct BlockQ4_K {
  uint8_t d[2];
  uint8_t dmin[2];
  uint8_t scales[12];
  uint8_t qs[128];  // per 64 weights: 32 bytes, low nibbles = first 32, high nibbles = next 32
};
// Q4_K's layout plus a fifth bit per weight: bit 2c of qh[l] for weight l of the chunk's first
// 32, bit 2c + 1 for weight l of its second 32 (chunk c of 64 weights).
struct BlockQ5_K {
  uint8_t d[2];
  uint8_t dmin[2];
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
// 256 weights in 16 sub-blocks of 16 with int8 scales; 6-bit quants split into 4 low bits (ql)
// and 2 high bits (qh).
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint8_t d[2];
};
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);

float load_f16(const uint8_t* p) { return f16_to_f32(uint16_t(p[0] | (p[1] << 8))); }

// The same exact conversion as f16_to_f32, without its renormalising loop, so that whole f16
// tensors vectorize: move exponent and mantissa into place and rebias the exponent; inf/nan get
// the rest of the fp32 bias; subnormals become 1.m x 2^-14 and subtracting 2^-14 leaves m x 2^-24
// exactly (F. Giesen's method). Kept here, not in core/half.h: only this loop needs the speed.
float f16_to_f32_branchless(uint16_t h) {
  constexpr uint32_t kExponent = 0x7c00u << 13;
  uint32_t bits = uint32_t(h & 0x7fff) << 13;
  const uint32_t exponent = bits & kExponent;
  bits += (127 - 15) << 23;
  if (exponent == kExponent) bits += (128 - 16) << 23;
  // Both results are computed and one selected by bits (a blend once vectorized); a nan must
  // never pass through the subtraction, which would quiet a signalling one.
  const float renormalized =
      std::bit_cast<float>(bits + (1u << 23)) - std::bit_cast<float>(113u << 23);
  bits = exponent == 0 ? std::bit_cast<uint32_t>(renormalized) : bits;
  return std::bit_cast<float>(bits | uint32_t(h & 0x8000) << 16);
}

uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

void block_q4_0(const BlockQ4_0& b, float* y) {
  const float d = load_f16(b.d);
  // Two passes (low nibbles, then high) rather than one interleaved: each vectorizes fully.
  for (int j = 0; j < 16; ++j) y[j] = float((b.qs[j] & 0xf) - 8) * d;
  for (int j = 0; j < 16; ++j) y[j + 16] = float((b.qs[j] >> 4) - 8) * d;
}

void block_q4_1(const BlockQ4_1& b, float* y) {
  const float d = load_f16(b.d);
  const float m = load_f16(b.m);
  for (int j = 0; j < 16; ++j) y[j] = float(b.qs[j] & 0xf) * d + m;
  for (int j = 0; j < 16; ++j) y[j + 16] = float(b.qs[j] >> 4) * d + m;
}

void block_q5_0(const BlockQ5_0& b, float* y) {
  const float d = load_f16(b.d);
  const uint32_t qh = load_u32(b.qh);
  for (int j = 0; j < 16; ++j) {
    const int lo = (b.qs[j] & 0xf) | ((qh >> j) & 1) << 4;
    const int hi = (b.qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
    y[j] = float(lo - 16) * d;
    y[j + 16] = float(hi - 16) * d;
  }
}

void block_q5_1(const BlockQ5_1& b, float* y) {
  const float d = load_f16(b.d);
  const float m = load_f16(b.m);
  const uint32_t qh = load_u32(b.qh);
  for (int j = 0; j < 16; ++j) {
    const int lo = (b.qs[j] & 0xf) | ((qh >> j) & 1) << 4;
    const int hi = (b.qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
    y[j] = float(lo) * d + m;
    y[j + 16] = float(hi) * d + m;
  }
}

void block_q8_0(const BlockQ8_0& b, float* y) {
  const float d = load_f16(b.d);
  for (int j = 0; j < 32; ++j) y[j] = float(b.qs[j]) * d;
}

// Scale and minimum of sub-block i (0..7): the first four keep 6 bits in bytes 0..7; the last
// four keep their low 4 bits in bytes 8..11 and their top 2 bits in the spare top bits of 0..7.
void q4_k_scale_min(const uint8_t* s, int i, int& scale, int& min) {
  if (i < 4) {
    scale = s[i] & 63;
    min = s[i + 4] & 63;
  } else {
    scale = (s[i + 4] & 0xf) | (s[i - 4] >> 6) << 4;
    min = (s[i + 4] >> 4) | (s[i] >> 6) << 4;
  }
}

void block_q4_k(const BlockQ4_K& b, float* y) {
  const float d = load_f16(b.d);
  const float dmin = load_f16(b.dmin);
  for (int chunk = 0; chunk < 4; ++chunk) {  // 64 weights: sub-blocks 2*chunk and 2*chunk + 1
    const uint8_t* q = b.qs + 32 * chunk;
    int scale, min;
    q4_k_scale_min(b.scales, 2 * chunk, scale, min);
    const float d_lo = d * float(scale), m_lo = dmin * float(min);
    q4_k_scale_min(b.scales, 2 * chunk + 1, scale, min);
    const float d_hi = d * float(scale), m_hi = dmin * float(min);
    for (int l = 0; l < 32; ++l) y[l] = d_lo * float(q[l] & 0xf) - m_lo;
    for (int l = 0; l < 32; ++l) y[32 + l] = d_hi * float(q[l] >> 4) - m_hi;
    y += 64;
  }
}

void block_q5_k(const BlockQ5_K& b, float* y) {
  const float d = load_f16(b.d);
  const float dmin = load_f16(b.dmin);
  for (int chunk = 0; chunk < 4; ++chunk) {
    const uint8_t* q = b.qs + 32 * chunk;
    int scale, min;
    q4_k_scale_min(b.scales, 2 * chunk, scale, min);
    const float d_lo = d * float(scale), m_lo = dmin * float(min);
    q4_k_scale_min(b.scales, 2 * chunk + 1, scale, min);
    const float d_hi = d * float(scale), m_hi = dmin * float(min);
    for (int l = 0; l < 32; ++l) y[l] = d_lo * float((q[l] & 0xf) | ((b.qh[l] >> (2 * chunk)) & 1) << 4) - m_lo;
    for (int l = 0; l < 32; ++l) y[32 + l] = d_hi * float((q[l] >> 4) | ((b.qh[l] >> (2 * chunk + 1)) & 1) << 4) - m_hi;
    y += 64;
  }
}

void block_q6_k(const BlockQ6_K& b, float* y) {
  const float d = load_f16(b.d);
  for (int half = 0; half < 2; ++half) {  // 128 weights from 64 ql bytes and 32 qh bytes
    const uint8_t* ql = b.ql + 64 * half;
    const uint8_t* qh = b.qh + 32 * half;
    const int8_t* sc = b.scales + 8 * half;
    for (int l = 0; l < 32; ++l) {
      const int s = l / 16;
      const int q1 = ((ql[l] & 0xf) | ((qh[l] >> 0) & 3) << 4) - 32;
      const int q2 = ((ql[l + 32] & 0xf) | ((qh[l] >> 2) & 3) << 4) - 32;
      const int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
      const int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
      y[l] = d * float(sc[s]) * float(q1);
      y[l + 32] = d * float(sc[s + 2]) * float(q2);
      y[l + 64] = d * float(sc[s + 4]) * float(q3);
      y[l + 96] = d * float(sc[s + 6]) * float(q4);
    }
    y += 128;
  }
}

// The block function is a template argument so it inlines into the loop.
template <typename Block, int kBlockSize, void (*kDequantizeBlock)(const Block&, float*)>
void dequantize_blocks(const void* src, float* dst, int64_t n) {
  const Block* blocks = static_cast<const Block*>(src);
  for (int64_t i = 0; i < n / kBlockSize; ++i) kDequantizeBlock(blocks[i], dst + i * kBlockSize);
}

}  // namespace

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  const GgmlTypeTraits traits = ggml_type_traits(uint32_t(type));
  if (!traits.can_dequantize) {
    fail(ErrorKind::kUnsupported,
         "cannot dequantize tensor type {} ({}): pagoda dequantizes "
         "f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k and q6_k",
         traits.name, uint32_t(type));
  }
  if (n < 0 || n % traits.block_size != 0) {
    fail(ErrorKind::kInvalidArgument,
         "cannot dequantize {} elements of type {}: not a multiple "
         "of its block size {}",
         n, traits.name, traits.block_size);
  }
  const uint8_t* bytes = static_cast<const uint8_t*>(src);
  switch (type) {
    case GgmlType::kF32: std::memcpy(dst, src, size_t(n) * sizeof(float)); return;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);  // little-endian host, as the GGUF reader assumes
        dst[i] = f16_to_f32_branchless(h);
      }
      return;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        dst[i] = bf16_to_f32(uint16_t(bytes[2 * i] | bytes[2 * i + 1] << 8));
      }
      return;
    case GgmlType::kQ4_0: return dequantize_blocks<BlockQ4_0, 32, block_q4_0>(src, dst, n);
    case GgmlType::kQ4_1: return dequantize_blocks<BlockQ4_1, 32, block_q4_1>(src, dst, n);
    case GgmlType::kQ5_0: return dequantize_blocks<BlockQ5_0, 32, block_q5_0>(src, dst, n);
    case GgmlType::kQ5_1: return dequantize_blocks<BlockQ5_1, 32, block_q5_1>(src, dst, n);
    case GgmlType::kQ8_0: return dequantize_blocks<BlockQ8_0, 32, block_q8_0>(src, dst, n);
    case GgmlType::kQ4_K: return dequantize_blocks<BlockQ4_K, 256, block_q4_k>(src, dst, n);
    case GgmlType::kQ5_K: return dequantize_blocks<BlockQ5_K, 256, block_q5_k>(src, dst, n);
    case GgmlType::kQ6_K: return dequantize_blocks<BlockQ6_K, 256, block_q6_k>(src, dst, n);
    default:
      fail(ErrorKind::kInternal, "ggml type {} is marked dequantizable but has no dequantizer",
           traits.name);
  }
}

}  // namespace pagoda

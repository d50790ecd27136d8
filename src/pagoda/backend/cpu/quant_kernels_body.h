// The quantized GEMM/GEMV kernels, written once against AVX2 integer ops and compiled per
// instruction set: the including file defines PAGODA_QUANT_ISA (the namespace that keeps each
// compilation's inline functions apart, so the linker never merges an AVX-512 copy into the AVX2
// path) and, for AVX-512 VNNI, PAGODA_QUANT_VNNI. Only intrinsics and plain C++ here: no
// standard-library templates, whose instantiations would be shared between the compilations.
//
// Layout: a weight row is the GGUF file's blocks, unchanged. Each 32-weight group is unpacked in
// registers to 32 bytes in element order (unsigned quants, or signed ones for q8_0 and q6_k),
// multiplied with the row's int8 activations in one integer dot product per 32 weights
// (vpdpbusd, or vpmaddubsw + vpmaddwd on AVX2), converted to f32 and scaled by the weight and
// activation scales; formats with a minimum or an offset add it per block from the activation
// block sums (see quant_kernels.h).
//
// Work: a tile of R activation rows x C weight rows shares each unpacked weight group among R
// rows and each activation load among C weight rows. Per 32 weights it reads the weight block's
// bytes (e.g. 20 for q4_1) once and does 32 multiply-adds per activation row.

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "pagoda/backend/cpu/quant_kernels.h"

namespace pagoda::cpu::PAGODA_QUANT_ISA {

inline float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Sum over each group of 4 bytes of u (unsigned) * s (signed), as 8 int32 lanes. The AVX2 form's
// 16-bit intermediate (two products) cannot saturate: |u| <= 128 and |s| <= 127 give <= 32512.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
#ifdef PAGODA_QUANT_VNNI
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// 16 bytes of packed nibbles -> 32 bytes: the low nibbles (elements 0..15), then the high ones.
inline __m256i nibbles16(const uint8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0x0f));
}

// 32 bits (bit j for element j) -> 0x10 in the bytes whose bit is set: the fifth bit of q5_0/q5_1.
inline __m256i fifth_bits(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(int(bits)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201);
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

// The 6-bit scale and minimum of K-quant sub-block i (0..7) from the 12 packed bytes.
inline void k_scale_min(const uint8_t* s, int i, int& scale, int& min) {
  if (i < 4) {
    scale = s[i] & 63;
    min = s[i + 4] & 63;
  } else {
    scale = (s[i + 4] & 0xf) | (s[i - 4] >> 6) << 4;
    min = (s[i + 4] >> 4) | (s[i] >> 6) << 4;
  }
}

// One format: its block, its per-group scales (d, and the constant term m for unsigned formats)
// and its 32-byte groups. kLaneScales: the scale differs between a group's two halves of 16
// (q6_k), so d holds one per half.
struct Q4_0 {
  static constexpr int kElements = 32, kBytes = 18, kGroups = 1;
  static constexpr bool kSigned = false, kLaneScales = false;
  static void scales(const uint8_t* b, float* d, float* m) { d[0] = f16(b), m[0] = -8.f * d[0]; }
  static __m256i quants(const uint8_t* b, int) { return nibbles16(b + 2); }
};
struct Q4_1 {
  static constexpr int kElements = 32, kBytes = 20, kGroups = 1;
  static constexpr bool kSigned = false, kLaneScales = false;
  static void scales(const uint8_t* b, float* d, float* m) { d[0] = f16(b), m[0] = f16(b + 2); }
  static __m256i quants(const uint8_t* b, int) { return nibbles16(b + 4); }
};
struct Q5_0 {
  static constexpr int kElements = 32, kBytes = 22, kGroups = 1;
  static constexpr bool kSigned = false, kLaneScales = false;
  static void scales(const uint8_t* b, float* d, float* m) { d[0] = f16(b), m[0] = -16.f * d[0]; }
  static __m256i quants(const uint8_t* b, int) { return _mm256_or_si256(nibbles16(b + 6), fifth_bits(b + 2)); }
};
struct Q5_1 {
  static constexpr int kElements = 32, kBytes = 24, kGroups = 1;
  static constexpr bool kSigned = false, kLaneScales = false;
  static void scales(const uint8_t* b, float* d, float* m) { d[0] = f16(b), m[0] = f16(b + 2); }
  static __m256i quants(const uint8_t* b, int) { return _mm256_or_si256(nibbles16(b + 8), fifth_bits(b + 4)); }
};
struct Q8_0 {
  static constexpr int kElements = 32, kBytes = 34, kGroups = 1;
  static constexpr bool kSigned = true, kLaneScales = false;
  static void scales(const uint8_t* b, float* d, float*) { d[0] = f16(b); }
  static __m256i quants(const uint8_t* b, int) { return load32(b + 2); }
};
// Q4_K: d, dmin, 12 scale bytes, then per 64 weights 32 bytes whose low nibbles are group 2c and
// high nibbles group 2c + 1.
struct Q4_K {
  static constexpr int kElements = 256, kBytes = 144, kGroups = 8;
  static constexpr bool kSigned = false, kLaneScales = false;
  static void scales(const uint8_t* b, float* d, float* m) {
    const float dd = f16(b), dmin = f16(b + 2);
    for (int i = 0; i < 8; ++i) {
      int scale, min;
      k_scale_min(b + 4, i, scale, min);
      d[i] = dd * float(scale);
      m[i] = -dmin * float(min);
    }
  }
  static __m256i quants(const uint8_t* b, int g) {
    const __m256i q = load32(b + 16 + 32 * (g / 2));
    return _mm256_and_si256(g % 2 ? _mm256_srli_epi16(q, 4) : q, _mm256_set1_epi8(0x0f));
  }
};
// Q5_K: Q4_K plus 32 bytes qh after the scales: bit g of qh[l] is the fifth bit of element l of
// group g.
struct Q5_K {
  static constexpr int kElements = 256, kBytes = 176, kGroups = 8;
  static constexpr bool kSigned = false, kLaneScales = false;
  static void scales(const uint8_t* b, float* d, float* m) { Q4_K::scales(b, d, m); }
  static __m256i quants(const uint8_t* b, int g) {
    const __m256i q = load32(b + 48 + 32 * (g / 2));
    const __m256i low = _mm256_and_si256(g % 2 ? _mm256_srli_epi16(q, 4) : q, _mm256_set1_epi8(0x0f));
    const __m256i high = _mm256_srl_epi16(load32(b + 16), _mm_cvtsi32_si128(g));
    return _mm256_or_si256(low, _mm256_and_si256(_mm256_slli_epi16(high, 4), _mm256_set1_epi8(0x10)));
  }
};
// Q6_K: ql[128], qh[64], 16 int8 scales, d. Per 128 weights (half h): 64 ql bytes and 32 qh
// bytes; group 4h + j takes the low (j = 0, 1) or high (j = 2, 3) nibbles of ql bytes [0, 32)
// (j even) or [32, 64) (j odd), and bits 2j, 2j + 1 of qh; its halves of 16 have scales 8h + 2j
// and 8h + 2j + 1. Quants are 6-bit minus 32: signed.
struct Q6_K {
  static constexpr int kElements = 256, kBytes = 210, kGroups = 8;
  static constexpr bool kSigned = true, kLaneScales = true;
  static void scales(const uint8_t* b, float* d, float*) {
    const float dd = f16(b + 208);
    for (int i = 0; i < 16; ++i) d[i] = dd * float(int8_t(b[192 + i]));
  }
  static __m256i quants(const uint8_t* b, int g) {
    const int h = g / 4, j = g % 4;
    const __m256i ql = load32(b + 64 * h + 32 * (j % 2));
    const __m256i qh = load32(b + 128 + 32 * h);
    const __m256i low = _mm256_and_si256(j < 2 ? ql : _mm256_srli_epi16(ql, 4), _mm256_set1_epi8(0x0f));
    const __m256i high = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j)), _mm256_set1_epi8(0x03));
    return _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)), _mm256_set1_epi8(32));
  }
};

// R activation rows [r0, r0 + R) x C weight rows [j0, j0 + C).
template <class F, int R, int C>
inline void tile(const uint8_t* w, size_t w_row_bytes, int64_t j0, const Q8Rows& x, int64_t r0, float* out,
                 int64_t out_stride) {
  constexpr int kScales = F::kLaneScales ? 2 * F::kGroups : F::kGroups;
  const int64_t blocks = x.k / F::kElements, groups_per_row = x.k / 32;
  __m256 acc[R][C];
  float constant[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps(), constant[r][c] = 0.f;
  const uint8_t* rows[C];
  for (int c = 0; c < C; ++c) rows[c] = w + size_t(j0 + c) * w_row_bytes;
  for (int64_t bi = 0; bi < blocks; ++bi) {
    float d[C][kScales], m[C][F::kGroups];
    for (int c = 0; c < C; ++c) F::scales(rows[c] + bi * F::kBytes, d[c], m[c]);
    for (int g = 0; g < F::kGroups; ++g) {
      const int64_t group = bi * F::kGroups + g;
      __m256i q[C], magnitude[C];
      // The weight scales broadcast once per group and the activation scale once per row, so
      // that d_w * d_x is one vector multiply per (row, column) rather than a scalar multiply
      // and a broadcast (a shuffle-port op); the product's bits are the same.
      __m256 dw[C];
      for (int c = 0; c < C; ++c) {
        q[c] = F::quants(rows[c] + bi * F::kBytes, g);
        if constexpr (F::kSigned) magnitude[c] = _mm256_abs_epi8(q[c]);
        if constexpr (F::kLaneScales) dw[c] = _mm256_set_m128(_mm_set1_ps(d[c][2 * g + 1]), _mm_set1_ps(d[c][2 * g]));
        else dw[c] = _mm256_set1_ps(d[c][g]);
      }
      for (int r = 0; r < R; ++r) {
        const int64_t xg = (r0 + r) * groups_per_row + group;
        const __m256i xq = load32(reinterpret_cast<const uint8_t*>(x.q) + xg * 32);
        const __m256 xd = _mm256_broadcast_ss(x.d + xg);
        for (int c = 0; c < C; ++c) {
          __m256i dot;
          if constexpr (F::kSigned) dot = dot_u8s8(magnitude[c], _mm256_sign_epi8(xq, q[c]));
          else dot = dot_u8s8(q[c], xq);
          acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(dw[c], xd), acc[r][c]);
          // An explicit fma: left to the compiler, the product is fused in some tile shapes and
          // not in others, and a row's result would depend on how many rows share its tile.
          if constexpr (!F::kSigned) constant[r][c] = std::fma(m[c][g], x.s[xg], constant[r][c]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[(r0 + r) * out_stride + j0 + c] = hsum(acc[r][c]) + constant[r][c];
}

template <class F, int C>
inline void rows_tiles(const uint8_t* w, size_t w_row_bytes, int64_t j0, const Q8Rows& x, int64_t rows,
                       float* out, int64_t out_stride) {
  int64_t r0 = 0;
  for (; r0 + 4 <= rows; r0 += 4) tile<F, 4, C>(w, w_row_bytes, j0, x, r0, out, out_stride);
  switch (rows - r0) {
    case 3: tile<F, 3, C>(w, w_row_bytes, j0, x, r0, out, out_stride); break;
    case 2: tile<F, 2, C>(w, w_row_bytes, j0, x, r0, out, out_stride); break;
    case 1: tile<F, 1, C>(w, w_row_bytes, j0, x, r0, out, out_stride); break;
    default: break;
  }
}

template <class F>
void gemm(const uint8_t* w, size_t w_row_bytes, int64_t first, int64_t last, const Q8Rows& x, int64_t rows,
          float* out, int64_t out_stride) {
  int64_t j = first;
  for (; j + 2 <= last; j += 2) rows_tiles<F, 2>(w, w_row_bytes, j, x, rows, out, out_stride);
  if (j < last) rows_tiles<F, 1>(w, w_row_bytes, j, x, rows, out, out_stride);
}

inline void dispatch(DType type, const uint8_t* w, size_t w_row_bytes, int64_t first, int64_t last,
                     const Q8Rows& x, int64_t rows, float* out, int64_t out_stride) {
  switch (type) {
    case DType::kQ4_0: return gemm<Q4_0>(w, w_row_bytes, first, last, x, rows, out, out_stride);
    case DType::kQ4_1: return gemm<Q4_1>(w, w_row_bytes, first, last, x, rows, out, out_stride);
    case DType::kQ5_0: return gemm<Q5_0>(w, w_row_bytes, first, last, x, rows, out, out_stride);
    case DType::kQ5_1: return gemm<Q5_1>(w, w_row_bytes, first, last, x, rows, out, out_stride);
    case DType::kQ8_0: return gemm<Q8_0>(w, w_row_bytes, first, last, x, rows, out, out_stride);
    case DType::kQ4_K: return gemm<Q4_K>(w, w_row_bytes, first, last, x, rows, out, out_stride);
    case DType::kQ5_K: return gemm<Q5_K>(w, w_row_bytes, first, last, x, rows, out, out_stride);
    case DType::kQ6_K: return gemm<Q6_K>(w, w_row_bytes, first, last, x, rows, out, out_stride);
    default: return;  // quant_matmul.cpp checks the type before it calls
  }
}

}  // namespace pagoda::cpu::PAGODA_QUANT_ISA

// GGUF block-quantized weights on the GPU: how a warp stages a run of blocks into shared memory,
// and how one lane turns 32 consecutive weights (a "piece") of a staged run into fp32.
//
// A piece is one block of the 32-element types (q4_0, q4_1, q5_0, q5_1, q8_0) and one 32-weight
// sub-block of the 256-element k-quants (q4_k, q5_k, q6_k), so that every type gives each lane
// the same work: a chunk is 32 pieces (1024 weights) of one row, one per lane.
//
// Dequantization is bit-exact with format/dequantize.cpp (and so with ggml and gguf-py): the same
// fp32 operations in the same order, each rounded once. nvcc would contract `a * b + c` into one
// fused multiply-add, so the products and sums here are __fmul_rn / __fadd_rn / __fsub_rn, which
// it never contracts.
//
// Blocks are 18 to 210 bytes, so a block is rarely 16-byte aligned (and a row of q8_0, q5_0,
// q6_k ... may start anywhere but on an odd byte). A warp therefore copies the whole byte range of
// a chunk, widened to 16-byte boundaries, with 16-byte cp.async copies (coalesced, no register
// round trip, and several chunks can be in flight), and lanes read their piece from shared memory
// with aligned 32-bit loads and funnel shifts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "pagoda/backend/cuda/kernels/ptx.cuh"
#include "pagoda/core/dtype.h"

namespace pagoda::cuda::kernels {

constexpr int kPiece = 32;             // weights one lane dequantizes at a time
constexpr int kChunkPieces = 32;       // pieces of one chunk: one per lane
constexpr int kChunkWeights = kPiece * kChunkPieces;

// Bytes of the blocks that hold one chunk (32 small blocks, or 4 super-blocks).
__host__ __device__ constexpr int chunk_bytes(DType t) {
  return int(block_bytes(t)) * (block_elements(t) == 32 ? kChunkPieces : kChunkWeights / 256);
}
// Shared memory for one staged chunk: its bytes, up to 15 before it (the copy starts on a
// 16-byte boundary), up to 15 after (it ends on one) and 4 more that the 32-bit reads of the
// last bytes may touch; a multiple of 16.
__host__ __device__ constexpr int stage_bytes(DType t) { return (chunk_bytes(t) + 16 + 16 + 4 + 15) / 16 * 16; }

// Copies bytes [begin, end) of `src` (`total` bytes long, 16-byte aligned) into `stage` (16-byte
// aligned shared memory) from the 16-byte boundary at or below begin; returns where begin lands
// in `stage`. Every lane of the warp calls it. 16-byte vectors inside [0, total) go by cp.async
// (the caller commits and waits); the one vector that would run past `total` (the last of a
// matrix whose size is not a multiple of 16) is copied byte by byte, so nothing outside the
// tensor is read.
__device__ __forceinline__ int stage_chunk(const uint8_t* __restrict__ src, int64_t total, int64_t begin,
                                           int64_t end, uint8_t* stage, int lane) {
  const int64_t first = begin & ~int64_t(15);
  const int vectors = int((end - first + 15) / 16);
  for (int v = lane; v < vectors; v += 32) {
    const int64_t at = first + 16 * int64_t(v);
    if (at + 16 <= total) {
      ptx::cp_async_16(ptx::smem_address(stage + 16 * v), src + at, 16);
    } else {
      for (int64_t b = at; b < total; ++b) stage[16 * v + (b - at)] = src[b];
    }
  }
  return int(begin - first);
}

// The 4 bytes at p (any alignment) as a little-endian word, from 4-byte aligned shared memory
// words (the staged buffer's slack covers the second word).
__device__ __forceinline__ uint32_t word_at(const uint8_t* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  const uint32_t* aligned = reinterpret_cast<const uint32_t*>(address & ~uintptr_t(3));
  const uint32_t shift = uint32_t(address & 3) * 8;
  return shift == 0 ? aligned[0] : __funnelshift_r(aligned[0], aligned[1], shift);
}

// kWords words of bytes p[0 .. 4 kWords).
template <int kWords>
__device__ __forceinline__ void words_at(const uint8_t* p, uint32_t (&w)[kWords]) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  const uint32_t* aligned = reinterpret_cast<const uint32_t*>(address & ~uintptr_t(3));
  const uint32_t shift = uint32_t(address & 3) * 8;
  uint32_t next = aligned[0];
#pragma unroll
  for (int i = 0; i < kWords; ++i) {
    const uint32_t current = next;
    next = aligned[i + 1];
    w[i] = shift == 0 ? current : __funnelshift_r(current, next, shift);
  }
}

__device__ __forceinline__ float f16_bits(uint32_t bits) { return __half2float(__ushort_as_half(uint16_t(bits))); }
__device__ __forceinline__ uint32_t byte_of(const uint32_t* w, int i) { return (w[i / 4] >> (8 * (i % 4))) & 0xffu; }

// Byte i (0..11, known only at run time) of the 12 packed scale bytes, by selects: an index
// into a register array that the compiler cannot resolve would spill it to local memory.
__device__ __forceinline__ uint32_t scale_byte(const uint32_t (&s)[3], int i) {
  const uint32_t word = i < 4 ? s[0] : (i < 8 ? s[1] : s[2]);
  return (word >> (8 * (i % 4))) & 0xffu;
}

// Scale and minimum of k-quant sub-block `sub` (0..7) from the 12 packed bytes (as
// dequantize.cpp's q4_k_scale_min).
__device__ __forceinline__ void k_scale_min(const uint32_t (&s)[3], int sub, int& scale, int& min) {
  if (sub < 4) {
    scale = int(scale_byte(s, sub) & 63);
    min = int(scale_byte(s, sub + 4) & 63);
  } else {
    scale = int((scale_byte(s, sub + 4) & 0xf) | (scale_byte(s, sub - 4) >> 6) << 4);
    min = int((scale_byte(s, sub + 4) >> 4) | (scale_byte(s, sub) >> 6) << 4);
  }
}

// Weights [32 p, 32 p + 32) of the run of blocks at `blocks` (shared memory, 4-byte aligned
// words around it) into y, exactly as dequantize_row computes them.
template <DType kType>
__device__ __forceinline__ void dequantize_piece(const uint8_t* blocks, int p, float (&y)[kPiece]) {
  if constexpr (kType == DType::kQ4_0 || kType == DType::kQ4_1 || kType == DType::kQ5_0 || kType == DType::kQ5_1) {
    constexpr bool kMin = kType == DType::kQ4_1 || kType == DType::kQ5_1;
    constexpr bool kHigh = kType == DType::kQ5_0 || kType == DType::kQ5_1;
    const uint8_t* b = blocks + p * int(block_bytes(kType));
    const uint32_t head = word_at(b);
    const float d = f16_bits(head);
    const float m = kMin ? f16_bits(head >> 16) : 0.f;
    const int qh_at = kMin ? 4 : 2;
    const uint32_t qh = kHigh ? word_at(b + qh_at) : 0u;
    uint32_t qs[4];
    words_at<4>(b + qh_at + (kHigh ? 4 : 0), qs);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint32_t byte = byte_of(qs, j);
      int lo = int(byte & 0xf), hi = int(byte >> 4);
      if constexpr (kHigh) {
        lo |= int((qh >> j) & 1) << 4;
        hi |= int((qh >> (j + 16)) & 1) << 4;
      }
      if constexpr (kMin) {
        y[j] = __fadd_rn(__fmul_rn(float(lo), d), m);
        y[j + 16] = __fadd_rn(__fmul_rn(float(hi), d), m);
      } else {
        constexpr int kOffset = kHigh ? 16 : 8;
        y[j] = __fmul_rn(float(lo - kOffset), d);
        y[j + 16] = __fmul_rn(float(hi - kOffset), d);
      }
    }
  } else if constexpr (kType == DType::kQ8_0) {
    const uint8_t* b = blocks + p * int(block_bytes(kType));
    const float d = f16_bits(word_at(b));
    uint32_t qs[8];
    words_at<8>(b + 2, qs);
#pragma unroll
    for (int j = 0; j < 32; ++j) y[j] = __fmul_rn(float(int8_t(byte_of(qs, j))), d);
  } else if constexpr (kType == DType::kQ4_K || kType == DType::kQ5_K) {
    constexpr bool kHigh = kType == DType::kQ5_K;
    const uint8_t* b = blocks + (p / 8) * int(block_bytes(kType));
    const int sub = p % 8, chunk = sub / 2;
    const uint32_t head = word_at(b);
    const float d = f16_bits(head), dmin = f16_bits(head >> 16);
    uint32_t scales[3];
    words_at<3>(b + 4, scales);
    int scale, min;
    k_scale_min(scales, sub, scale, min);
    const float dl = __fmul_rn(d, float(scale)), ml = __fmul_rn(dmin, float(min));
    const int qs_at = 16 + (kHigh ? 32 : 0);
    uint32_t q[8];
    words_at<8>(b + qs_at + 32 * chunk, q);
    uint32_t qh[8] = {};
    if constexpr (kHigh) words_at<8>(b + 16, qh);
    const int nibble = (sub % 2) * 4;
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      int v = int((byte_of(q, l) >> nibble) & 0xf);
      if constexpr (kHigh) v |= int((byte_of(qh, l) >> sub) & 1) << 4;
      y[l] = __fsub_rn(__fmul_rn(dl, float(v)), ml);
    }
  } else if constexpr (kType == DType::kQ6_K) {
    const uint8_t* b = blocks + (p / 8) * int(block_bytes(kType));
    const int sub = p % 8, half = sub / 4, group = sub % 4;
    const float d = f16_bits(word_at(b + 208));
    uint32_t ql[8], qh[8];
    words_at<8>(b + 64 * half + 32 * (group & 1), ql);
    words_at<8>(b + 128 + 32 * half, qh);
    const int nibble = (group / 2) * 4, high = 2 * group;
    const uint32_t sc_word = word_at(b + 192 + 8 * half + 2 * group);  // the group's two int8 scales
    const float d0 = __fmul_rn(d, float(int8_t(sc_word & 0xff))), d1 = __fmul_rn(d, float(int8_t((sc_word >> 8) & 0xff)));
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const int q = int(((byte_of(ql, l) >> nibble) & 0xf) | ((byte_of(qh, l) >> high) & 3) << 4) - 32;
      y[l] = __fmul_rn(l < 16 ? d0 : d1, float(q));
    }
  }
}

// ---- Tensor-core operands -----------------------------------------------------------------
//
// The GEMV on tensor cores (quant_matmul.cu) multiplies a warp's 16 weight rows by up to 8
// activation rows per mma.sync.m16n8k16. A piece (32 weights of a row) is two k-steps of 16. A
// dot product does not care in which order its terms come, so the weights of a piece are
// assigned to k-slots in whatever order is cheapest to unpack, and the activations are loaded in
// the same order. Lane (g, t) = (lane / 4, lane % 4) holds, of rows g and g + 8, the weights
// w[4t .. 4t+3] and w[16+4t .. 16+4t+3] of each piece, as four f16 pairs:
//   h[0] = (w[4t], w[4t+2]),       h[2] = (w[4t+1], w[4t+3])        -> k-step 0 (a lo, a hi)
//   h[1] = (w[16+4t], w[16+4t+2]), h[3] = (w[16+4t+1], w[16+4t+3])  -> k-step 1 (a lo, a hi)
// Each pair holds 1024 + u, u the weight's unsigned code (< 1024, so exact in f16: OR-ing the
// code into the mantissa of 1024.0 replaces an integer-to-float conversion per weight), and
// w = scale * u + offset. The mma then gives T = sum (1024 + u) x and, against an all-ones A,
// S = sum x, so that sum w x = scale * T + (offset - 1024 scale) * S: the scales are applied once
// per piece and row, in fp32.
constexpr uint32_t kHalfMagic = 0x64006400u;  // 1024.0 in both halves of an f16 pair

// Pairs (nibble of byte 0, of byte 2) of x >> shift, as 1024 + code.
__device__ __forceinline__ uint32_t nibbles_02(uint32_t x, int shift) { return ((x >> shift) & 0x000f000fu) | kHalfMagic; }

template <DType kType>
struct PieceOperands {
  uint32_t h[4];
  float scale[2], offset[2];  // per k-step (equal except for q6_k, whose 16-weight halves have their own scales)
};

// The operands of piece p of the chunk at `blocks` (staged, 4-byte aligned words around it) for
// lane t (0..3) of a row's four lanes.
template <DType kType>
__device__ __forceinline__ void unpack_piece(const uint8_t* blocks, int p, int t, PieceOperands<kType>& o) {
  if constexpr (kType == DType::kQ4_0 || kType == DType::kQ4_1 || kType == DType::kQ5_0 || kType == DType::kQ5_1) {
    constexpr bool kMin = kType == DType::kQ4_1 || kType == DType::kQ5_1;
    constexpr bool kHigh = kType == DType::kQ5_0 || kType == DType::kQ5_1;
    const uint8_t* b = blocks + p * int(block_bytes(kType));
    const uint32_t head = word_at(b);
    const float d = f16_bits(head);
    const int qh_at = kMin ? 4 : 2;
    const uint32_t w = word_at(b + qh_at + (kHigh ? 4 : 0) + 4 * t);  // qs[4t .. 4t+3]: w[j] low, w[16+j] high nibble
    o.h[0] = nibbles_02(w, 0);
    o.h[2] = nibbles_02(w, 8);
    o.h[1] = nibbles_02(w, 4);
    o.h[3] = nibbles_02(w, 12);
    if constexpr (kHigh) {  // bit j of qh is bit 4 of w[j]
      const uint32_t qh = word_at(b + qh_at);
      const uint32_t lo = qh >> (4 * t), hi = qh >> (16 + 4 * t);
      o.h[0] |= ((lo & 1u) << 4) | ((lo & 4u) << 18);
      o.h[2] |= ((lo & 2u) << 3) | ((lo & 8u) << 17);
      o.h[1] |= ((hi & 1u) << 4) | ((hi & 4u) << 18);
      o.h[3] |= ((hi & 2u) << 3) | ((hi & 8u) << 17);
    }
    const float offset = kMin ? f16_bits(head >> 16) : -float(kHigh ? 16 : 8) * d;
    o.scale[0] = o.scale[1] = d;
    o.offset[0] = o.offset[1] = offset;
  } else if constexpr (kType == DType::kQ8_0) {
    const uint8_t* b = blocks + p * int(block_bytes(kType));
    const float d = f16_bits(word_at(b));
    const uint32_t lo = word_at(b + 2 + 4 * t) ^ 0x80808080u;  // int8 -> code q + 128
    const uint32_t hi = word_at(b + 2 + 16 + 4 * t) ^ 0x80808080u;
    // (byte 0, 0x64, byte 2, 0x64): the f16 pair (1024 + byte 0, 1024 + byte 2).
    o.h[0] = __byte_perm(lo, 0x64u, 0x4240);
    o.h[2] = __byte_perm(lo, 0x64u, 0x4341);
    o.h[1] = __byte_perm(hi, 0x64u, 0x4240);
    o.h[3] = __byte_perm(hi, 0x64u, 0x4341);
    o.scale[0] = o.scale[1] = d;
    o.offset[0] = o.offset[1] = -128.f * d;
  } else if constexpr (kType == DType::kQ4_K || kType == DType::kQ5_K) {
    constexpr bool kHigh = kType == DType::kQ5_K;
    const uint8_t* b = blocks + (p / 8) * int(block_bytes(kType));
    const int sub = p % 8, chunk = sub / 2, nibble = (sub % 2) * 4;
    const uint32_t head = word_at(b);
    uint32_t scales[3];
    words_at<3>(b + 4, scales);
    int scale, min;
    k_scale_min(scales, sub, scale, min);
    const uint8_t* q = b + 16 + (kHigh ? 32 : 0) + 32 * chunk;  // w[l] is byte l's nibble
    const uint32_t lo = word_at(q + 4 * t), hi = word_at(q + 16 + 4 * t);
    o.h[0] = nibbles_02(lo, nibble);
    o.h[2] = nibbles_02(lo, nibble + 8);
    o.h[1] = nibbles_02(hi, nibble);
    o.h[3] = nibbles_02(hi, nibble + 8);
    if constexpr (kHigh) {  // bit `sub` of qh[l] is bit 4 of w[l]
      const uint32_t qh_lo = word_at(b + 16 + 4 * t), qh_hi = word_at(b + 16 + 16 + 4 * t);
      o.h[0] |= ((qh_lo >> sub) & 0x00010001u) << 4;
      o.h[2] |= ((qh_lo >> (sub + 8)) & 0x00010001u) << 4;
      o.h[1] |= ((qh_hi >> sub) & 0x00010001u) << 4;
      o.h[3] |= ((qh_hi >> (sub + 8)) & 0x00010001u) << 4;
    }
    const float d = f16_bits(head), dmin = f16_bits(head >> 16);
    o.scale[0] = o.scale[1] = d * float(scale);
    o.offset[0] = o.offset[1] = -(dmin * float(min));
  } else if constexpr (kType == DType::kQ6_K) {
    const uint8_t* b = blocks + (p / 8) * int(block_bytes(kType));
    const int sub = p % 8, half = sub / 4, group = sub % 4;
    const uint8_t* ql = b + 64 * half + 32 * (group & 1);  // w[l]: nibble of ql[l], 2 bits of qh[l]
    const uint8_t* qh = b + 128 + 32 * half;
    const int nibble = (group / 2) * 4, high = 2 * group;
    const uint32_t l0 = word_at(ql + 4 * t), l1 = word_at(ql + 16 + 4 * t);
    const uint32_t h0 = word_at(qh + 4 * t), h1 = word_at(qh + 16 + 4 * t);
    o.h[0] = nibbles_02(l0, nibble) | ((h0 >> high) & 0x00030003u) << 4;
    o.h[2] = nibbles_02(l0, nibble + 8) | ((h0 >> (high + 8)) & 0x00030003u) << 4;
    o.h[1] = nibbles_02(l1, nibble) | ((h1 >> high) & 0x00030003u) << 4;
    o.h[3] = nibbles_02(l1, nibble + 8) | ((h1 >> (high + 8)) & 0x00030003u) << 4;
    const float d = f16_bits(word_at(b + 208));
    const uint32_t sc = word_at(b + 192 + 8 * half + 2 * group);  // the scales of w[0..15] and w[16..31]
    o.scale[0] = d * float(int8_t(sc & 0xffu));
    o.scale[1] = d * float(int8_t((sc >> 8) & 0xffu));
    o.offset[0] = -32.f * o.scale[0];
    o.offset[1] = -32.f * o.scale[1];
  }
}

// Calls fn.template operator()<kType>() for a runtime block-quantized dtype.
template <typename Fn>
void dispatch_quantized(DType t, Fn&& fn) {
  switch (t) {
    case DType::kQ4_0: return fn.template operator()<DType::kQ4_0>();
    case DType::kQ4_1: return fn.template operator()<DType::kQ4_1>();
    case DType::kQ5_0: return fn.template operator()<DType::kQ5_0>();
    case DType::kQ5_1: return fn.template operator()<DType::kQ5_1>();
    case DType::kQ8_0: return fn.template operator()<DType::kQ8_0>();
    case DType::kQ4_K: return fn.template operator()<DType::kQ4_K>();
    case DType::kQ5_K: return fn.template operator()<DType::kQ5_K>();
    case DType::kQ6_K: return fn.template operator()<DType::kQ6_K>();
    default: break;
  }
}

}  // namespace pagoda::cuda::kernels

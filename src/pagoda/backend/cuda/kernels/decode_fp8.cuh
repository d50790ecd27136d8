// decode_fp8_kernel: paged decode attention on an fp8 (e4m3) KV cache with one scale per (token,
// kv head). The structure of decode_tiled_kernel (one CTA per work item, the group's rows on the
// n = 8 side of mma.sync m16n8k16, a cp.async pipeline of 64-token tiles, fp32 online softmax),
// with the codes kept in fp8 in shared memory and widened to T in registers (e4m3 is exact in f16
// and bf16), straight from ldmatrix:
//   K: ldmatrix of fp8 rows read as b16 gives lane (g, t) 4 consecutive dims 4t..4t+3 of token g;
//      widened, they are the A registers of k slots (2t, 2t + 1) and (2t + 8, 2t + 9). The MMA
//      sums over k in any order, so q's B registers are read in that same order (dims 4t, 4t + 1
//      and 4t + 2, 4t + 3 of each 16).
//   V: ldmatrix.trans gives lane (g, t) dims 2g, 2g + 1 of tokens 2t, 2t + 1; one byte permute
//      makes them the A registers of M rows "dim 2g" and "dim 2g + 1" (O^T's rows are dims in that
//      order, undone when o is stored).
// The scales stay out of the MMAs: K's multiplies the token's score, V's the token's softmax
// numerator before P is rounded to T (the softmax denominator takes the unscaled numerator).
//
// Bytes: per token and kv head 2 x (d + 4), + q and out. FLOPs: 4 x L x Hq x d per sequence.
#pragma once

#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "pagoda/backend/cuda/kernels/decode_int2.cuh"
#include "pagoda/backend/cuda/kernels/ptx.cuh"
#include "pagoda/backend/cuda/kernels/store_state.cuh"

namespace pagoda::cuda {

template <int kHeadDim>
struct DecodeFp8Config {
  static constexpr int kWarps = kQuantizedDecodeWarps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kTileTokens = kWarps * 16;
  static constexpr int kStages = 4;
  static constexpr int kCodeTileBytes = kTileTokens * kHeadDim;   // K or V codes of one tile
  static constexpr int kScaleTileBytes = kTileTokens * 4;         // K or V scales of one tile
  static constexpr int kStageBytes = 2 * (kCodeTileBytes + kScaleTileBytes);
  static constexpr int kPipelineBytes = kStages * kStageBytes;
  static constexpr int kReduceBytes = kWarps * 8 * (kHeadDim + 2) * 4;
  static constexpr int kSmemBytes = kPipelineBytes > kReduceBytes ? kPipelineBytes : kReduceBytes;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "the swizzle is for rows of 4 or 8 chunks");
  // 16-byte chunk c of fp8 row r is stored at chunk swizzle(r, c), so that the 8 rows of each
  // ldmatrix matrix (one chunk of 8 consecutive rows) fall in 8 distinct bank groups.
  static __device__ __forceinline__ int swizzle(int row, int chunk) {
    return kHeadDim == 128 ? chunk ^ (row & 7) : chunk ^ ((row >> 1) & 3);
  }
};

namespace kernels {

// Two e4m3 codes (the low 16 bits of x) to a pair of T, exactly.
template <typename T>
__device__ __forceinline__ uint32_t widen_e4m3x2(uint32_t x) {
  const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(x & 0xffff), __NV_E4M3);
  if constexpr (std::is_same_v<T, __half>) {
    return uint32_t(raw.x) | (uint32_t(raw.y) << 16);
  } else {
    const float2 f = __half22float2(__half2(raw));
    return ptx::pack2<T>(f.x, f.y);
  }
}

}  // namespace kernels

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(DecodeFp8Config<kHeadDim>::kThreads) decode_fp8_kernel(const QuantizedDecodeParams qp) {
  using C = DecodeFp8Config<kHeadDim>;
  constexpr int kDimTiles = kHeadDim / 16;
  constexpr int kChunksPerRow = kHeadDim / 16;  // 16-byte chunks of an fp8 row
  extern __shared__ __align__(128) uint8_t smem[];
  const DecodeParams& p = qp.base;
  const kernels::QuantizedPoolArgs& pool = qp.pool;

  ptx::launch_dependents();
  const attention::WorkItem item = p.items[blockIdx.x];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int num_tokens = item.token_end - item.token_begin;
  const int num_tiles = (num_tokens + C::kTileTokens - 1) / C::kTileTokens;
  const int block_log2 = __ffs(pool.block_size) - 1;
  const int block_mask = pool.block_size - 1;
  const int32_t* blocks = p.block_ids + item.block_begin;
  const uint8_t* k_head = pool.k_codes + item.kv_head * pool.k_codes_head;
  const uint8_t* v_head = pool.v_codes + item.kv_head * pool.k_codes_head;
  const float* ks_head = pool.k_fp8_scale + item.kv_head * pool.fp8_scale_head;
  const float* vs_head = pool.v_fp8_scale + item.kv_head * pool.fp8_scale_head;
  const uint32_t smem_base = ptx::smem_address(smem);

  uint32_t q_frag[kDimTiles][2];
  {
    const int64_t q_row = int64_t(item.seq) * p.num_q_heads + int64_t(item.kv_head) * p.group + g;
    const uint32_t* q = reinterpret_cast<const uint32_t*>(static_cast<const T*>(p.q) + q_row * kHeadDim);
#pragma unroll
    for (int ks = 0; ks < kDimTiles; ++ks) {  // dims 16 ks + 4t, + 1 and 16 ks + 4t + 2, + 3
      q_frag[ks][0] = g < p.group ? q[ks * 8 + 2 * t] : 0u;
      q_frag[ks][1] = g < p.group ? q[ks * 8 + 2 * t + 1] : 0u;
    }
  }

  // Copies: code chunk tid % kChunksPerRow of every kRowsPerPass-th row; threads 0..15 also copy
  // the tile's K scales and 16..31 its V scales (16 bytes, 4 tokens, each; blocks hold multiples
  // of 16 tokens, so 4 tokens never straddle two).
  constexpr int kRowsPerPass = C::kThreads / kChunksPerRow;
  constexpr int kRowsPerThread = C::kTileTokens / kRowsPerPass;
  const int chunk = tid % kChunksPerRow;
  const int first_row = tid / kChunksPerRow;
  // Plain cp.async, no evict_first policy: with one, ptxas 13.0 gave this kernel's copies a bad
  // cache-policy register (an illegal instruction), as decode_tiled_kernel's unrolled prologue.
  auto load_tile = [&](int tile, int stage) {
    const uint32_t k_dst = smem_base + stage * C::kStageBytes;
    const uint32_t v_dst = k_dst + C::kCodeTileBytes;
#pragma unroll
    for (int k = 0; k < kRowsPerThread; ++k) {
      const int row = first_row + k * kRowsPerPass;
      const int token = tile * C::kTileTokens + row;
      const bool valid = token < num_tokens;
      const int64_t offset =
          valid ? int64_t(blocks[token >> block_log2]) * pool.k_codes_block + (token & block_mask) * kHeadDim + chunk * 16
                : 0;
      const uint32_t dst = row * kHeadDim + C::swizzle(row, chunk) * 16;
      ptx::cp_async_16(k_dst + dst, k_head + offset, valid ? 16 : 0);
      ptx::cp_async_16(v_dst + dst, v_head + offset, valid ? 16 : 0);
    }
    if (tid < 32) {
      const int row = (tid % 16) * 4;
      const int token = tile * C::kTileTokens + row;
      const bool valid = token < num_tokens;
      const int64_t offset =
          valid ? int64_t(blocks[token >> block_log2]) * pool.fp8_scale_block + (token & block_mask) : 0;
      const float* src = (tid < 16 ? ks_head : vs_head) + offset;
      const uint32_t dst = smem_base + stage * C::kStageBytes + 2 * C::kCodeTileBytes + (tid < 16 ? 0 : C::kScaleTileBytes) + row * 4;
      // A partial group of 4 (past the sequence's end) copies what the block holds there; those
      // tokens are masked out of the softmax.
      ptx::cp_async_16(dst, src, valid ? 16 : 0);
    }
  };
  float o_acc[kDimTiles][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};

  auto compute_tile = [&](int tile, int stage) {
    const int slice = tile * C::kTileTokens + warp * 16;
    if (slice >= num_tokens) return;
    const float* k_scales = reinterpret_cast<const float*>(smem + stage * C::kStageBytes + 2 * C::kCodeTileBytes);
    const float* v_scales = k_scales + C::kTileTokens;
    const uint32_t k_src = smem_base + stage * C::kStageBytes;
    const uint32_t v_src = k_src + C::kCodeTileBytes;
    const int i = lane / 8;  // which of ldmatrix's four matrices this lane addresses
    const int row = warp * 16 + (i & 1) * 8 + (lane & 7);  // tokens 0-7 or 8-15 of the warp's slice
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int kp = 0; kp < kDimTiles / 2; ++kp) {  // 32 dims: chunks 2 kp and 2 kp + 1
      const int chunk = 2 * kp + (i >> 1);
      uint32_t r[4];
      ptx::ldmatrix_x4(r, k_src + row * kHeadDim + (C::swizzle(row, chunk) << 4));
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint32_t a[4] = {kernels::widen_e4m3x2<T>(r[2 * half]), kernels::widen_e4m3x2<T>(r[2 * half + 1]),
                               kernels::widen_e4m3x2<T>(r[2 * half] >> 16),
                               kernels::widen_e4m3x2<T>(r[2 * half + 1] >> 16)};
        ptx::mma_16x8x16<T>(s, a, q_frag[2 * kp + half][0], q_frag[2 * kp + half][1]);
      }
    }
    const float ks_lo = k_scales[warp * 16 + g], ks_hi = k_scales[warp * 16 + g + 8];
    const float vs_lo = v_scales[warp * 16 + g], vs_hi = v_scales[warp * 16 + g + 8];
    const bool lo_valid = slice + g < num_tokens;
    const bool hi_valid = slice + g + 8 < num_tokens;
    float p_lo[2], p_hi[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float x_lo = lo_valid ? s[j] * ks_lo * p.scale_log2 : -INFINITY;
      const float x_hi = hi_valid ? s[j + 2] * ks_hi * p.scale_log2 : -INFINITY;
      float tile_max = fmaxf(x_lo, x_hi);
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 4));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 8));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 16));
      const float new_max = fmaxf(row_max[j], tile_max);
      const float correction = exp2f(row_max[j] - new_max);
      row_max[j] = new_max;
      p_lo[j] = exp2f(x_lo - new_max);
      p_hi[j] = exp2f(x_hi - new_max);
      row_sum[j] = row_sum[j] * correction + p_lo[j] + p_hi[j];
#pragma unroll
      for (int m = 0; m < kDimTiles; ++m) {
        o_acc[m][j] *= correction;
        o_acc[m][j + 2] *= correction;
      }
    }
    // Invalid tokens: p = 0 and their scale is whatever was copied (finite or not); keep 0.
    const float w_lo = lo_valid ? vs_lo : 0.f, w_hi = hi_valid ? vs_hi : 0.f;
    const uint32_t p_b0 = ptx::movmatrix_trans(ptx::pack2<T>(p_lo[0] * w_lo, p_lo[1] * w_lo));
    const uint32_t p_b1 = ptx::movmatrix_trans(ptx::pack2<T>(p_hi[0] * w_hi, p_hi[1] * w_hi));
#pragma unroll
    for (int mp = 0; mp < kDimTiles / 2; ++mp) {  // chunks 2 mp and 2 mp + 1: 16 dims each
      const int chunk = 2 * mp + (i >> 1);
      uint32_t r[4];
      ptx::ldmatrix_x4_trans(r, v_src + row * kHeadDim + (C::swizzle(row, chunk) << 4));
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        // r[2 half]: tokens 2t, 2t + 1 (bytes 0-1: dims 2g, 2g + 1 of token 2t; 2-3: of 2t + 1);
        // r[2 half + 1]: tokens 8 + 2t, 9 + 2t.
        const uint32_t lo = __byte_perm(r[2 * half], 0, 0x3120), hi = __byte_perm(r[2 * half + 1], 0, 0x3120);
        const uint32_t a[4] = {kernels::widen_e4m3x2<T>(lo), kernels::widen_e4m3x2<T>(lo >> 16),
                               kernels::widen_e4m3x2<T>(hi), kernels::widen_e4m3x2<T>(hi >> 16)};
        ptx::mma_16x8x16<T>(o_acc[2 * mp + half], a, p_b0, p_b1);
      }
    }
  };

#pragma unroll 1
  for (int stage = 0; stage < C::kStages - 1; ++stage) {
    if (stage < num_tiles) load_tile(stage, stage);
    ptx::cp_async_commit();
  }
  for (int tile = 0; tile < num_tiles; ++tile) {
    ptx::cp_async_wait<C::kStages - 2>();
    __syncthreads();  // the tile landed; every warp is done with the stage loaded next
    const int next = tile + C::kStages - 1;
    if (next < num_tiles) load_tile(next, next % C::kStages);
    ptx::cp_async_commit();
    compute_tile(tile, tile % C::kStages);
  }

#pragma unroll
  for (int j = 0; j < 2; ++j) {
    row_sum[j] += __shfl_xor_sync(0xffffffffu, row_sum[j], 4);
    row_sum[j] += __shfl_xor_sync(0xffffffffu, row_sum[j], 8);
    row_sum[j] += __shfl_xor_sync(0xffffffffu, row_sum[j], 16);
  }
  ptx::cp_async_wait<0>();
  __syncthreads();
  float* red_o = reinterpret_cast<float*>(smem);
  float* red_max = red_o + C::kWarps * 8 * kHeadDim;
  float* red_sum = red_max + C::kWarps * 8;
#pragma unroll
  for (int m = 0; m < kDimTiles; ++m)
#pragma unroll
    for (int e = 0; e < 4; ++e) red_o[(warp * 8 + 2 * t + (e & 1)) * kHeadDim + 16 * m + 2 * g + (e >> 1)] = o_acc[m][e];
  if (g == 0) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      red_max[warp * 8 + 2 * t + j] = row_max[j];
      red_sum[warp * 8 + 2 * t + j] = row_sum[j];
    }
  }
  __syncthreads();
  for (int idx = tid; idx < p.group * kHeadDim; idx += C::kThreads) {
    const int r = idx / kHeadDim, d = idx % kHeadDim;
    float max = -INFINITY;
#pragma unroll
    for (int w = 0; w < C::kWarps; ++w) max = fmaxf(max, red_max[w * 8 + r]);
    float sum = 0.f, acc = 0.f;
    if (max != -INFINITY) {
#pragma unroll
      for (int w = 0; w < C::kWarps; ++w) {
        const float weight = exp2f(red_max[w * 8 + r] - max);
        sum += red_sum[w * 8 + r] * weight;
        acc += red_o[(w * 8 + r) * kHeadDim + d] * weight;
      }
    }
    store_state_o<T, kHeadDim>(p, item, r, d, sum > 0.f ? acc / sum : 0.f);
    if (d == 0) store_state_lse(p, item, r, sum > 0.f ? max * float(M_LN2) + logf(sum) : -INFINITY);
  }
}

}  // namespace pagoda::cuda

// decode_tiled_kernel: the production decode attention. One CTA runs one work item: the GQA
// group of query rows of one (sequence, kv head) over a run of KV tokens. Each KV byte is read
// from device memory once, into shared memory, and used by every query row of the group.
//
// Pipeline: the item's tokens are cut into tiles of kTileTokens in kStages shared-memory
// buffers; while one tile is computed the next kStages - 1 are in flight (cp.async, 16 bytes per
// thread, zero-filled past the end). Each of the 4 warps owns 16 rows of
// a tile and keeps its own online-softmax state; the warps merge with ⊕ at the end.
//
// Tensor cores with the group on the narrow side, so that no row is padding:
//   S^T [16 tokens x 8 rows]  = K [16 tokens x d] . Q^T [d x 8 rows]     (mma m16n8k16, A = K)
//   O^T [16 dims x 8 rows]   += V^T [16 dims x 16 tokens] . P^T [16 tokens x 8 rows]
// Groups smaller than 8 leave columns of the n = 8 side unused; the M = 16 side is always KV.
// P^T's fragment comes from S^T's accumulators by one movmatrix.trans per 8x8 half.
//
// Shared memory rows are head_dim * 2 bytes; 16-byte chunk c of row r is stored at chunk
// c ^ (r % 8), so that the 8 row addresses of each ldmatrix fall in 8 distinct bank groups.
//
// L2 prefetch ("Accelerating LLM Inference Throughput via Asynchronous KV Cache Prefetching",
// arXiv:2504.06319): while tile i is computed, tile
// i + prefetch_distance is requested into L2 with cp.async.bulk.prefetch.L2, one instruction per
// warp and K or V (HND pools); the cp.async that later reads it is marked evict_first
// (DecodeParams turns each off separately, for ablation).
#pragma once

#include <cmath>
#include <cstdint>

#include "pagoda/backend/cuda/kernels/store_state.cuh"
#include "pagoda/backend/cuda/kernels/ptx.cuh"

namespace pagoda::cuda {

template <int kHeadDim>
struct DecodeTiledConfig {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kTileTokens = kWarps * 16;
  static constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr int kTileBytes = kTileTokens * kRowBytes;  // K or V of one tile
  // About 64-128 KB of tiles per CTA: enough bytes in flight per SM to cover memory latency
  // with 1-3 resident CTAs.
  static constexpr int kStages = kHeadDim == 64 ? 4 : kHeadDim == 128 ? 3 : 2;
  static constexpr int kPipelineBytes = kStages * 2 * kTileBytes;
  // The epilogue reuses the pipeline's memory: per warp 8 rows of o, their max and sum.
  static constexpr int kReduceBytes = kWarps * 8 * (kHeadDim + 2) * 4;
  static constexpr int kSmemBytes = kPipelineBytes > kReduceBytes ? kPipelineBytes : kReduceBytes;
  static constexpr int kDefaultPrefetchDistance = kStages + 1;  // tiles ahead of the computed one

  static_assert(kHeadDim % 64 == 0, "the swizzle needs at least 8 chunks per row");
};

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(DecodeTiledConfig<kHeadDim>::kThreads)
    decode_tiled_kernel(const DecodeParams p) {
  using C = DecodeTiledConfig<kHeadDim>;
  constexpr int kDimTiles = kHeadDim / 16;
  extern __shared__ __align__(128) uint8_t smem[];

  ptx::launch_dependents();  // the merge, if any, may start its launch while this grid runs
  const attention::WorkItem item = p.items[blockIdx.x];
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;  // mma fragment row
  const int t = lane % 4;  // mma fragment column pair
  const int num_tokens = item.token_end - item.token_begin;
  const int num_tiles = (num_tokens + C::kTileTokens - 1) / C::kTileTokens;
  const int block_mask = (1 << p.pool.block_size_log2) - 1;
  const int32_t* blocks = p.block_ids + item.block_begin;  // holds token_begin at slot 0
  const T* k_head = static_cast<const T*>(p.pool.k) + item.kv_head * p.pool.head_stride;
  const T* v_head = static_cast<const T*>(p.pool.v) + item.kv_head * p.pool.head_stride;
  const uint32_t smem_base = ptx::smem_address(smem);

  // Q as the B operand (d x rows, column-major = Q row-major): lane holds row g, dims 2t, 2t+1
  // and 2t+8, 2t+9 of each 16-dim step. Rows past the group are zero.
  uint32_t q_frag[kDimTiles][2];
  {
    const int64_t q_row = int64_t(item.seq) * p.num_q_heads + int64_t(item.kv_head) * p.group + g;
    const uint32_t* q = reinterpret_cast<const uint32_t*>(static_cast<const T*>(p.q) + q_row * kHeadDim);
#pragma unroll
    for (int ks = 0; ks < kDimTiles; ++ks) {
      q_frag[ks][0] = g < p.group ? q[ks * 8 + t] : 0u;
      q_frag[ks][1] = g < p.group ? q[ks * 8 + 4 + t] : 0u;
    }
  }

  // Copies: thread tid moves 16-byte chunk tid % kChunksPerRow of every kRowsPerPass-th row. The
  // block ids of its rows are read one tile before the copies that need them are issued, so no
  // copy waits on a dependent load.
  constexpr int kRowsPerPass = C::kThreads / C::kChunksPerRow;
  constexpr int kRowsPerThread = C::kTileTokens / kRowsPerPass;
  const int chunk = tid % C::kChunksPerRow;
  const int first_row = tid / C::kChunksPerRow;
  auto read_tile_blocks = [&](int tile, int32_t (&ids)[kRowsPerThread]) {
#pragma unroll
    for (int k = 0; k < kRowsPerThread; ++k) {
      const int token = tile * C::kTileTokens + first_row + k * kRowsPerPass;  // from token_begin
      ids[k] = token < num_tokens ? blocks[token >> p.pool.block_size_log2] : -1;
    }
  };
  auto load_tile = [&](int tile, int stage, const int32_t (&ids)[kRowsPerThread]) {
    const uint64_t policy = ptx::evict_first_policy();
    const uint32_t k_dst = smem_base + stage * 2 * C::kTileBytes;
    const uint32_t v_dst = k_dst + C::kTileBytes;
#pragma unroll
    for (int k = 0; k < kRowsPerThread; ++k) {
      const int row = first_row + k * kRowsPerPass;
      const int token = tile * C::kTileTokens + row;
      const bool valid = ids[k] >= 0;
      const int64_t offset =
          valid ? int64_t(ids[k]) * p.pool.page_stride + (token & block_mask) * p.pool.token_stride + chunk * 8 : 0;
      const uint32_t dst = row * C::kRowBytes + ((chunk ^ (row & 7)) << 4);
      const uint32_t bytes = valid ? 16 : 0;  // zero-fill: P = 0 there, and 0 * V must not be NaN
      if (p.evict_first) {
        ptx::cp_async_16_hint(k_dst + dst, k_head + offset, bytes, policy);
        ptx::cp_async_16_hint(v_dst + dst, v_head + offset, bytes, policy);
      } else {
        ptx::cp_async_16(k_dst + dst, k_head + offset, bytes);
        ptx::cp_async_16(v_dst + dst, v_head + offset, bytes);
      }
    }
  };

  // L2 prefetch, HND pools only: there a warp's 16-token slice of a tile is one contiguous run of
  // K and one of V (block sizes are multiples of 16). Every lane computes the same address, so
  // each prefetch is one instruction per warp (lanes with different addresses would cost a
  // loop of uniform-register moves); its block id is read a tile ahead.
  const bool prefetch = p.l2_prefetch && p.blocks_contiguous;
  auto read_prefetch_block = [&](int tile) -> int32_t {
    const int token = tile * C::kTileTokens + warp * 16;
    return token < num_tokens ? blocks[token >> p.pool.block_size_log2] : -1;
  };
  auto prefetch_tile = [&](int tile, int32_t id) {
    if (id < 0) return;
    const int token = tile * C::kTileTokens + warp * 16;
    const int64_t offset = int64_t(id) * p.pool.page_stride + (token & block_mask) * p.pool.token_stride;
    ptx::prefetch_l2(k_head + offset, 16 * C::kRowBytes);
    ptx::prefetch_l2(v_head + offset, 16 * C::kRowBytes);
  };

  float o_acc[kDimTiles][4] = {};  // O^T fragments: dims 16m + g (+8), rows 2t, 2t+1
  float row_max[2] = {-INFINITY, -INFINITY};  // rows 2t, 2t+1; exp2 domain
  float row_sum[2] = {0.f, 0.f};              // this lane's tokens only until the end

  auto compute_tile = [&](int tile, int stage) {
    const int slice = tile * C::kTileTokens + warp * 16;  // the warp's first token
    if (slice >= num_tokens) return;
    const uint32_t k_src = smem_base + stage * 2 * C::kTileBytes;
    const uint32_t v_src = k_src + C::kTileBytes;
    const int i = lane / 8;  // which of ldmatrix's four matrices this lane addresses

    float s[4] = {0.f, 0.f, 0.f, 0.f};  // S^T: (token g, rows 2t, 2t+1), (token g + 8, ...)
#pragma unroll
    for (int ks = 0; ks < kDimTiles; ++ks) {
      const int row = warp * 16 + (i & 1) * 8 + (lane & 7);
      const int chunk = 2 * ks + (i >> 1);
      uint32_t a[4];
      ptx::ldmatrix_x4(a, k_src + row * C::kRowBytes + ((chunk ^ (row & 7)) << 4));
      ptx::mma_16x8x16<T>(s, a, q_frag[ks][0], q_frag[ks][1]);
    }

    const bool lo_valid = slice + g < num_tokens;
    const bool hi_valid = slice + g + 8 < num_tokens;
    float p_lo[2], p_hi[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float x_lo = lo_valid ? s[j] * p.scale_log2 : -INFINITY;
      const float x_hi = hi_valid ? s[j + 2] * p.scale_log2 : -INFINITY;
      float tile_max = fmaxf(x_lo, x_hi);  // over the 16 tokens: the lanes sharing t
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 4));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 8));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 16));
      const float new_max = fmaxf(row_max[j], tile_max);  // finite: token `slice` is valid
      const float correction = exp2f(row_max[j] - new_max);  // 0 on the first tile
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
    // S^T's accumulators hold (token, row) pairs; P^T as the B operand wants (row; token pair):
    // transpose each 8x8 half in registers.
    const uint32_t p_b0 = ptx::movmatrix_trans(ptx::pack2<T>(p_lo[0], p_lo[1]));
    const uint32_t p_b1 = ptx::movmatrix_trans(ptx::pack2<T>(p_hi[0], p_hi[1]));
#pragma unroll
    for (int m = 0; m < kDimTiles; ++m) {
      const int row = warp * 16 + (i >> 1) * 8 + (lane & 7);
      const int chunk = 2 * m + (i & 1);
      uint32_t a[4];
      ptx::ldmatrix_x4_trans(a, v_src + row * C::kRowBytes + ((chunk ^ (row & 7)) << 4));
      ptx::mma_16x8x16<T>(o_acc[m], a, p_b0, p_b1);
    }
  };

  // The pipeline: kStages - 1 tiles in flight ahead of the one computed; one commit group per
  // tile (empty past the end) so that wait_group counts tiles.
  const int distance = p.prefetch_distance;
  int32_t prefetch_id = -1;
  if (prefetch) {
    // Tiles up to kStages - 1 are requested by cp.async before the first one is computed.
    for (int tile = C::kStages; tile < distance; ++tile) prefetch_tile(tile, read_prefetch_block(tile));
    prefetch_id = read_prefetch_block(distance);
  }
  int32_t ids[kRowsPerThread];
  // Not unrolled: unrolled, ptxas 13.0 gave the prologue's evict_first copies an odd uniform
  // register as their cache-policy descriptor, and they faulted (an illegal instruction).
#pragma unroll 1
  for (int stage = 0; stage < C::kStages - 1; ++stage) {
    read_tile_blocks(stage, ids);
    if (stage < num_tiles) load_tile(stage, stage, ids);
    ptx::cp_async_commit();
  }
  read_tile_blocks(C::kStages - 1, ids);
  for (int tile = 0; tile < num_tiles; ++tile) {
    ptx::cp_async_wait<C::kStages - 2>();
    __syncthreads();  // tile landed for every thread; every warp is done with tile - 1's stage
    const int next = tile + C::kStages - 1;
    if (next < num_tiles) load_tile(next, next % C::kStages, ids);
    ptx::cp_async_commit();
    read_tile_blocks(next + 1, ids);  // in flight while this tile is computed
    if (prefetch) {
      prefetch_tile(tile + distance, prefetch_id);
      prefetch_id = read_prefetch_block(tile + distance + 1);
    }
    compute_tile(tile, tile % C::kStages);
  }

  // Epilogue: each warp's state per row, then ⊕ over the warps.
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    row_sum[j] += __shfl_xor_sync(0xffffffffu, row_sum[j], 4);
    row_sum[j] += __shfl_xor_sync(0xffffffffu, row_sum[j], 8);
    row_sum[j] += __shfl_xor_sync(0xffffffffu, row_sum[j], 16);
  }
  ptx::cp_async_wait<0>();
  __syncthreads();
  float* red_o = reinterpret_cast<float*>(smem);        // [warps][8 rows][head_dim]
  float* red_max = red_o + C::kWarps * 8 * kHeadDim;    // [warps][8 rows]
  float* red_sum = red_max + C::kWarps * 8;             // [warps][8 rows]
#pragma unroll
  for (int m = 0; m < kDimTiles; ++m) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = 2 * t + (e & 1);
      const int d = 16 * m + g + (e >> 1) * 8;
      red_o[(warp * 8 + row) * kHeadDim + d] = o_acc[m][e];
    }
  }
  if (g == 0) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      red_max[warp * 8 + 2 * t + j] = row_max[j];
      red_sum[warp * 8 + 2 * t + j] = row_sum[j];
    }
  }
  __syncthreads();
  for (int idx = tid; idx < p.group * kHeadDim; idx += C::kThreads) {
    const int r = idx / kHeadDim;
    const int d = idx % kHeadDim;
    float max = -INFINITY;
#pragma unroll
    for (int w = 0; w < C::kWarps; ++w) max = fmaxf(max, red_max[w * 8 + r]);
    float sum = 0.f, acc = 0.f;
    if (max != -INFINITY) {  // else every warp was empty: the empty state
#pragma unroll
      for (int w = 0; w < C::kWarps; ++w) {
        const float weight = exp2f(red_max[w * 8 + r] - max);  // 0 for an empty warp
        sum += red_sum[w * 8 + r] * weight;
        acc += red_o[(w * 8 + r) * kHeadDim + d] * weight;
      }
    }
    store_state_o<T, kHeadDim>(p, item, r, d, sum > 0.f ? acc / sum : 0.f);
    if (d == 0) store_state_lse(p, item, r, sum > 0.f ? max * float(M_LN2) + logf(sum) : -INFINITY);
  }
}

}  // namespace pagoda::cuda

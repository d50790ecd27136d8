// prefill_tiled_kernel: causal prefill attention over paged KV, FlashAttention-2 style. One CTA
// runs one PrefillTile for one kv head: 64 query rows, each a (token, q head of the GQA group)
// pair, row r = token * group + head, so every K/V byte brought into shared memory serves the
// whole group (64 / group tokens; rows past the tile's tokens are padding, never stored).
//
// Each of the 4 warps owns 16 rows with Q in registers (A fragments) and its own online-softmax
// state, in the exp2 domain, over the sequence's keys [0, last position], 64 per tile:
//   S [16 rows x 64 keys]  = Q [16 x d] . K^T        (mma m16n8k16; B = K rows, ldmatrix)
//   O [16 rows x d]       += P [16 x 64] . V          (P from S's accumulators; V^T by ldmatrix.trans)
// Keys are read in ascending order, so every row has seen key 0 (never masked) by its first tile:
// its running max is finite from then on and a fully masked later tile simply adds zeros.
// The causal mask is applied only on key tiles that reach past a warp's first position, and a
// warp skips the key tiles that lie wholly above its last position.
//
// K/V tiles stream through kStages shared-memory buffers by cp.async (16 bytes per thread,
// zero-filled past the sequence's last key, so no slot beyond it is read). 16-byte chunk c of
// shared row r is stored at chunk c ^ (r % 8): the 8 row addresses of each ldmatrix hit 8
// distinct bank groups.
#pragma once

#include <cmath>
#include <cstdint>

#include "pagoda/backend/cuda/kernels/kv_pool_params.h"
#include "pagoda/backend/cuda/kernels/online_softmax.cuh"
#include "pagoda/backend/cuda/kernels/ptx.cuh"
#include "pagoda/backend/cuda/prefill_attention.h"

namespace pagoda::cuda {

// What the kernel reads; built by launch_prefill_tiled from the workspace and the pool.
struct PrefillParams {
  const PrefillTile* tiles;
  const int32_t* block_ids;  // PrefillWorkspace::block_ids; a tile's blocks start at block_begin
  KvPoolParams pool;  // the layer's K and V
  const void* q;  // [num_rows, num_q_heads, head_dim] T
  void* out;      // [num_rows, num_q_heads, head_dim] T
  int32_t num_q_heads;
  int32_t num_kv_heads;
  int32_t group;     // q heads per kv head: kv head h serves q heads h * group + [0, group)
  float scale_log2;  // softmax scale * log2(e): scores live in the exp2 domain
};

template <int kHeadDim>
struct PrefillTiledConfig {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kKeysPerTile = 64;
  static constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr int kTileBytes = kKeysPerTile * kRowBytes;  // K or V of one tile
  // Two tiles in flight behind the computed one for the small rows of head_dim 64; one for 128,
  // whose 64 KB of buffers already leave room for 3 CTAs per SM.
  static constexpr int kStages = kHeadDim == 64 ? 3 : 2;
  static constexpr int kSmemBytes = kStages * 2 * kTileBytes;

  static_assert(kWarps * 16 == kPrefillTileRows, "the host tiles by kPrefillTileRows");
  static_assert(kHeadDim % 64 == 0, "the swizzle needs at least 8 chunks per row");
};

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(PrefillTiledConfig<kHeadDim>::kThreads)
    prefill_tiled_kernel(const PrefillParams p) {
  using C = PrefillTiledConfig<kHeadDim>;
  constexpr int kDimSteps = kHeadDim / 16;  // k steps of S = Q K^T
  constexpr int kDimTiles = kHeadDim / 8;   // n tiles of O
  constexpr int kKeyTiles = C::kKeysPerTile / 8;  // n tiles of S
  extern __shared__ __align__(128) uint8_t smem[];

  // Consecutive CTAs are the kv heads of one tile: the heads of the longest tiles start first.
  const PrefillTile tile = p.tiles[blockIdx.x / p.num_kv_heads];
  const int kv_head = blockIdx.x % p.num_kv_heads;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;  // mma fragment row
  const int t = lane % 4;  // mma fragment column pair
  const int num_keys = tile.first_pos + tile.num_tokens;
  const int num_key_tiles = (num_keys + C::kKeysPerTile - 1) / C::kKeysPerTile;
  const int block_mask = (1 << p.pool.block_size_log2) - 1;
  const int32_t* blocks = p.block_ids + tile.block_begin;
  const T* k_head = static_cast<const T*>(p.pool.k) + kv_head * p.pool.head_stride;
  const T* v_head = static_cast<const T*>(p.pool.v) + kv_head * p.pool.head_stride;
  const uint32_t smem_base = ptx::smem_address(smem);

  // The lane's two rows (fragment rows g and g + 8 of the warp's 16). A padding row takes the
  // last token's position, so that it computes like a real row (no empty softmax), unstored.
  const int last_token = tile.num_tokens - 1;
  int row_token[2], row_pos[2];
  bool row_valid[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = warp * 16 + g + 8 * h;
    row_token[h] = row / p.group;
    row_valid[h] = row_token[h] <= last_token;
    row_pos[h] = tile.first_pos + min(row_token[h], last_token);
  }
  const bool warp_active = warp * 16 < tile.num_tokens * p.group;
  const int warp_first_pos = tile.first_pos + min(warp * 16 / p.group, last_token);
  const int warp_last_pos = tile.first_pos + min((warp * 16 + 15) / p.group, last_token);

  // Q as A fragments: a[0] row g dims 2t, 2t+1; a[1] row g + 8; a[2], a[3] the same rows, dims + 8.
  uint32_t q_frag[kDimSteps][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = warp * 16 + g + 8 * h;
    const int64_t q_row = int64_t(tile.row_begin + min(row_token[h], last_token)) * p.num_q_heads +
                          int64_t(kv_head) * p.group + row % p.group;
    const uint32_t* q = reinterpret_cast<const uint32_t*>(static_cast<const T*>(p.q) + q_row * kHeadDim);
#pragma unroll
    for (int ks = 0; ks < kDimSteps; ++ks) {
      q_frag[ks][h] = row_valid[h] ? q[ks * 8 + t] : 0u;
      q_frag[ks][h + 2] = row_valid[h] ? q[ks * 8 + 4 + t] : 0u;
    }
  }

  // Copies: thread tid moves 16-byte chunk tid % kChunksPerRow of every kRowsPerPass-th key. The
  // block ids of its keys are read one tile before the copies that need them are issued, so no
  // copy waits on a dependent load.
  constexpr int kRowsPerPass = C::kThreads / C::kChunksPerRow;
  constexpr int kRowsPerThread = C::kKeysPerTile / kRowsPerPass;
  const int chunk = tid % C::kChunksPerRow;
  const int first_row = tid / C::kChunksPerRow;
  auto read_tile_blocks = [&](int key_tile, int32_t (&ids)[kRowsPerThread]) {
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int key = key_tile * C::kKeysPerTile + first_row + r * kRowsPerPass;
      ids[r] = key < num_keys ? blocks[key >> p.pool.block_size_log2] : -1;
    }
  };
  auto load_tile = [&](int key_tile, int stage, const int32_t (&ids)[kRowsPerThread]) {
    const uint32_t k_dst = smem_base + stage * 2 * C::kTileBytes;
    const uint32_t v_dst = k_dst + C::kTileBytes;
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int row = first_row + r * kRowsPerPass;
      const int key = key_tile * C::kKeysPerTile + row;
      const bool valid = ids[r] >= 0;
      const int64_t offset =
          valid ? int64_t(ids[r]) * p.pool.page_stride + (key & block_mask) * p.pool.token_stride + chunk * 8 : 0;
      const uint32_t dst = row * C::kRowBytes + ((chunk ^ (row & 7)) << 4);
      const uint32_t bytes = valid ? 16 : 0;  // zero-fill: P = 0 there, and 0 * V must not be NaN
      ptx::cp_async_16(k_dst + dst, k_head + offset, bytes);
      ptx::cp_async_16(v_dst + dst, v_head + offset, bytes);
    }
  };

  float o_acc[kDimTiles][4] = {};  // O: (row g, dims 8n + 2t, +1), (row g + 8, the same dims)
  float row_max[2] = {-INFINITY, -INFINITY};  // rows g, g + 8; exp2 domain
  float row_sum[2] = {0.f, 0.f};              // this lane's keys only until the end

  auto compute_tile = [&](int key_tile, int stage) {
    const int first_key = key_tile * C::kKeysPerTile;
    if (!warp_active || first_key > warp_last_pos) return;  // wholly above the diagonal
    const uint32_t k_src = smem_base + stage * 2 * C::kTileBytes;
    const uint32_t v_src = k_src + C::kTileBytes;
    const int i = lane / 8;  // which of ldmatrix's four matrices this lane addresses

    float s[kKeyTiles][4] = {};  // (row g, keys 8n + 2t, +1), (row g + 8, the same keys)
#pragma unroll
    for (int ks = 0; ks < kDimSteps; ++ks) {
#pragma unroll
      for (int kn = 0; kn < kKeyTiles / 2; ++kn) {
        // Matrices: keys 16kn + [0, 8) and + [8, 16), each dims 16ks + [0, 8) then + [8, 16).
        const int row = kn * 16 + (i >> 1) * 8 + (lane & 7);
        const int c = 2 * ks + (i & 1);
        uint32_t b[4];
        ptx::ldmatrix_x4(b, k_src + row * C::kRowBytes + ((c ^ (row & 7)) << 4));
        ptx::mma_16x8x16<T>(s[2 * kn], q_frag[ks], b[0], b[1]);
        ptx::mma_16x8x16<T>(s[2 * kn + 1], q_frag[ks], b[2], b[3]);
      }
    }

    const bool needs_mask = first_key + C::kKeysPerTile - 1 > warp_first_pos;
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // (row g, keys 8n + 2t, +1), then row g + 8
        const int key = first_key + 8 * n + 2 * t + (j & 1);
        if (needs_mask && key > row_pos[j / 2]) s[n][j] = -INFINITY;
      }
    }
    online_softmax_step(s, p.scale_log2, row_max, row_sum, o_acc);  // key 0 of every row came first: finite

#pragma unroll
    for (int kk = 0; kk < C::kKeysPerTile / 16; ++kk) {
      // P's A fragment for keys 16kk + [0, 16) is S's accumulators of key tiles 2kk and 2kk + 1.
      const uint32_t a[4] = {ptx::pack2<T>(s[2 * kk][0], s[2 * kk][1]),
                             ptx::pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                             ptx::pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             ptx::pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dn = 0; dn < kDimTiles / 2; ++dn) {
        // Matrices, transposed: keys 16kk + [0, 8) and + [8, 16) of dims 16dn + [0, 8), then of
        // dims 16dn + [8, 16): b0 and b1 of dim tiles 2dn and 2dn + 1.
        const int row = kk * 16 + (i & 1) * 8 + (lane & 7);
        const int c = 2 * dn + (i >> 1);
        uint32_t b[4];
        ptx::ldmatrix_x4_trans(b, v_src + row * C::kRowBytes + ((c ^ (row & 7)) << 4));
        ptx::mma_16x8x16<T>(o_acc[2 * dn], a, b[0], b[1]);
        ptx::mma_16x8x16<T>(o_acc[2 * dn + 1], a, b[2], b[3]);
      }
    }
  };

  // The pipeline: kStages - 1 tiles in flight ahead of the one computed; one commit group per
  // tile (empty past the end) so that wait_group counts tiles.
  int32_t ids[kRowsPerThread];
#pragma unroll 1
  for (int stage = 0; stage < C::kStages - 1; ++stage) {
    read_tile_blocks(stage, ids);
    if (stage < num_key_tiles) load_tile(stage, stage, ids);
    ptx::cp_async_commit();
  }
  read_tile_blocks(C::kStages - 1, ids);
  for (int key_tile = 0; key_tile < num_key_tiles; ++key_tile) {
    ptx::cp_async_wait<C::kStages - 2>();
    __syncthreads();  // tile landed for every thread; every warp is done with the stage reloaded next
    const int next = key_tile + C::kStages - 1;
    if (next < num_key_tiles) load_tile(next, next % C::kStages, ids);
    ptx::cp_async_commit();
    read_tile_blocks(next + 1, ids);  // in flight while this tile is computed
    compute_tile(key_tile, key_tile % C::kStages);
  }
  ptx::cp_async_wait<0>();  // nothing may be in flight into shared memory when the CTA exits

  // Epilogue: the full row sums (the 4 lanes sharing g), then o / sum to the rows that are real.
  T* out = static_cast<T*>(p.out);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = row_sum[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (!row_valid[h]) continue;
    const float inv = 1.f / sum;  // sum >= 1 (to rounding): the max key adds exp2(max - reference) >= 1
    const int row = warp * 16 + g + 8 * h;
    const int64_t out_row = int64_t(tile.row_begin + row_token[h]) * p.num_q_heads +
                            int64_t(kv_head) * p.group + row % p.group;
    uint32_t* dst = reinterpret_cast<uint32_t*>(out + out_row * kHeadDim);
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n) {
      dst[n * 4 + t] = ptx::pack2<T>(o_acc[n][2 * h] * inv, o_acc[n][2 * h + 1] * inv);
    }
  }
}

}  // namespace pagoda::cuda

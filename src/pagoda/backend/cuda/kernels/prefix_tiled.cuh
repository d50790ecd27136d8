// prefix_tiled_kernel: prefix-aware decode attention (papers/pat-prefix-aware-attention.txt), the
// executor of a PrefixPlan. A persistent grid: CTA c runs items c, c + gridDim.x, ... of the plan
// in order, and its K/V pipeline flows across item boundaries, so a CTA whose items are short
// (a 32-token private tail) never waits for a launch, a first load or a drain between them.
//
// An item is one unit of queries (rows = queries x GQA group, at most kMaxRows) over one run of
// KV tokens of one kv head. Every K/V byte lands in shared memory once and serves all the rows.
// Tensor cores, FlashAttention-2 style, the rows on the M side:
//   S [16 rows x 16 tokens]  = Q [16 x d] . K^T          (mma m16n8k16; B = K rows, ldmatrix)
//   O [16 rows x d]         += P [16 x 16 tokens] . V    (P from S's accumulators; V by ldmatrix.trans)
// The item's M tile (16, 32 or 64 rows, the tile selector's choice) sets how the 4 warps share a
// 64-token KV tile: warps_m = M / 16 warps own 16 rows each, and the 4 / warps_m warps of one row
// block split the tile's tokens. Each warp keeps its own online-softmax state (exp2 domain, one
// rescale per 16 tokens); at the end of an item the warps of a row block merge with ⊕ through
// shared memory and write the output rows, or the partial states the plan's merges fold.
//
// Stages: kStages buffers, each a K tile, a V tile and a Q slot. An item's first tile carries its
// Q rows (zero-filled past the item's rows); the warps copy them into registers when they compute
// that tile, before the stage is reused. 16-byte chunk c of every shared row r is stored at chunk
// c ^ (r % 8), so the 8 row addresses of each ldmatrix fall in distinct bank groups.
//
// Metadata runs ahead of the copies so that no copy waits on a dependent load: block ids and the
// query rows of a tile are read one iteration before its copies are issued, and the unit of the
// next item when the loader starts an item.
// KV that other items also read (kv_shared: one node's row chunks) is first prefetched into L2
// marked evict_last, one instruction per 128-byte line, so that it outlives the streamed rest.
#pragma once

#include <cmath>
#include <cstdint>

#include "pagoda/backend/cuda/kernels/prefix_params.h"
#include "pagoda/backend/cuda/kernels/ptx.cuh"

namespace pagoda::cuda {

template <int kHeadDim>
struct PrefixTiledConfig {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kTileTokens = 64;
  static constexpr int kMaxRows = kWarps * 16;  // one m16 fragment per warp (prefix_attention.cpp)
  static constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr int kKvTileBytes = kTileTokens * kRowBytes;  // K or V of one tile
  static constexpr int kQBytes = kMaxRows * kRowBytes;
  static constexpr int kStageBytes = 2 * kKvTileBytes + kQBytes;
  // Three tiles in flight behind the computed one: 96 KB of KV per SM at head_dim 128, which
  // covers HBM latency at full bandwidth with one CTA per SM.
  static constexpr int kStages = 4;
  // The ⊕ of the warps that split a tile's tokens: 3 warps hand over 16 rows of o, max and sum.
  static constexpr int kReduceSlots = kWarps - 1;
  static constexpr int kReduceFloats = kReduceSlots * 16 * (kHeadDim + 2);
  static constexpr int kSmemBytes = kStages * kStageBytes + kReduceFloats * 4;

  static_assert(kHeadDim % 64 == 0, "the swizzle needs at least 8 chunks per row");
};

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(PrefixTiledConfig<kHeadDim>::kThreads, 1)
    prefix_tiled_kernel(const PrefixParams p) {
  using C = PrefixTiledConfig<kHeadDim>;
  constexpr int kDimSteps = kHeadDim / 16;  // k steps of S = Q K^T
  constexpr int kDimTiles = kHeadDim / 8;   // n tiles of O
  constexpr int kRowsPerPass = C::kThreads / C::kChunksPerRow;
  constexpr int kKvRowsPerThread = C::kTileTokens / kRowsPerPass;
  constexpr int kQRowsPerThread = C::kMaxRows / kRowsPerPass;
  extern __shared__ __align__(128) uint8_t smem[];

  ptx::launch_dependents();  // the merge may start its launch while this grid runs
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;  // mma fragment row
  const int t = lane % 4;  // mma fragment column pair
  const int block_mask = (1 << p.block_size_log2) - 1;
  const uint32_t smem_base = ptx::smem_address(smem);
  float* reduce = reinterpret_cast<float*>(smem + C::kStages * C::kStageBytes);
  auto k_stage = [&](int stage) { return smem_base + uint32_t(stage * C::kStageBytes); };
  auto swizzled = [](int row, int chunk) { return uint32_t(row * C::kRowBytes + ((chunk ^ (row & 7)) << 4)); };
  // The CTA's n-th item is plan item blockIdx.x + n * gridDim.x.
  auto ordinal = [&](int n) { return int(blockIdx.x) + n * int(gridDim.x); };

  struct Unit {  // one item's plan entry; kv_head -1 past the CTA's last item
    int32_t block_begin, num_tokens, query_begin, rows, kv_shared, kv_head;
  };
  auto read_unit = [&](int n) {
    if (ordinal(n) >= p.num_items) return Unit{0, 0, 0, 0, 0, -1};
    const attention::PrefixUnit& u = p.units[ordinal(n) / p.num_kv_heads];
    return Unit{__ldg(&u.block_begin), __ldg(&u.num_tokens), __ldg(&u.query_begin),
                __ldg(&u.num_queries) * p.group, __ldg(&u.kv_shared), ordinal(n) % p.num_kv_heads};
  };
  auto num_tiles = [](const Unit& u) { return (u.num_tokens + C::kTileTokens - 1) / C::kTileTokens; };

  // ---- The loader: thread tid copies 16-byte chunk tid % kChunksPerRow of every
  // kRowsPerPass-th row of a K/V tile and of a Q slot.
  const int chunk = tid % C::kChunksPerRow;
  const int first_row = tid / C::kChunksPerRow;
  struct TileRef {  // what the copies of one tile need, read an iteration ahead
    int32_t ids[kKvRowsPerThread];
    int32_t q_seqs[kQRowsPerThread];  // sequence of the Q row, -1: zero-fill (first tile only)
  };
  Unit load_unit = read_unit(0);  // the item the loader is in
  Unit next_unit = read_unit(1);
  int load_n = 0, load_tile = 0;  // the loader's position: item n of the CTA, tile of the item
  auto prepare = [&](TileRef& ref) {
#pragma unroll
    for (int r = 0; r < kKvRowsPerThread; ++r) {
      const int token = load_tile * C::kTileTokens + first_row + r * kRowsPerPass;
      ref.ids[r] = token < load_unit.num_tokens ? __ldg(p.block_ids + load_unit.block_begin + (token >> p.block_size_log2))
                                                : -1;
    }
    if (load_tile == 0) {
#pragma unroll
      for (int r = 0; r < kQRowsPerThread; ++r) {
        const int row = first_row + r * kRowsPerPass;
        ref.q_seqs[r] = row < load_unit.rows ? __ldg(&p.unit_queries[load_unit.query_begin + row / p.group].seq) : -1;
      }
    }
  };
  // Copies the prepared tile (the loader's position) into `stage`, then moves the loader on.
  auto issue = [&](const TileRef& ref, int stage) {
    if (load_unit.kv_head < 0) return;  // past the CTA's last item
    const T* k_head = static_cast<const T*>(p.k) + load_unit.kv_head * p.head_stride;
    const T* v_head = static_cast<const T*>(p.v) + load_unit.kv_head * p.head_stride;
    const uint32_t k_dst = k_stage(stage);
    const uint32_t v_dst = k_dst + C::kKvTileBytes;
#pragma unroll
    for (int r = 0; r < kKvRowsPerThread; ++r) {
      const int row = first_row + r * kRowsPerPass;
      const int token = load_tile * C::kTileTokens + row;
      const bool valid = ref.ids[r] >= 0;
      const int64_t offset =
          valid ? int64_t(ref.ids[r]) * p.page_stride + (token & block_mask) * p.token_stride + chunk * 8 : 0;
      const uint32_t bytes = valid ? 16 : 0;  // zero-fill: P = 0 there, and 0 * V must not be NaN
      if (load_unit.kv_shared && valid && chunk % 8 == 0) {
        ptx::prefetch_l2_evict_last(k_head + offset);
        ptx::prefetch_l2_evict_last(v_head + offset);
      }
      ptx::cp_async_16(k_dst + swizzled(row, chunk), k_head + offset, bytes);
      ptx::cp_async_16(v_dst + swizzled(row, chunk), v_head + offset, bytes);
    }
    if (load_tile == 0) {
      const uint32_t q_dst = v_dst + C::kKvTileBytes;
      const T* q = static_cast<const T*>(p.q);
#pragma unroll
      for (int r = 0; r < kQRowsPerThread; ++r) {
        const int row = first_row + r * kRowsPerPass;
        const bool valid = ref.q_seqs[r] >= 0;
        const int64_t q_row = int64_t(ref.q_seqs[r]) * p.num_q_heads + int64_t(load_unit.kv_head) * p.group + row % p.group;
        ptx::cp_async_16(q_dst + swizzled(row, chunk), q + (valid ? q_row * kHeadDim + chunk * 8 : 0), valid ? 16 : 0);
      }
    }
    if (++load_tile == num_tiles(load_unit)) {
      load_tile = 0;
      ++load_n;
      load_unit = next_unit;
      next_unit = read_unit(load_n + 1);  // in flight until the loader reaches that item
    }
  };

  // ---- The computing warps: the item they are in and their share of it.
  Unit unit{};
  int warps_m = 1, wm = 0, wn = 0, slice = C::kTileTokens;  // this warp: rows 16 wm.., tokens slice wn
  uint32_t q_frag[kDimSteps][4];
  float o_acc[kDimTiles][4];
  float row_max[2], row_sum[2];  // rows g, g + 8 of the warp's 16; exp2 domain; lane-partial sums
  auto start_item = [&](int n, int stage) {
    unit = read_unit(n);  // the loader read these lines: L1 hits
    warps_m = unit.rows <= 16 ? 1 : unit.rows <= 32 ? 2 : 4;
    wm = warp % warps_m;
    wn = warp / warps_m;
    slice = C::kTileTokens * warps_m / C::kWarps;
    const uint32_t q_src = k_stage(stage) + 2 * C::kKvTileBytes;
    const int i = lane / 8;  // which of ldmatrix's four matrices this lane addresses
#pragma unroll
    for (int ks = 0; ks < kDimSteps; ++ks) {
      // A fragments: rows 16 wm + [0, 8) and + [8, 16), dims 16 ks + [0, 8) then + [8, 16).
      ptx::ldmatrix_x4(q_frag[ks], q_src + swizzled(wm * 16 + (i & 1) * 8 + (lane & 7), 2 * ks + (i >> 1)));
    }
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n) o_acc[n][0] = o_acc[n][1] = o_acc[n][2] = o_acc[n][3] = 0.f;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;
  };

  // 16 tokens [first, first + 16) of the tile in `stage`; first is tile-relative, token0 the
  // item-relative index of the tile's token 0.
  auto compute_chunk = [&](int stage, int first, int token0) {
    const uint32_t k_src = k_stage(stage);
    const uint32_t v_src = k_src + C::kKvTileBytes;
    const int i = lane / 8;
    float s[2][4] = {};  // (row g, tokens 8n + 2t, +1), (row g + 8, the same tokens)
#pragma unroll
    for (int ks = 0; ks < kDimSteps; ++ks) {
      uint32_t b[4];  // tokens [0, 8) then [8, 16) of the chunk, dims 16 ks + [0, 8) and + [8, 16)
      ptx::ldmatrix_x4(b, k_src + swizzled(first + (i >> 1) * 8 + (lane & 7), 2 * ks + (i & 1)));
      ptx::mma_16x8x16<T>(s[0], q_frag[ks], b[0], b[1]);
      ptx::mma_16x8x16<T>(s[1], q_frag[ks], b[2], b[3]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float chunk_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[n][2 * h + e];
          x = token0 + first + 8 * n + 2 * t + e < unit.num_tokens ? x * p.scale_log2 : -INFINITY;
          chunk_max = fmaxf(chunk_max, x);
        }
      }
      chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, 1));
      chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, 2));
      const float new_max = fmaxf(row_max[h], chunk_max);  // finite: the chunk's first token is real
      const float correction = exp2f(row_max[h] - new_max);  // 0 on the warp's first chunk
      row_max[h] = new_max;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[n][2 * h + e];
          x = exp2f(x - new_max);
          sum += x;
        }
      }
      row_sum[h] = row_sum[h] * correction + sum;
#pragma unroll
      for (int n = 0; n < kDimTiles; ++n) {
        o_acc[n][2 * h] *= correction;
        o_acc[n][2 * h + 1] *= correction;
      }
    }
    const uint32_t a[4] = {ptx::pack2<T>(s[0][0], s[0][1]), ptx::pack2<T>(s[0][2], s[0][3]),
                           ptx::pack2<T>(s[1][0], s[1][1]), ptx::pack2<T>(s[1][2], s[1][3])};
#pragma unroll
    for (int dn = 0; dn < kDimTiles / 2; ++dn) {
      // Transposed: tokens [0, 8) and [8, 16) of dims 16 dn + [0, 8), then of dims + [8, 16).
      uint32_t b[4];
      ptx::ldmatrix_x4_trans(b, v_src + swizzled(first + (i & 1) * 8 + (lane & 7), 2 * dn + (i >> 1)));
      ptx::mma_16x8x16<T>(o_acc[2 * dn], a, b[0], b[1]);
      ptx::mma_16x8x16<T>(o_acc[2 * dn + 1], a, b[2], b[3]);
    }
  };

  // The end of an item: ⊕ over the warps of each row block, then the rows' states to the output
  // or to their partial slots.
  auto finish_item = [&]() {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 1);
      row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 2);
    }
    const int warps_n = C::kWarps / warps_m;
    if (warps_n > 1) {  // CTA-uniform: every warp reaches the barrier
      if (wn > 0) {
        float* slot = reduce + ((wn - 1) * warps_m + wm) * 16 * (kHeadDim + 2);
#pragma unroll
        for (int n = 0; n < kDimTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) slot[(g + 8 * (e >> 1)) * kHeadDim + 8 * n + 2 * t + (e & 1)] = o_acc[n][e];
        }
        if (t == 0) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            slot[16 * kHeadDim + g + 8 * h] = row_max[h];
            slot[16 * kHeadDim + 16 + g + 8 * h] = row_sum[h];
          }
        }
      }
      __syncthreads();
      if (wn > 0) return;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float max = row_max[h];
        for (int j = 1; j < warps_n; ++j) {
          max = fmaxf(max, reduce[((j - 1) * warps_m + wm) * 16 * (kHeadDim + 2) + 16 * kHeadDim + g + 8 * h]);
        }
        const float own = exp2f(row_max[h] - max);
        float sum = row_sum[h] * own;
#pragma unroll
        for (int n = 0; n < kDimTiles; ++n) {
          o_acc[n][2 * h] *= own;
          o_acc[n][2 * h + 1] *= own;
        }
        for (int j = 1; j < warps_n; ++j) {
          const float* slot = reduce + ((j - 1) * warps_m + wm) * 16 * (kHeadDim + 2);
          const float weight = exp2f(slot[16 * kHeadDim + g + 8 * h] - max);  // 0 for a warp with no token
          sum += slot[16 * kHeadDim + 16 + g + 8 * h] * weight;
#pragma unroll
          for (int n = 0; n < kDimTiles; ++n) {
            const float2 o = *reinterpret_cast<const float2*>(&slot[(g + 8 * h) * kHeadDim + 8 * n + 2 * t]);
            o_acc[n][2 * h] += o.x * weight;
            o_acc[n][2 * h + 1] += o.y * weight;
          }
        }
        row_max[h] = max;
        row_sum[h] = sum;
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = wm * 16 + g + 8 * h;
      if (row >= unit.rows) continue;
      const attention::UnitQuery uq = p.unit_queries[unit.query_begin + row / p.group];
      const int head = row % p.group;
      const float inv = 1.f / row_sum[h];  // >= 1: the row's max token contributes exp2(0)
      const float lse = row_max[h] * float(M_LN2) + logf(row_sum[h]);
      if (uq.piece < 0) {
        const int64_t out_row = int64_t(uq.seq) * p.num_q_heads + int64_t(unit.kv_head) * p.group + head;
        uint32_t* dst = reinterpret_cast<uint32_t*>(static_cast<T*>(p.out) + out_row * kHeadDim);
#pragma unroll
        for (int n = 0; n < kDimTiles; ++n) dst[n * 4 + t] = ptx::pack2<T>(o_acc[n][2 * h] * inv, o_acc[n][2 * h + 1] * inv);
        if (p.lse && t == 0) p.lse[out_row] = lse;
      } else {
        const int64_t slot = (int64_t(unit.kv_head) * p.num_pieces + uq.piece) * p.group + head;
        float2* dst = reinterpret_cast<float2*>(p.partial_o + slot * kHeadDim);
#pragma unroll
        for (int n = 0; n < kDimTiles; ++n) dst[n * 4 + t] = make_float2(o_acc[n][2 * h] * inv, o_acc[n][2 * h + 1] * inv);
        if (t == 0) p.partial_lse[slot] = lse;
      }
    }
  };

  // ---- The pipeline: kStages - 1 tiles in flight ahead of the one computed, one commit group
  // per tile (empty past the CTA's last tile) so that wait_group counts tiles.
  TileRef ref;
#pragma unroll 1
  for (int stage = 0; stage < C::kStages - 1; ++stage) {
    prepare(ref);
    issue(ref, stage);
    ptx::cp_async_commit();
  }
  prepare(ref);
  int n = 0, tile = 0;  // the computing position
#pragma unroll 1
  for (int iteration = 0; ordinal(n) < p.num_items; ++iteration) {
    ptx::cp_async_wait<C::kStages - 2>();
    __syncthreads();  // the tile landed for every thread; every warp is done with the stage reloaded next
    issue(ref, (iteration + C::kStages - 1) % C::kStages);
    ptx::cp_async_commit();
    prepare(ref);  // its loads are in flight while this tile is computed
    const int stage = iteration % C::kStages;
    if (tile == 0) start_item(n, stage);
    const int token0 = tile * C::kTileTokens;
#pragma unroll 1
    for (int first = wn * slice; first < (wn + 1) * slice && token0 + first < unit.num_tokens; first += 16) {
      compute_chunk(stage, first, token0);
    }
    if (++tile == num_tiles(unit)) {
      finish_item();
      tile = 0;
      ++n;
    }
  }
  ptx::cp_async_wait<0>();  // nothing may be in flight into shared memory when the CTA exits
}

}  // namespace pagoda::cuda

// prefix_tiled_kernel: prefix-aware decode attention (the PAT paper, arXiv:2511.22333), the
// executor of a PrefixPlan. A persistent grid: CTA c runs the items the schedule gives it
// (prefix_schedule: longest processing time first), in order, and its K/V pipeline flows across
// item boundaries, so a CTA whose items are short (a 32-token private tail) never waits for a
// launch, a first load or a drain between them.
//
// An item is one unit of queries (rows = queries x GQA group, at most kMaxRows) over one run of
// KV tokens of one kv head, or a pair of units of at most 32 tokens each (KernelUnit): the first's
// tokens fill tile rows [0, 32), the second's the rest, and each row is masked to its own unit's
// tokens. Every K/V byte lands in shared memory once and serves all the rows. A unit with tails
// (PrefixPlan::unit_tails: its queries' private leaves, the nodes below it) reads them in tail
// tiles (PrefixTailTile) after its own KV, or among it where other items read that KV too: two
// tails of at most 32 tokens in the halves of a tile, or a longer one in whole tiles, each row
// masked to its query's, computed by the warps holding those rows; they fold into the rows'
// state in registers instead of leaving partial states for the merge.
// Tensor cores, FlashAttention-2 style, the rows on the M side:
//   S [16 rows x 16 tokens]  = Q [16 x d] . K^T          (mma m16n8k16; B = K rows, ldmatrix)
//   O [16 rows x d]         += P [16 x 16 tokens] . V    (P from S's accumulators; V by ldmatrix.trans)
// The item's M tile (16, 32, 64 or 128 rows, the tile selector's choice) sets how the computing
// warps share a 64-token KV tile. At M = 128 each of the 8 owns 16 rows and the whole tile. At
// most 64 rows, the first 4 share it: warps_m = M / 16 of them own 16 rows each, and the
// 4 / warps_m warps of one row block split the tile's tokens. M = 128 halves the times a node
// read by many queries streams through the SM at GQA groups of 4 and 8 (each chunk of rows reads
// it again); with 4 warps, the other 4 pass the stages by (two warps of one scheduler splitting
// a tile's tokens, or taking its tiles in turn, was slower: the ⊕ and its barriers cost more
// than the second warp's latency hiding gave). Each warp keeps its own online-softmax state (exp2
// domain, rescaled lazily: online_softmax.cuh); at the end of an item the warps of a row block
// merge with ⊕ through shared memory and write the output rows, or the partial states the
// plan's merges fold. A solo item (one tile, at most 16 rows: a short private tail) is computed
// whole by one warp, chosen round-robin by stage, while the others go on to the next stages:
// four such items proceed at once, and none waits on a barrier. A one-tile item of 17-32 rows
// (a small node) goes the same way to two warps, 0-1 or 2-3 by stage, each owning 16 rows
// and the whole tile: no ⊕, whose barrier would wait for all four warps to be done with their
// earlier stages (docs/experiments/prefix-attention.md).
//
// Warp roles. Four more warps, the producers, only move data (and give the consumers their
// registers: setmaxnreg): they run up to kStages tiles ahead of the computing warps (the
// consumers), so that a stall on their own loads never stalls the math, and as many tiles of K
// and V (128 KB at head_dim 128) are in flight per SM. K and V come by the tensor memory
// accelerator, one instruction per 16 tokens of a block (kv_tensor_map.h). Stage s has a "full"
// mbarrier (the producer's copies landed: the tensor copies' bytes, cp.async arrivals, plus its
// plain arrivals after writing the stage's tile description) and an "empty" one (every consumer
// warp is done with it).
// The producer itself reads metadata kLookahead tiles before it copies the tile: the tile's block
// ids and, at an item's first tile, the item's (sequence, piece) list, by cp.async into small
// rings, and the plan's units 32 items ahead, one per lane. So the only loads any warp waits on
// are ones it issued several tiles earlier.
//
// An item's first tile carries its Q rows in the stage's Q slot (zero past the item's rows), its
// second tile rows 64 to 127 (kernel_units gives an item of more than 64 rows at least two
// tiles); the consumers copy them into registers when they compute the item's first tile.
// K, V and Q tiles lie in shared memory as the tensor copies land them (`swizzled`). KV that
// other items also read (kv_shared: a node's row chunks, and units that read their ancestors'
// KV) is copied marked evict_last in L2, the rest evict_first.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "pagoda/backend/cuda/kernels/online_softmax.cuh"
#include "pagoda/backend/cuda/kernels/prefix_params.h"
#include "pagoda/backend/cuda/kernels/ptx.cuh"
#include "pagoda/backend/cuda/kv_tensor_map.h"

namespace pagoda::cuda {

// What the producer knows of one tile: written by its look-ahead, read by its copy step and (as
// the stage's copy) by the consumers.
struct alignas(8) PrefixTileDesc {  // 8: the mbarriers after the descriptor arrays
  // A tail tile's PrefixTailTile, word for word (one cp.async a lane); else the block ids of the
  // tile's tokens (64 / block_size of them, by cp.async) and tail_warps 0.
  int32_t ids[4];
  int32_t tail_first;   // tokens of the first tail, from row 0
  int32_t tail_second;  // of the second, from row 32
  int32_t tail_first_begin, tail_first_end;    // the item's queries that read the first tail
  int32_t tail_second_begin, tail_second_end;  // and the second
  int32_t tail_warps;                          // bit w: warp w computes the tile; 0: shared KV
  int32_t num_tokens; // of the item's shared KV
  int32_t tile;       // a shared tile: its index among the item's; a tail tile: its place in the item (>= 1)
  int32_t last;       // 1: the item's last tile
  int32_t kv_head;    // -1: past the CTA's last item (the consumers stop there)
  int32_t rows;       // query rows of the item
  int32_t kv_shared;
  int32_t query_slot;  // slot of the item's (sequence, piece) list in the query ring
  int32_t pair_split;  // a pair (KernelUnit): the first unit's tokens, at rows [0, 32); else 0
  int32_t first_rows;  // a pair: the first unit's query rows
};

template <int kHeadDim>
struct PrefixTiledConfig {
  // Eight computing warps: all of them on an item of more than 64 rows, one 16-row block each;
  // the first four on the others.
  static constexpr int kConsumerWarps = 8;
  static constexpr int kItemWarps = 4;  // the warps of an item of at most kStageQRows rows
  // One warpgroup of producers (setmaxnreg moves registers by warpgroups): warp w copies the
  // 16-row group w of each tile, and all four the Q rows.
  static constexpr int kProducerWarps = 4;
  static constexpr int kThreads = (kConsumerWarps + kProducerWarps) * 32;
  static constexpr int kConsumerThreads = kConsumerWarps * 32;
  static constexpr int kProducerThreads = kProducerWarps * 32;
  static constexpr int kTileTokens = kPrefixTileTokens;
  static constexpr int kMaxRows = kConsumerWarps * 16;  // one m16 fragment per warp (prefix_attention.h)
  // A stage's Q slot holds 64 rows: an item of more rows spans at least two tiles
  // (kernel_units), and its rows from 64 on ride in its second tile's stage.
  static constexpr int kStageQRows = kItemWarps * 16;
  static constexpr int kChunksPerRow = kHeadDim / 8;     // 16-byte chunks
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr int kKvTileBytes = kTileTokens * kRowBytes;  // K or V of one tile
  static constexpr int kGroupBytes = kKvMapBoxTokens * kRowBytes;  // one tensor copy's 16 rows
  static constexpr int kGroupHalfBytes = kKvMapBoxTokens * 128;     // their 64-element halves, one after the other
  static constexpr int kQBytes = kStageQRows * kRowBytes;
  static constexpr int kStageBytes = 2 * kKvTileBytes + kQBytes;
  static constexpr int kStages = 4;
  // Tiles between the producer's metadata reads and its copies: 3 was the fastest over the
  // prefix-tree batches (docs/experiments/prefix-attention.md). A commit group
  // holds a tile's cp.async (Q rows, partial groups) and the metadata reads issued after them, so
  // waiting for a tile's metadata waits for those kLookahead tiles back too; the tensor copies
  // are outside the groups.
  static constexpr int kLookahead = 3;
  // Items whose (sequence, piece) lists are live at once: those between the look-ahead and the
  // consumers, at most kLookahead + kStages + 1 of them (one-tile items).
  static constexpr int kQuerySlots = 12;
  // Registers: the producers give theirs to the consumers (S, O and Q fragments).
  static constexpr int kProducerRegisters = 104;
  static constexpr int kConsumerRegisters = 200;
  // The ⊕ of the warps that split a tile's tokens: 3 warps hand over 16 rows of o / sum (in T, as
  // the plan's partial states), then 16 maxima and 16 sums. Rows are padded to kReduceStride
  // elements (68 words): the 4-byte accesses of a warp's 8 rows x 4 columns fall in distinct banks.
  static constexpr int kReduceStride = kHeadDim + 8;
  static constexpr int kReduceSlotBytes = 16 * kReduceStride * 2 + 32 * 4;

  // Shared memory, in this order.
  static constexpr int kReduceOffset = kStages * kStageBytes;
  static constexpr int kQueryRingOffset = kReduceOffset + (kItemWarps - 1) * kReduceSlotBytes;
  static constexpr int kDescRingOffset = kQueryRingOffset + kQuerySlots * kMaxRows * 8;
  static constexpr int kStageDescOffset = kDescRingOffset + (kLookahead + 1) * int(sizeof(PrefixTileDesc));
  static constexpr int kBarrierOffset = kStageDescOffset + kStages * int(sizeof(PrefixTileDesc));
  static constexpr int kSmemBytes = kBarrierOffset + 2 * kStages * 8;

  static_assert(kHeadDim % 64 == 0, "the swizzle needs at least 8 chunks per row");
  static_assert(kQuerySlots >= kLookahead + kStages + 1);
  static_assert(kMaxRows == 128 && kStageQRows == 64, "prefix_m_tile's M tiles");
  static_assert(kStageQRows == kPrefixOneTileRows);
  static_assert(kProducerThreads % 128 == 0 && kConsumerThreads % 128 == 0, "whole warpgroups");
  static_assert(kProducerRegisters * kProducerThreads + kConsumerRegisters * kConsumerThreads <=
                    65536 / kThreads / 8 * 8 * kThreads,
                "within the registers of __launch_bounds__(kThreads, 1)");
  static_assert(kBarrierOffset % 8 == 0);
  static_assert(kKvMapBoxTokens == 16 && kProducerWarps * kKvMapBoxTokens == kTileTokens,
                "one producer warp per tensor copy's 16 rows, the swizzle's groups (`swizzled`)");
};

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(PrefixTiledConfig<kHeadDim>::kThreads, 1)
    prefix_tiled_kernel(const __grid_constant__ PrefixParams p) {
  using C = PrefixTiledConfig<kHeadDim>;
  extern __shared__ __align__(1024) uint8_t smem[];  // 1024: the tensor copies' swizzle repeats every 1024 bytes

  ptx::launch_dependents();  // the merge may start its launch while this grid runs
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const uint32_t smem_base = ptx::smem_address(smem);
  auto stage_base = [&](int stage) { return smem_base + uint32_t(stage * C::kStageBytes); };
  auto full_barrier = [&](int stage) { return smem_base + uint32_t(C::kBarrierOffset + stage * 8); };
  auto empty_barrier = [&](int stage) { return smem_base + uint32_t(C::kBarrierOffset + (C::kStages + stage) * 8); };
  auto* stage_desc = reinterpret_cast<volatile PrefixTileDesc*>(smem + C::kStageDescOffset);
  auto* query_ring = reinterpret_cast<const attention::UnitQuery*>(smem + C::kQueryRingOffset);
  // A K, V or Q tile in shared memory, as a tensor copy of 16 rows lands (kv_tensor_map.h): 16-row
  // groups of [head_dim / 64][16 rows][128 bytes], 16-byte chunk c of row r's 128 bytes stored at
  // c ^ (r % 8) (the 128-byte swizzle), so the 8 row addresses of each ldmatrix hit distinct bank
  // groups. Row 16 a + b (b < 16) lies 16 a rows of bytes past row b: callers whose rows start at
  // a multiple of 16 add that themselves, leaving the per-lane part to this.
  auto swizzled = [](int row, int chunk) {
    return uint32_t((row >> 4) * C::kGroupBytes + (chunk >> 3) * C::kGroupHalfBytes + (row & 15) * 128 + (((chunk ^ row) & 7) << 4));
  };
  // The consumers' ldmatrix addresses: a lane reads chunk 2 k + h of its row (h: 0 or 1, by the
  // lane's matrix), whose offset is chunk h's (`lane_offset`) with bits 4-6 flipped by 2 k % 8,
  // in half k / 4: one XOR per k.
  auto chunk_pair = [](uint32_t lane_offset, int k) {
    return (lane_offset ^ uint32_t((2 * k & 7) << 4)) + uint32_t(k >> 2) * C::kGroupHalfBytes;
  };
  // The schedule's slot of the CTA's n-th item (prefix_schedule).
  auto slot_of = [](int n) { return int(blockIdx.x) + n * int(gridDim.x); };

  // The look-ahead's first units are fetched into L1, and the tensor maps into the descriptor
  // cache, while the barriers are set up. The units' round trip is the first link of the chain of
  // dependent steps that ends at the CTA's first tile, which a short launch waits on. Loads here
  // instead would keep their 22 registers live across the set-up and spill.
  if (warp == C::kConsumerWarps) {
    if (lane == 0) {
      ptx::prefetch_tensor_map(&p.k_map);
      ptx::prefetch_tensor_map(&p.v_map);
    }
    const int slot = slot_of(lane);
    if (slot < p.num_slots) {
      ptx::prefetch_l1(&p.slot_units[slot].block_begin);
      ptx::prefetch_l1(&p.slot_units[slot].tail_tiles);
      ptx::prefetch_l1(&p.slot_heads[slot]);
    }
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      ptx::mbarrier_init(full_barrier(s), 2 * C::kProducerThreads);  // a cp.async and a plain arrival each
      ptx::mbarrier_init(empty_barrier(s), C::kConsumerWarps);
    }
  }
  __syncthreads();

  if (warp >= C::kConsumerWarps) {
    // ---------------- The producers: the first warp also looks ahead ----------------
    ptx::shrink_registers<C::kProducerRegisters>();
    const int producer = threadIdx.x - C::kConsumerThreads;
    const bool looks_ahead = warp == C::kConsumerWarps;
    // The plan's units, one item per lane: window items [window, window + 32) and the next 32.
    // num_tokens: the tile rows the item spans (a pair: 32 + the second unit's tokens).
    struct Unit {
      int32_t block_begin, num_tokens, query_begin, rows, kv_shared, kv_head;  // kv_head -1: none
      int32_t second_block_begin, pair_split, first_rows, tail_begin, tail_tiles;
    };
    auto read_unit = [&](int n) {  // the CTA's n-th item: its unit and kv head, loaded side by side
      const int slot = slot_of(n);
      if (slot >= p.num_slots) return Unit{0, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0};
      const KernelUnit& u = p.slot_units[slot];
      const int second_tokens = __ldg(&u.second_tokens), num_tokens = __ldg(&u.num_tokens);
      const bool pair = second_tokens > 0;
      return Unit{__ldg(&u.block_begin), pair ? C::kTileTokens / 2 + second_tokens : num_tokens,
                  __ldg(&u.query_begin), __ldg(&u.rows), __ldg(&u.kv_shared), __ldg(&p.slot_heads[slot]),
                  __ldg(&u.second_block_begin), pair ? num_tokens : 0, __ldg(&u.first_rows),
                  __ldg(&u.tail_begin), __ldg(&u.tail_tiles)};
    };
    int window = 0;
    Unit window_units = read_unit(lane), next_units = read_unit(32 + lane);
    auto unit_of = [&](int n) {  // n: warp-uniform, never behind the window
      if (n >= window + 32) {
        window += 32;
        window_units = next_units;
        next_units = read_unit(window + 32 + lane);
      }
      const int from = n - window;
      return Unit{__shfl_sync(0xffffffffu, window_units.block_begin, from),
                  __shfl_sync(0xffffffffu, window_units.num_tokens, from),
                  __shfl_sync(0xffffffffu, window_units.query_begin, from),
                  __shfl_sync(0xffffffffu, window_units.rows, from),
                  __shfl_sync(0xffffffffu, window_units.kv_shared, from),
                  __shfl_sync(0xffffffffu, window_units.kv_head, from),
                  __shfl_sync(0xffffffffu, window_units.second_block_begin, from),
                  __shfl_sync(0xffffffffu, window_units.pair_split, from),
                  __shfl_sync(0xffffffffu, window_units.first_rows, from),
                  __shfl_sync(0xffffffffu, window_units.tail_begin, from),
                  __shfl_sync(0xffffffffu, window_units.tail_tiles, from)};
    };

    // The look-ahead: describes tile `step` of the CTA into desc ring slot step % (kLookahead + 1).
    auto* desc_ring = reinterpret_cast<PrefixTileDesc*>(smem + C::kDescRingOffset);
    const int blocks_per_tile = C::kTileTokens >> p.pool.block_size_log2;
    int ahead_n = 0, ahead_tile = 0, ahead_shared = 0;  // ahead_shared: of the item's tiles so far
    Unit ahead = unit_of(0);
    auto look_ahead = [&](int step) {
      if (!looks_ahead) return;
      PrefixTileDesc& d = desc_ring[step % (C::kLookahead + 1)];
      const int shared_tiles = (ahead.num_tokens + C::kTileTokens - 1) / C::kTileTokens;
      const int num_tiles = shared_tiles + ahead.tail_tiles;
      // KV other items read too (kv_shared) comes from L2 for all but the first of them: its tiles
      // are spread evenly among the item's tail tiles, which come from DRAM, so that the CTAs
      // reading one node together keep asking DRAM for bytes at its rate rather than first idling
      // it on the node and then all wanting their tails (docs/experiments/prefix-attention.md).
      // An item starts with its first two
      // shared tiles, or its only one: a shared tile's `tile` is its index among them, a tail
      // tile's its place in the item, and `tile` 0 and 1 carry the item's Q rows.
      const int tails_done = ahead_tile - ahead_shared;
      bool tail = false;
      if (ahead.tail_tiles > 0 && ahead.kv_head >= 0) {  // else (most items) no arithmetic on the copies' path
        const int lead = min(shared_tiles, 2), rest = shared_tiles - lead;
        tail = ahead_shared >= lead &&
               (ahead_shared == shared_tiles ||
                (ahead.kv_shared && tails_done < ahead.tail_tiles &&
                 (2 * (ahead_shared - lead) + 1) * ahead.tail_tiles > (2 * tails_done + 1) * rest));
      }
      if (lane == 0) {
        if (!tail) d.tail_warps = 0;
        d.num_tokens = ahead.num_tokens;
        d.tile = tail ? ahead_tile : ahead_shared;
        d.last = ahead_tile == num_tiles - 1;
        d.kv_head = ahead.kv_head;
        d.rows = ahead.rows;
        d.kv_shared = ahead.kv_shared;
        d.query_slot = ahead_n % C::kQuerySlots;
        d.pair_split = ahead.pair_split;
        d.first_rows = ahead.first_rows;
      }
      if (ahead.kv_head < 0) return;
      if (tail) {  // the tail tile's description, ids included, as the host wrote it
        constexpr int kWords = sizeof(PrefixTailTile) / 4;
        static_assert(kWords == 11 && offsetof(PrefixTileDesc, tail_warps) == (kWords - 1) * 4);
        const int32_t* src = &p.tail_tiles[ahead.tail_begin + tails_done].ids[0];
        if (lane < kWords) ptx::cp_async_small<4>(ptx::smem_address(&d.ids[0]) + 4 * lane, src + lane);
      } else {
        // A pair's tile: the first unit's blocks in its first half, the second's in the other.
        const bool second = ahead.pair_split > 0 && lane >= blocks_per_tile / 2;
        const int block = second ? lane - blocks_per_tile / 2 : ahead_shared * blocks_per_tile + lane;
        const int tokens = ahead.pair_split == 0 ? ahead.num_tokens
                           : second              ? ahead.num_tokens - C::kTileTokens / 2
                                                 : ahead.pair_split;
        if (lane < blocks_per_tile && block << p.pool.block_size_log2 < tokens) {
          ptx::cp_async_small<4>(ptx::smem_address(&d.ids[lane]),
                                 p.block_ids + (second ? ahead.second_block_begin : ahead.block_begin) + block);
        }
      }
      if (ahead_tile == 0) {  // the item's (sequence, piece) list, for its Q rows and its outputs
        const uint32_t slot = smem_base + C::kQueryRingOffset + (ahead_n % C::kQuerySlots) * C::kMaxRows * 8;
        for (int j = lane; j * p.group < ahead.rows; j += 32) {
          ptx::cp_async_small<8>(slot + j * 8, p.unit_queries + ahead.query_begin + j);
        }
      }
      ahead_shared += !tail;
      if (++ahead_tile == num_tiles) {
        ahead_tile = 0;
        ahead_shared = 0;
        ahead = unit_of(++ahead_n);
      }
    };

    // The copy step: tile `step` into stage step % kStages, once the consumers are done with it.
    // Producer warp w moves the tile's 16-row group w, rows [16 w, 16 w + 16), of one block
    // (block_size >= 16). A group of 16 tokens goes by two tensor copies, K and V, from lane 0:
    // one instruction each, where copying it lane by lane took most of the producers' issue slots.
    // A group that ends inside (an item's partial last block, a pair's gap) goes by the whole
    // warp's cp.async rows instead, zero-filled past the last token, and so do groups with no token
    // up to the next multiple of 32 tokens: the consumers compute 32 tokens at a time, or the whole
    // tile past 32 (P = 0 there, and 0 * V must not be NaN), and the block's rest that a tensor
    // copy would bring is stale KV or anything. The Q rows are zero-filled up to the 16-row
    // fragments that read them.
    const int row_group = producer / 32;
    const int chunk = producer % C::kChunksPerRow;
    const int row0 = producer / C::kChunksPerRow;
    const int block_mask = (1 << p.pool.block_size_log2) - 1;
    const int64_t v_minus_k = static_cast<const T*>(p.pool.v) - static_cast<const T*>(p.pool.k);
    // row / group for the Q rows (row < 128) without a division: (row * magic) >> 32.
    const uint64_t group_magic = (uint64_t(1) << 32) / uint32_t(p.group) + 1;
    auto copy_tile = [&](int step) -> bool {
      ptx::cp_async_wait<C::kLookahead - 1>();  // the look-ahead's copies for this tile landed
      ptx::named_barrier(2, C::kProducerThreads);  // and its plain writes are visible
      const PrefixTileDesc& d = desc_ring[step % (C::kLookahead + 1)];
      // Registers: the copies' "memory" clobbers would read every field again after each copy.
      const int kv_head = d.kv_head, tile = d.tile, rows = d.rows;
      const bool tail = d.tail_warps != 0;  // a tail tile: two tails, like a pair's halves, or one
      const bool kv_shared = d.kv_shared && !tail;
      const int tile_tokens = !tail               ? min(d.num_tokens - tile * C::kTileTokens, C::kTileTokens)
                              : d.tail_second > 0 ? C::kTileTokens / 2 + d.tail_second
                                                  : d.tail_first;
      const int pair_split = tail ? d.tail_first : d.pair_split;
      const int query_slot = d.query_slot;
      // The group's tokens: rows below `group_end` hold data (a pair's gap, rows [pair_split, 32),
      // holds none); its block and its first token there.
      const int group_row = row_group * kKvMapBoxTokens;
      const int group_end = group_row < C::kTileTokens / 2 && (pair_split > 0 || tail) ? pair_split : tile_tokens;
      const int block_id = d.ids[group_row >> p.pool.block_size_log2];
      const int block_token = group_row & block_mask;
      const int stage = step % C::kStages;
      if (step >= C::kStages) ptx::mbarrier_wait(empty_barrier(stage), (step / C::kStages - 1) & 1);
      const bool done = kv_head < 0;
      if (!done) {
        const uint32_t k_dst = stage_base(stage) + row_group * C::kGroupBytes;
        const uint32_t v_dst = k_dst + C::kKvTileBytes;
        if (group_end - group_row >= kKvMapBoxTokens) {
          if (lane == 0) {
            ptx::mbarrier_expect_tx(full_barrier(stage), 2 * C::kGroupBytes);
            if (kv_shared) {  // other items read it too: kept in L2
              ptx::tma_load_5d_evict_last(k_dst, &p.k_map, 0, block_token, 0, kv_head, block_id, full_barrier(stage));
              ptx::tma_load_5d_evict_last(v_dst, &p.v_map, 0, block_token, 0, kv_head, block_id, full_barrier(stage));
            } else {  // read by this item alone: the first lines L2 gives up, not the shared nodes
              ptx::tma_load_5d_evict_first(k_dst, &p.k_map, 0, block_token, 0, kv_head, block_id, full_barrier(stage));
              ptx::tma_load_5d_evict_first(v_dst, &p.v_map, 0, block_token, 0, kv_head, block_id, full_barrier(stage));
            }
          }
        } else if (group_row < ((tile_tokens + 31) & ~31)) {
          constexpr int kRowsPerCopy = 32 / C::kChunksPerRow;
          const int row = lane / C::kChunksPerRow, lane_chunk = lane % C::kChunksPerRow;
          const T* src = static_cast<const T*>(p.pool.k) + int64_t(block_id) * p.pool.page_stride +
                         kv_head * p.pool.head_stride + (block_token + row) * p.pool.token_stride + lane_chunk * 8;
#pragma unroll 1  // rare (a partial group); unrolled, its addresses spilled the producers' registers
          for (int r = row; r < kKvMapBoxTokens; r += kRowsPerCopy) {
            const uint32_t bytes = group_row + r < group_end ? 16 : 0;  // 0: zeros, src not read
            ptx::cp_async_16(k_dst + swizzled(r, lane_chunk), src, bytes);
            ptx::cp_async_16(v_dst + swizzled(r, lane_chunk), src + v_minus_k, bytes);
            src += kRowsPerCopy * p.pool.token_stride;
          }
        }
        // Q rows [0, 64) with the item's first tile, the rest with its second.
        if (tile == 0 || (tile == 1 && rows > C::kStageQRows)) {
          constexpr int kRowsPerPass = C::kProducerThreads / C::kChunksPerRow;
          constexpr int kPasses = C::kStageQRows / kRowsPerPass;
          const uint32_t q_dst = stage_base(stage) + 2 * C::kKvTileBytes;
          // Row row0 + pass * kRowsPerPass: row0 < kRowsPerPass, a multiple of 8, keeps its swizzle
          // (row % 8) and its place in the 16 rows, so its offset is row0's plus a constant.
          static_assert(kRowsPerPass % 8 == 0 && 16 % kRowsPerPass == 0);
          const uint32_t q_offset = swizzled(row0, chunk);
          const attention::UnitQuery* queries = query_ring + query_slot * C::kMaxRows;
          const int q_end = min(prefix_m_tile(rows), (tile + 1) * C::kStageQRows);
          const T* q = static_cast<const T*>(p.q) + chunk * 8;
#pragma unroll
          for (int pass = 0; pass < kPasses; ++pass) {
            const int row = tile * C::kStageQRows + row0 + pass * kRowsPerPass;
            if (row >= q_end) break;
            const bool valid = row < rows;
            const int query = int((uint64_t(row) * group_magic) >> 32);
            const int64_t q_row = valid ? int64_t(queries[query].seq) * p.num_q_heads + int64_t(kv_head) * p.group +
                                              (row - query * p.group)
                                        : 0;
            ptx::cp_async_16(q_dst + q_offset + swizzled(pass * kRowsPerPass, 0), q + q_row * kHeadDim, valid ? 16 : 0);
          }
        }
      }
      if (producer < int(sizeof(PrefixTileDesc) / 4)) {
        reinterpret_cast<volatile int32_t*>(&stage_desc[stage])[producer] = reinterpret_cast<const int32_t*>(&d)[producer];
      }
      if (done) {
        ptx::mbarrier_arrive(full_barrier(stage), 2);  // no copies: both arrivals are plain
      } else {
        ptx::cp_async_mbarrier_arrive(full_barrier(stage));
        ptx::mbarrier_arrive(full_barrier(stage));  // after this lane's description writes
      }
      return !done;
    };

#pragma unroll 1
    for (int step = 0; step < C::kLookahead; ++step) {
      look_ahead(step);
      ptx::cp_async_commit();
    }
#pragma unroll 1
    for (int step = 0;; ++step) {
      const bool more = copy_tile(step);
      if (!more) break;
      look_ahead(step + C::kLookahead);
      ptx::cp_async_commit();
    }
    ptx::cp_async_wait_all();  // nothing may be in flight into shared memory when the warp exits
    return;
  }

  // ---------------- The consumers ----------------
  ptx::grow_registers<C::kConsumerRegisters>();
  constexpr int kDimSteps = kHeadDim / 16;  // k steps of S = Q K^T
  constexpr int kDimTiles = kHeadDim / 8;   // n tiles of O
  const int g = lane / 4;  // mma fragment row
  const int t = lane % 4;  // mma fragment column pair
  // The row (of 16) and chunk (0 or 1) this lane addresses for ldmatrix's matrix lane / 8: Q's A
  // fragments and V's transposed B fragments take rows by its bit 0 and chunks by bit 1, K's B
  // fragments the other way round (chunk_pair adds the k step).
  auto qv_lane = [&] { return swizzled((lane / 8 & 1) * 8 + lane % 8, lane / 16); };
  auto k_lane = [&] { return swizzled(lane / 16 * 8 + lane % 8, lane / 8 & 1); };

  // The item being computed and this warp's share of it: rows 16 wm.., tokens slice wn.
  int num_tokens = 0, rows = 0, kv_head = 0, query_slot = 0;
  int warps_m = 1, warps_n = 1, wm = 0, wn = 0, slice = C::kTileTokens;
  int token_begin[2], token_end[2];  // the item-relative tokens rows g and g + 8 attend to
  uint32_t q_frag[kDimSteps][4];
  float o_acc[kDimTiles][4];
  float row_max[2], row_sum[2];  // rows g, g + 8 of the warp's 16; exp2 domain; lane-partial sums

  // q_stage: the stage holding the Q slot of the warp's rows (an item's second tile's for rows
  // from 64 on). alone: each warp of the item owns its 16 rows over the whole tile (one-tile
  // items of at most 32 rows), rather than a row block's warps splitting the tokens.
  auto start_item = [&](int stage, int q_stage, bool alone, int pair_split, int first_rows) {
    warps_m = prefix_m_tile(rows) / 16;
    warps_n = alone || warps_m > C::kItemWarps ? 1 : C::kItemWarps / warps_m;
    wm = warp % warps_m;
    wn = alone ? 0 : warp / warps_m;
    slice = C::kTileTokens / warps_n;
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // a pair's rows see only their own unit's tokens
      const bool first = wm * 16 + g + 8 * h < first_rows;
      token_begin[h] = pair_split == 0 || first ? 0 : C::kTileTokens / 2;
      token_end[h] = pair_split == 0 ? num_tokens : first ? pair_split : num_tokens;
    }
    const uint32_t q_src = stage_base(q_stage) + 2 * C::kKvTileBytes;
    const int q_row = wm * 16 % C::kStageQRows;
#pragma unroll
    for (int ks = 0; ks < kDimSteps; ++ks) {
      // A fragments: rows q_row + [0, 8) and + [8, 16), dims 16 ks + [0, 8) then + [8, 16).
      ptx::ldmatrix_x4(q_frag[ks], q_src + q_row * C::kRowBytes + chunk_pair(qv_lane(), ks));
    }
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n) o_acc[n][0] = o_acc[n][1] = o_acc[n][2] = o_acc[n][3] = 0.f;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;
  };

  // kChunks x 16 tokens [first, first + 16 kChunks) of the tile in `stage`; first is
  // tile-relative, token0 the item-relative index of the tile's token 0. A row may have none of
  // its tokens there (a pair's rows, the tail of an item): online_softmax_step leaves it as it
  // was. Two or four chunks at a time give the S products four or eight independent mma chains
  // and one online-softmax step for all of them.
  auto compute_chunks = [&]<int kChunks>(int stage, int first, int token0) {
    const uint32_t k_src = stage_base(stage);
    const uint32_t v_src = k_src + C::kKvTileBytes;
    float s[2 * kChunks][4] = {};  // n-tile j: (row g, tokens 8j + 2t, +1), (row g + 8, the same tokens)
#pragma unroll
    for (int ks = 0; ks < kDimSteps; ++ks) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        uint32_t b[4];  // tokens [0, 8) then [8, 16) of chunk c, dims 16 ks + [0, 8) and + [8, 16)
        ptx::ldmatrix_x4(b, k_src + (first + 16 * c) * C::kRowBytes + chunk_pair(k_lane(), ks));
        ptx::mma_16x8x16<T>(s[2 * c], q_frag[ks], b[0], b[1]);
        ptx::mma_16x8x16<T>(s[2 * c + 1], q_frag[ks], b[2], b[3]);
      }
    }
    // Most steps lie inside every row's range (a long item's tiles before its last): the mask's
    // three instructions per score only where some row of the warp ends or starts inside.
    const int step_begin = token0 + first, step_end = step_begin + 16 * kChunks;
    const bool partly = step_begin < max(token_begin[0], token_begin[1]) || step_end > min(token_end[0], token_end[1]);
    if (__any_sync(0xffffffffu, partly)) {
#pragma unroll
      for (int j = 0; j < 2 * kChunks; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int token = step_begin + 8 * j + 2 * t + (e & 1);
          const bool real = token >= token_begin[e / 2] && token < token_end[e / 2];
          if (!real) s[j][e] = -INFINITY;
        }
      }
    }
    online_softmax_step(s, p.scale_log2, row_max, row_sum, o_acc);
    uint32_t a[kChunks][4];  // P's A fragments: chunk c is S's n-tiles 2c and 2c + 1
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      a[c][0] = ptx::pack2<T>(s[2 * c][0], s[2 * c][1]);
      a[c][1] = ptx::pack2<T>(s[2 * c][2], s[2 * c][3]);
      a[c][2] = ptx::pack2<T>(s[2 * c + 1][0], s[2 * c + 1][1]);
      a[c][3] = ptx::pack2<T>(s[2 * c + 1][2], s[2 * c + 1][3]);
    }
#pragma unroll
    for (int dn = 0; dn < kDimTiles / 2; ++dn) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        // Transposed: tokens [0, 8) and [8, 16) of dims 16 dn + [0, 8), then of dims + [8, 16).
        uint32_t b[4];
        ptx::ldmatrix_x4_trans(b, v_src + (first + 16 * c) * C::kRowBytes + chunk_pair(qv_lane(), dn));
        ptx::mma_16x8x16<T>(o_acc[2 * dn], a[c], b[0], b[1]);
        ptx::mma_16x8x16<T>(o_acc[2 * dn + 1], a[c], b[2], b[3]);
      }
    }
  };

  // A tail tile holds one tail from row 0 and maybe a second from row 32, each read by a range of
  // the item's queries: each row of the warp sees its query's tail, if either, as tile-relative
  // tokens.
  auto tail_ranges = [&](const volatile PrefixTileDesc& d) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int query = (wm * 16 + g + 8 * h) / p.group;
      const bool first = query >= d.tail_first_begin && query < d.tail_first_end;
      const bool second = query >= d.tail_second_begin && query < d.tail_second_end;
      token_begin[h] = second ? C::kTileTokens / 2 : 0;
      token_end[h] = first ? d.tail_first : second ? C::kTileTokens / 2 + d.tail_second : 0;
    }
  };

  // The end of an item: ⊕ over the warps of each row block (a barrier of the consumer warps
  // alone), then the rows' states to the output or to their partial slots.
  auto finish_item = [&]() {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 1);
      row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 2);
    }
    if (warps_n > 1) {  // uniform over the item's warps: every one reaches both barriers
      constexpr int kStats = 16 * C::kReduceStride * 2;  // byte offset of 16 maxima, then 16 sums
      auto slot = [&](int j) { return smem + C::kReduceOffset + ((j - 1) * warps_m + wm) * C::kReduceSlotBytes; };
      auto word = [&](uint8_t* s, int n, int h) {
        return reinterpret_cast<uint32_t*>(s + ((g + 8 * h) * C::kReduceStride + 8 * n + 2 * t) * 2);
      };
      auto stat = [&](uint8_t* s, int i) -> float& { return reinterpret_cast<float*>(s + kStats)[i]; };
      if (wn > 0) {
        uint8_t* const s = slot(wn);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float inv = row_sum[h] > 0.f ? 1.f / row_sum[h] : 0.f;  // 0: none of the row's tokens
#pragma unroll
          for (int n = 0; n < kDimTiles; ++n) *word(s, n, h) = ptx::pack2<T>(o_acc[n][2 * h] * inv, o_acc[n][2 * h + 1] * inv);
          if (t == 0) {
            stat(s, g + 8 * h) = row_max[h];
            stat(s, 16 + g + 8 * h) = row_sum[h];
          }
        }
      }
      ptx::named_barrier(1, C::kItemWarps * 32);
      if (wn == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float max = row_max[h];
          for (int j = 1; j < warps_n; ++j) max = fmaxf(max, stat(slot(j), g + 8 * h));
          const float own = exp2f(row_max[h] - max);
          float sum = row_sum[h] * own;
#pragma unroll
          for (int n = 0; n < kDimTiles; ++n) {
            o_acc[n][2 * h] *= own;
            o_acc[n][2 * h + 1] *= own;
          }
          for (int j = 1; j < warps_n; ++j) {
            uint8_t* const s = slot(j);
            // The warp's sum, weighted: 0 for a warp with no token (its maximum is -inf).
            const float weight = stat(s, 16 + g + 8 * h) * exp2f(stat(s, g + 8 * h) - max);
            sum += weight;
#pragma unroll
            for (int n = 0; n < kDimTiles; ++n) {
              const float2 o = ptx::unpack2<T>(*word(s, n, h));
              o_acc[n][2 * h] += o.x * weight;
              o_acc[n][2 * h + 1] += o.y * weight;
            }
          }
          row_max[h] = max;
          row_sum[h] = sum;
        }
      }
      ptx::named_barrier(1, C::kItemWarps * 32);  // the buffer is free for the next item
      if (wn > 0) return;
    }
    const attention::UnitQuery* queries = query_ring + query_slot * C::kMaxRows;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = wm * 16 + g + 8 * h;
      if (row >= rows) continue;
      const attention::UnitQuery uq = queries[row / p.group];
      const int head = row % p.group;
      const float inv = 1.f / row_sum[h];  // >= 1 (to rounding): the max token adds exp2(max - reference) >= 1
      const float lse = row_max[h] * float(M_LN2) + logf(row_sum[h]);
      // The output row, or the row's partial slot (o in T as well: half the bytes of fp32 to
      // write and merge, and no less precise than the output it becomes).
      const bool whole = uq.piece < 0;
      const int64_t out_row = whole ? int64_t(uq.seq) * p.num_q_heads + int64_t(kv_head) * p.group + head
                                    : (int64_t(kv_head) * p.piece_stride + uq.piece) * p.group + head;
      uint32_t* dst = reinterpret_cast<uint32_t*>(static_cast<T*>(whole ? p.out : p.partial_o) + out_row * kHeadDim);
#pragma unroll
      for (int n = 0; n < kDimTiles; ++n) dst[n * 4 + t] = ptx::pack2<T>(o_acc[n][2 * h] * inv, o_acc[n][2 * h + 1] * inv);
      float* lse_dst = whole ? p.lse : p.partial_lse;
      if (lse_dst && t == 0) lse_dst[out_row] = lse;
    }
  };

#pragma unroll 1
  for (int step = 0;; ++step) {
    const int stage = step % C::kStages;
    ptx::mbarrier_wait(full_barrier(stage), (step / C::kStages) & 1);
    const volatile PrefixTileDesc& d = stage_desc[stage];
    if (d.kv_head < 0) break;
    const int tile = d.tile;
    const bool last = d.last;
    // A one-tile item of at most 32 rows goes to its M / 16 warps alone (one or two), the next
    // ones of the first four by stage; the others to the first four, or all eight past 64 rows.
    // A tail tile goes to the warps the host chose among those holding its queries' rows.
    const bool alone = tile == 0 && last && d.rows <= 32;
    const int tail_warps = d.tail_warps;
    const int alone_warps = prefix_m_tile(d.rows) / 16, first_warp = stage * alone_warps % C::kItemWarps;
    const bool member = warp < C::kItemWarps || d.rows > C::kStageQRows;
    const bool mine = alone            ? warp >= first_warp && warp < first_warp + alone_warps
                      : tail_warps != 0 ? (tail_warps >> warp & 1) != 0
                                        : member;
    if (mine) {
      if (tile == 0) {
        num_tokens = d.num_tokens;
        rows = d.rows;
        kv_head = d.kv_head;
        query_slot = d.query_slot;
        int q_stage = stage;
        if (warp >= C::kItemWarps) {  // rows from 64 on: their Q comes with the item's second tile
          q_stage = (step + 1) % C::kStages;
          ptx::mbarrier_wait(full_barrier(q_stage), ((step + 1) / C::kStages) & 1);
        }
        start_item(stage, q_stage, alone, d.pair_split, d.first_rows);
      }
      // This warp's tokens [lo, hi) of the tile, of which [0, end) hold data; token0: the item
      // token at tile row 0. A tail tile goes whole to each of its warps, its rows' ranges
      // tile-relative (its second half holds no data, not even zeros, under a short lone tail).
      int token0 = tile * C::kTileTokens, end = num_tokens - token0, lo = wn * slice, hi = lo + slice;
      if (tail_warps == 0 && tile > 0) {  // maybe after a tail tile's ranges (an item of two tiles is no pair)
        token_begin[0] = token_begin[1] = 0;
        token_end[0] = token_end[1] = num_tokens;
      }
      if (tail_warps != 0) {
        tail_ranges(d);
        token0 = 0;
        end = d.tail_second > 0 || d.tail_first > C::kTileTokens / 2 ? C::kTileTokens : C::kTileTokens / 2;
        lo = 0;
        hi = C::kTileTokens;
      }
      if (hi - lo == 16) {  // four warps split the tile: one chunk each
        if (lo < end) compute_chunks.template operator()<1>(stage, lo, token0);
      } else if (hi - lo == C::kTileTokens && end > C::kTileTokens / 2) {
        compute_chunks.template operator()<4>(stage, 0, token0);  // the whole tile: eight S chains
      } else {
#pragma unroll 1
        for (int first = lo; first < hi && first < end; first += 32) compute_chunks.template operator()<2>(stage, first, token0);
      }
    }
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(empty_barrier(stage));  // this warp is done with the stage
    if (last && (alone ? mine : member)) finish_item();
  }
}

}  // namespace pagoda::cuda

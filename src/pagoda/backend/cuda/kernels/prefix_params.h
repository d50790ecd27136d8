// What prefix_tiled_kernel reads: a PrefixPlan's units as kernel units (prefix_attention.h's
// kernel_units) over one layer's paged pools, an item being one unit for one kv head, which CTA
// runs which items (prefix_schedule), and where each item's states go. Plain data, filled on the
// host and taken by value by the kernel.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "pagoda/attention/prefix_plan.h"
#include "pagoda/backend/cuda/kernels/kv_pool_params.h"

namespace pagoda::cuda {

// KV tokens per tile, the kernel's pipeline stage: a pair's units split it in halves, and the
// host's kernel units and schedule costs count in it.
inline constexpr int32_t kPrefixTileTokens = 64;

// The most query rows of an item of one KV tile, whose Q rows all ride in its one stage's Q slot:
// kernel_units pairs short units up to it and cuts one-tile units past it.
inline constexpr int32_t kPrefixOneTileRows = 64;

// The longest tail two of which share a tail tile (PrefixTailTile, PrefixPlanOptions::
// max_tail_tokens): half a tile, where a 16-row block holds whole pairs of queries (GQA group 1,
// 2, 4 or 8) and a half tile whole blocks; else 0, no tails.
constexpr int32_t prefix_max_tail_tokens(int32_t group, int32_t block_size) {
  return group >= 1 && 16 % group == 0 && block_size <= kPrefixTileTokens / 2 ? kPrefixTileTokens / 2 : 0;
}

// An item's M tile: its query rows rounded up to 16, 32, 64 or 128 (the tile selector's choice;
// the plan keeps at most 128 rows). M / 16 warps own 16 rows each.
constexpr int prefix_m_tile(int rows) { return rows <= 16 ? 16 : rows <= 32 ? 32 : rows <= 64 ? 64 : 128; }

// A plan unit as the kernel runs it, or two short ones sharing one 64-token KV tile (a pair): the
// first's tokens at tile rows [0, 32), the second's from row 32, and their query rows one after
// the other (the first's are rows [0, first_rows)).
struct KernelUnit {
  int32_t block_begin;  // DecodeBatch::block_ids index of the (first) unit's first block
  int32_t num_tokens;   // of the (first) unit
  int32_t query_begin;  // in the kernel's query list: the first unit's queries, then the second's
  int32_t rows;         // query rows of both
  int32_t kv_shared;
  int32_t second_block_begin;
  int32_t second_tokens;  // 0: one unit
  int32_t first_rows;
  // A unit with tails (PrefixUnit::tails): its tail tiles PrefixParams::tail_tiles[tail_begin,
  // tail_begin + tail_tiles) follow its num_tokens of shared KV. Never a pair.
  int32_t tail_begin;
  int32_t tail_tiles;
};

// One 64-token tile of an item's tails (PrefixPlan::unit_tails): a first tail's tokens from tile
// row 0, for the item's queries [first_begin, first_end), and a second one's from row 32 for
// [second_begin, second_end), disjoint (none: empty range, 0 tokens). A tail longer than 32 tokens
// fills whole tiles alone. Computed by the warps in the mask, one for each 16-row block holding
// the queries (up to 64 rows, one of the warps that split the block's tokens: the ⊕ at the item's
// end merges them). Block ids as the kernel copies them into its tile description (the second
// tail's from ids[32 / block_size]).
struct PrefixTailTile {
  int32_t ids[4];
  int32_t first_tokens;
  int32_t second_tokens;
  int32_t first_begin, first_end;
  int32_t second_begin, second_end;
  int32_t warps;  // bit w: computing warp w
};

struct PrefixParams {
  // The schedule (prefix_schedule): CTA c's n-th item at slot c + n * gridDim.x, its unit and its
  // kv head, -1 past the CTA's last item.
  const KernelUnit* slot_units;  // [num_slots]
  const int32_t* slot_heads;     // [num_slots]
  int32_t num_slots;
  const attention::UnitQuery* unit_queries;
  const PrefixTailTile* tail_tiles;
  const int32_t* block_ids;  // DecodeBatch::block_ids
  KvPoolParams pool;  // the layer's K and V
  // The same pools for the tensor copies (kv_tensor_map.h): 16 tokens of one block and head a box.
  CUtensorMap k_map, v_map;
  const void* q;       // [num_seqs, num_q_heads, head_dim] T
  void* out;           // [num_seqs, num_q_heads, head_dim] T
  float* lse;          // [num_seqs, num_q_heads] or null
  void* partial_o;     // [num_kv_heads * piece_stride, group, head_dim] T
  float* partial_lse;  // [num_kv_heads * piece_stride, group]
  int32_t num_q_heads;
  int32_t group;
  int32_t piece_stride;  // partial slots per kv head: at least the plan's num_pieces
  float scale_log2;  // softmax scale * log2(e)
};

}  // namespace pagoda::cuda

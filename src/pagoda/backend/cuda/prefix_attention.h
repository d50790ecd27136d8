// Prefix-aware decode attention on the GPU: runs a PrefixPlan (attention/prefix_plan.h) over one
// layer's paged pools with prefix_tiled_kernel (one persistent launch over the plan's mixed work
// items, kernels/prefix_tiled.cuh), then the plan's merges (merge_states.h).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "pagoda/attention/decode_batch.h"
#include "pagoda/attention/prefix_plan.h"
#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/backend/cuda/kernels/prefix_params.h"
#include "pagoda/backend/cuda/kv_tensor_map.h"
#include "pagoda/core/paged_kv.h"

namespace pagoda::cuda {

// The tile selector's table for one shape on the current device: which M tiles (query rows per
// work item) the kernel can run, derived from the PAT paper's constraints, and how many workers
// the persistent grid has. The KV tile is fixed at 64 tokens per stage; the M tile decides how
// the computing warps split it (M / 16 warps own 16 rows each; up to 64 rows, 4 warps, the others
// splitting the tokens; at 128, 8 warps).
//   ① shared memory: stages x (K + V tile + a 64-row Q slot) + the warps' ⊕ buffer must fit a
//     CTA's opt-in limit (M = 128 items span two tiles and carry their Q in two stages);
//     registers: one m16 fragment per warp keeps the consumers within the 200 registers the
//     producers leave them without spilling (checked on the compiled kernel).
//   ② bytes in flight: SMs x CTAs x stages x KV tile bytes (the loading warp fills every stage
//     ahead of the computing ones) >= latency x bandwidth (1 µs x the device's peak), so that the
//     pipeline alone can saturate memory.
//   ③ tensor-core shape: M a multiple of 16 (the m16n8k16 fragment).
struct PrefixTiles {
  std::vector<int32_t> m_tiles;  // feasible, ascending
  int32_t kv_tile_tokens = 0;
  int32_t one_tile_rows = 0;  // the most query rows of an item of one KV tile (kernel_units)
  int32_t max_tail_tokens = 0;  // PrefixPlanOptions::max_tail_tokens: prefix_max_tail_tokens
  int32_t stages = 0;
  int32_t ctas_per_sm = 0;
  int32_t workers = 0;  // SMs x CTAs per SM: the persistent grid
  int64_t bytes_in_flight = 0;
  int64_t latency_bandwidth_bytes = 0;
  std::string rejected;  // each M tile left out and the constraint that rules it out
};
PrefixTiles prefix_tiles(const attention::AttentionShape& shape, DType dtype);

// PrefixPlanOptions and DeviceInfo that plan for the kernel of these tiles.
attention::PrefixPlanOptions prefix_plan_options(const PrefixTiles& tiles);
attention::DeviceInfo prefix_device_info(const PrefixTiles& tiles);

// Null when the kernel supports this shape and KV dtype (f16 or bf16, head_dim 64 or 128, block
// size 16, 32 or 64, GQA group 1 to 8); otherwise why not.
const char* prefix_shape_unsupported_reason(const attention::AttentionShape& shape, DType dtype);

// The same for a pool: its shape and dtype, and a device pool with 16-byte aligned rows.
const char* prefix_unsupported_reason(const attention::AttentionShape& shape, const PagedKv& kv);

// The plan's units as the kernel runs them, in the plan's order, each unit's queries copied after
// the previous one's. Two consecutive units of at most 32 tokens each, with at most
// one_tile_rows query rows together (short private leaves; short shared nodes of a few queries),
// become one pair sharing a 64-token KV tile: the loading and computing warps' work per tile is
// much the same for 32 tokens as for 64, so a half-full tile reaches far less of the bandwidth
// (docs/experiments/prefix-attention.md). Only with blocks of at most 32
// tokens (a tile holds whole blocks of each unit). A unit of one tile (at most 64 tokens) with
// more than one_tile_rows rows is cut into units of at most that many, each reading the tile: a
// stage holds the Q rows of one tile's item, and a longer item's further rows ride with its
// second tile. A unit with tails is neither cut nor paired: its tails become tail tiles
// (PrefixTailTile), the item's 16-row blocks taken in turn and a block's tiles dealt over the
// warps that split its tokens, so that consecutive stages go to different computing warps.
// block_ids: the batch's (DecodeBatch::block_ids), which the tail tiles carry.
struct KernelUnits {
  std::vector<KernelUnit> units;
  std::vector<attention::UnitQuery> queries;
  std::vector<PrefixTailTile> tail_tiles;
};
KernelUnits kernel_units(const attention::PrefixPlan& plan, std::span<const int32_t> block_ids, int32_t block_size,
                         int32_t one_tile_rows);

// An item's cost for the schedule, in quarter tiles: its 64-token tiles (a pair's one), each
// weighed by the rows computed on it, and its tail tiles as tiles of few rows. A tile of at most
// 32 rows takes the time its KV takes to arrive (4); 64 rows of math take longer (5), 128 rows
// on eight warps longer still (6). The weights are relative tile times: of the weightings tried
// on the prefix-tree batches, this one gave the highest geometric mean of the bound
// (docs/experiments/prefix-attention.md). An item of more than one tile and at most 32 rows costs
// a tile more: its warps ⊕ their states at its end, which otherwise leaves its CTA finishing last.
int64_t prefix_item_cost(const KernelUnit& u);

// Which CTA of the persistent grid runs which item (kernel unit x kv head): longest processing
// time first. Items in order of falling cost go each to the CTA with the least cost so far. A
// round-robin over the plan's order (longest units first) gave the CTAs that drew the long
// shared units as many short tails as the others. Where the items fill whole rounds of fewer
// CTAs that finish as early (by the costs), the items go to those CTAs only.
struct PrefixSchedule {
  std::vector<int32_t> slots;  // CTA c's n-th item at c + n * ctas; -1 past its last
  int32_t ctas = 0;            // at most min(items, workers)
};
PrefixSchedule prefix_schedule(const std::vector<KernelUnit>& units, int32_t num_kv_heads, int32_t workers);

// What a step's prefix attention reads from device memory, uploaded once per step and shared by
// every layer. Uploaded for a CUDA graph's step (CudaBackend), the launches stay the same from
// step to step but for the merge's shape (graph_shape()): the grid is the tiles' workers (CTAs
// past the schedule's find no item), the slots and the partial states' stride per kv head are
// capacities, and the arrays grow geometrically, keeping their addresses until they must grow.
struct PrefixWorkspace {
  DeviceArray<KernelUnit> slot_units;  // PrefixParams::slot_units: the schedule's, strided by grid
  DeviceArray<int32_t> slot_heads;     // PrefixParams::slot_heads, -1 past the schedule's
  DeviceArray<attention::UnitQuery> unit_queries;  // KernelUnits::queries
  DeviceArray<PrefixTailTile> tail_tiles;          // KernelUnits::tail_tiles
  DeviceArray<attention::MergeTask> merges;
  DeviceArray<int32_t> block_ids;
  DeviceArray<uint16_t> partial_o;   // [num_kv_heads * piece_stride, group, head_dim] of the KV dtype
  DeviceArray<float> partial_lse;    // [num_kv_heads * piece_stride, group]
  int32_t group_size = 0;  // of the shape uploaded with: prefix_attention checks it is the same
  int32_t head_dim = 0;
  int32_t piece_stride = 0;  // PrefixParams::piece_stride: at least the plan's num_pieces, only grows
  int32_t max_partials = 0;  // of any merge task
  int32_t num_kv_heads = 0;
  int32_t ctas = 0;       // CTAs with items: PrefixSchedule::ctas
  int32_t grid = 0;       // CTAs launched: ctas, or for a graph's step the tiles' workers
  int32_t min_block_id = 0;
  int32_t max_block_id = -1;

  // Throws Error(kInvalidArgument) when the plan is not one the kernel can run for this batch and
  // shape (plan_prefix with prefix_plan_options(tiles) always is), has more than 2^31 items or
  // 2^30 slots, or more merge tasks than graph_rows.
  // graph_rows > 0: a step replayed as a CUDA graph of that many rows (StepBatch::graph_rows).
  // Its grid is the workers, and its merge tasks (at most one per sequence) are padded to
  // graph_rows with tasks that write nothing. Otherwise the grid is the CTAs with items: idle CTAs
  // in the grid slow the others (docs/experiments/prefix-attention.md).
  void upload(const attention::PrefixPlan& plan, const attention::DecodeBatch& batch,
              const attention::AttentionShape& shape, const PrefixTiles& tiles, cudaStream_t stream = nullptr,
              int32_t graph_rows = 0);

  // PrefixParams::num_slots: the slot arrays' capacity (upload keeps it under 2^31).
  int32_t num_slots() const { return int32_t(std::min(slot_units.capacity(), slot_heads.capacity())); }

  // Changes whenever an array the launches read is reallocated or piece_stride grows (the sum of
  // the arrays' generations and piece_stride, each of which only grows; num_slots() changes only
  // with its arrays): a CUDA graph of the launches is valid while it and graph_shape() stay.
  uint64_t generation() const {
    return slot_units.generation() + slot_heads.generation() + unit_queries.generation() + tail_tiles.generation() +
           merges.generation() + block_ids.generation() + partial_o.generation() + partial_lse.generation() +
           uint64_t(piece_stride);
  }

  // What a CUDA graph of the launches fixes besides generation(): 0 with no merge, else the
  // merge's warps per output row.
  int32_t graph_shape() const;
};

// Runs the uploaded plan, then its merges. Arguments as decode_attention (decode_attention.h), and
// maps, kv's tensor maps (kv_tensor_maps(kv), encoded once per pool):
//   q, out: [num_seqs, num_q_heads, head_dim] of kv.dtype; lse: [num_seqs, num_q_heads] fp32 or null.
// Throws Error(kUnsupported) with prefix_unsupported_reason, Error(kInvalidArgument) when the
// workspace was uploaded for another shape or names blocks outside the pool, or the maps describe
// another pool.
void prefix_attention(PrefixWorkspace& workspace, const attention::AttentionShape& shape, const PagedKv& kv,
                      const KvTensorMaps& maps, const void* q, void* out, float* lse, cudaStream_t stream = nullptr);

}  // namespace pagoda::cuda

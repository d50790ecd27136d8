// Prefill attention on the GPU: causal attention of the multi-token chunks of one step over one
// layer's paged KV pools. The chunks' own K and V are already in the pool (rope_append_kv runs
// first), so a query at position p reads pool tokens [0, p] of its sequence: a chunk that starts
// at start_pos > 0 (a later chunk of a chunked prefill, or the first after a prefix-cache hit)
// reads its cached prefix exactly as it reads its new tokens. Same semantics as
// cpu::prefill_attention_cpu.
//
// The kernel (kernels/prefill_tiled.cuh) is FlashAttention-2 style: one CTA per (query tile, kv
// head), tensor cores (mma.sync m16n8k16), fp32 online softmax, K/V streamed in 64-token tiles.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "pagoda/attention/decode_batch.h"
#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/core/paged_kv.h"

namespace pagoda::cuda {

// One multi-token chunk of a sequence: queries for positions [start_pos, start_pos + num_new), in
// rows [row_begin, row_begin + num_new) of q and out; its block table is block_ids[block_begin ...]
// (covering at least start_pos + num_new tokens).
struct PrefillChunk {
  int32_t row_begin = 0;
  int32_t start_pos = 0;
  int32_t num_new = 0;
  int32_t block_begin = 0;
};

// Query rows per CTA: (token, q head) pairs of one kv head, so a tile holds 64 / group tokens.
inline constexpr int32_t kPrefillTileRows = 64;

// One CTA's queries: consecutive tokens of one chunk, each with its whole GQA group of q heads
// (the CTA's kv head comes from the grid). Keys [0, first_pos + num_tokens) of the sequence.
struct PrefillTile {
  int32_t row_begin;    // q/out row of the first token
  int32_t first_pos;    // its position in the sequence
  int32_t num_tokens;   // 1 .. tokens per tile
  int32_t block_begin;  // the sequence's block table in PrefillWorkspace::block_ids
};

// The step's work list, uploaded once per step and reused by every layer.
struct PrefillWorkspace {
  DeviceArray<PrefillTile> tiles;  // longest KV first: the long tiles start first
  DeviceArray<int32_t> block_ids;
  int32_t group_size = 0;  // of the shape uploaded with: the tiling depends on it
  int32_t head_dim = 0;
  int32_t block_size = 0;
  int32_t min_block_id = 0;  // over the blocks the chunks use: checked against the pool
  int32_t max_block_id = -1;

  // Cuts the chunks into tiles for shape and copies them and the block ids to the device
  // (stream-ordered). Throws Error(kInvalidArgument) for a chunk whose block table is too short,
  // or Error(kUnsupported) for a shape prefill_unsupported_reason rejects.
  void upload(std::span<const PrefillChunk> chunks, std::span<const int32_t> block_ids,
              const attention::AttentionShape& shape, cudaStream_t stream = nullptr);
};

// Null when supported (f16/bf16, head_dim 64 and 128, block size 16/32/64, GQA group 1..8), else why.
const char* prefill_unsupported_reason(const attention::AttentionShape& shape, DType dtype);

// Runs the uploaded work list. kv: a device pool (HND or NHD) of dtype f16 or bf16.
//   q:   [num_rows, num_q_heads, head_dim] of kv.dtype, contiguous (rows of all chunks)
//   out: [num_rows, num_q_heads, head_dim] of kv.dtype; rows not in any chunk are not written
// Softmax scale from shape.softmax_scale. Stream-ordered; the workspace must stay alive until the
// stream has run it. Throws Error(kUnsupported) for an unsupported shape or pool, and
// Error(kInvalidArgument) for a workspace uploaded for another shape or a larger pool.
void prefill_attention(const PrefillWorkspace& ws, const attention::AttentionShape& shape,
                       const PagedKv& kv, const void* q, void* out, cudaStream_t stream = nullptr);

// The launch itself, after prefill_attention's checks; defined with the kernel's instantiations
// in prefill_tiled.cu.
void launch_prefill_tiled(const PrefillWorkspace& ws, const attention::AttentionShape& shape,
                          const PagedKv& kv, const void* q, void* out, cudaStream_t stream);

}  // namespace pagoda::cuda

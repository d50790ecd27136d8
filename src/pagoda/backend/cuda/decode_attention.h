// Decode attention on the GPU: runs a DecodePlan (attention/plan.h) over one layer's paged KV
// pools, then the plan's merges. The group-tiled kernel executes the work items: one CTA per work
// item reads each KV block once for all query heads of its GQA group (tensor-core S = K q^T and
// O = V^T P, a multi-stage cp.async pipeline, fp32 online softmax). It can prefetch upcoming KV
// blocks into L2 (cp.async.bulk.prefetch.L2) and mark streamed KV evict_first; DecodeOptions
// switches each, for ablation. A benchmark may run its own kernel over the same items
// (DecodeOptions::launch; bench/per_head_decode.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "pagoda/attention/decode_batch.h"
#include "pagoda/attention/plan.h"
#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/backend/cuda/kernels/decode_launch.h"
#include "pagoda/core/paged_kv.h"

namespace pagoda::cuda {

struct DecodeOptions {
  DecodeLauncher launch = launch_decode_tiled;  // the kernel that runs the work items
  // Prefetch upcoming blocks into L2 (cp.async.bulk.prefetch.L2); the tiled kernel prefetches HND
  // pools only. Off by default: the tiled kernel's cp.async pipeline already keeps enough bytes
  // in flight, and the prefetch slowed it (docs/experiments/decode-attention.md).
  bool l2_prefetch = false;
  bool evict_first = true;  // load KV with an evict_first L2 policy: read once, leave first
  int32_t prefetch_distance = 0;  // how far ahead, in the kernel's units (the tiled kernel's: 64-token
                                  // tiles past the one computed, at least its pipeline depth, 2-4,
                                  // which the cp.async loads already cover); 0: the tuned default
};

// What a decode step's kernels read from device memory, uploaded once per step and shared by
// every layer: the plan's items and merges, the batch's block ids, and the partial-state scratch.
// The items and block ids grow geometrically, so that a CUDA graph's step (which holds their
// addresses) rarely sees them move.
struct DecodeWorkspace {
  DeviceArray<attention::WorkItem> items;
  DeviceArray<attention::MergeTask> merges;
  DeviceArray<int32_t> block_ids;
  DeviceArray<uint16_t> partial_o;   // [num_partials, group_size, head_dim] of the KV dtype
  DeviceArray<float> partial_lse;  // [num_partials, group_size]
  int32_t group_size = 0;  // of the shape uploaded with: decode_attention checks it is the same
  int32_t head_dim = 0;
  int32_t max_partials = 0;  // of any merge task
  int32_t min_block_id = 0;   // of the uploaded batch: checked against the pool before a launch
  int32_t max_block_id = -1;

  // Copies plan and batch to the device (stream-ordered) and sizes the scratch for shape.
  void upload(const attention::DecodePlan& plan, const attention::DecodeBatch& batch,
              const attention::AttentionShape& shape, cudaStream_t stream = nullptr);

  // Changes whenever an array the launches read is reallocated (the sum of the arrays'
  // generations, each of which only grows): a CUDA graph of the launches is valid while it stays.
  uint64_t generation() const {
    return items.generation() + merges.generation() + block_ids.generation() + partial_o.generation() +
           partial_lse.generation();
  }
};

// The workers plan_decode should fill for this shape on the current device: multiprocessors x
// resident CTAs of the group-tiled kernel.
attention::DeviceInfo decode_device_info(const attention::AttentionShape& shape, DType dtype);

// Null when the kernels support this shape and KV dtype (f16 or bf16, head_dim 64, 128 or 256,
// block size 16, 32 or 64, group size 1 to 8); otherwise why not.
const char* decode_shape_unsupported_reason(const attention::AttentionShape& shape, DType dtype);

// The same for a pool: its shape and dtype, and a device pool matching the shape with 16-byte
// aligned rows. decode_attention throws Error(kUnsupported) with this reason.
const char* decode_unsupported_reason(const attention::AttentionShape& shape, const PagedKv& kv);

// Throws Error(kInvalidArgument) unless a workspace uploaded for (group, head_dim) and block ids
// [min_block_id, max_block_id] can run on `shape` over `kv`; `op` names the caller.
void check_workspace(const char* op, int32_t group, int32_t head_dim, int32_t min_block_id, int32_t max_block_id,
                     const attention::AttentionShape& shape, const PagedKv& kv);

// Runs the uploaded plan: the work items, then (when the plan splits) the merges. kv: a device pool (HND or NHD) of dtype f16 or bf16.
//   q:   [num_seqs, num_q_heads, head_dim] of kv.dtype, one query token per sequence
//   out: [num_seqs, num_q_heads, head_dim] of kv.dtype
//   lse: [num_seqs, num_q_heads] fp32, natural log; may be null
// Stream-ordered; the workspace must stay alive until the stream has run it.
void decode_attention(DecodeWorkspace& workspace, const attention::AttentionShape& shape,
                      const PagedKv& kv, const void* q, void* out, float* lse,
                      const DecodeOptions& options = {}, cudaStream_t stream = nullptr);

}  // namespace pagoda::cuda

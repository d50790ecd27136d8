// The decode planner: block tables and lengths in, a work list out (FlashInfer's plan -> run
// split). Planning is CPU code that kernels never see the inside of: a backend's executor runs
// the items, then the merges. It reads block ids and lengths only, never token contents.
//
// A work item computes the attention state of one GQA group of query rows over one run of KV
// tokens. When a sequence's KV is split across several items (split-KV, for batches too small to
// fill the device), each writes a partial state (o, lse) and a merge task folds them with the
// cascade paper's ⊕ (merge.h).
#pragma once

#include <cstdint>
#include <vector>

#include "pagoda/attention/decode_batch.h"

namespace pagoda::attention {

struct DeviceInfo {
  int32_t num_workers = 1;  // work items that run at once: CPU threads, or GPU SMs x CTAs per SM
};

struct PlanOptions {
  bool allow_split = true;  // false: one item per (sequence, kv head), whatever the shape
  // > 0: split every sequence longer than this into items of at most this many tokens (rounded
  // down to a multiple of block_size, at least one block), whatever the batch shape. For tests
  // and tuning; 0 lets the planner choose.
  int32_t max_kv_tokens_per_item = 0;
  // The planner's own splits stay at least this long: an item must read enough KV to pay for
  // writing and merging its partial state. 128 tokens is two tiles of the GPU kernel (32 KB of K
  // plus 32 KB of V per kv head at head_dim 128, against a 2 KB f16 partial per 8 query rows); a
  // batch of one on a large GPU needs pieces that small to occupy every multiprocessor; longer and
  // shorter minimums were slower (docs/experiments/decode-attention.md).
  int32_t min_kv_tokens_per_item = 128;
};

struct WorkItem {
  int32_t seq;          // query rows: q heads [kv_head * group, (kv_head + 1) * group) of sequence seq
  int32_t kv_head;      // the KV head the group reads
  int32_t block_begin;  // index in DecodeBatch::block_ids of the first block the item reads
  int32_t token_begin;  // KV tokens [token_begin, token_end) of the sequence; token_begin is a
  int32_t token_end;    //   multiple of block_size, so the item starts at its first block's slot 0
  int32_t partial;      // -1: the item covers the whole KV and writes out/lse directly;
                        // else its slot in the partial-state scratch
};

// Folds the partial states of one (sequence, kv head) into its output rows.
struct MergeTask {
  int32_t seq;
  int32_t kv_head;
  int32_t partial_begin;  // slots [partial_begin, partial_begin + num_partials), in KV order
  int32_t num_partials;
};

// The most partials any task folds (0 for none): what the GPU merge sizes its warps by.
int32_t max_partials(const std::vector<MergeTask>& merges);

struct DecodePlan {
  std::vector<WorkItem> items;
  std::vector<MergeTask> merges;  // run after every item has finished
  // Partial-state scratch the executor provides:
  //   o [num_partials, group_size, head_dim], lse [num_partials, group_size] fp32; o is fp32 on
  //   the CPU and the KV dtype on the GPU.
  int32_t num_partials = 0;
  int32_t kv_tokens_per_item = 0;  // the split chunk, 0 when nothing is split
};

// Throws Error(kInvalidArgument) when the batch or shape is inconsistent (a sequence with fewer
// blocks than its length needs, heads that do not divide, ...).
void validate_decode_batch(const DecodeBatch& batch, const AttentionShape& shape);
// The batch's part of that: offsets that match the ids, and enough blocks for every length.
void validate_block_tables(const DecodeBatch& batch, int32_t block_size);

// Throws as validate_decode_batch.
DecodePlan plan_decode(const DecodeBatch& batch, const AttentionShape& shape,
                       const DeviceInfo& device, const PlanOptions& options = {});

}  // namespace pagoda::attention

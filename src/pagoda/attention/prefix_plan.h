// The prefix-aware decode planner (the pack stage of the PAT paper, arXiv:2511.22333; cascade
// inference's shared-prefix attention is its two-level case). Block tables in, work out:
//   1. the prefix forest of the batch (prefix_forest.h);
//   2. packing: every node's queries read the node's KV together, once, in one unit; a child is
//      merged into its parent's unit (the unit reads the parent's KV again, for the child's
//      queries alone) when that costs fewer bytes than the partial states it saves, the paper's
//      scheme comparison with this engine's byte counts and row chunks (under a node wider than
//      the largest M tile, a child that fills whole chunks is merged at no extra read: at GQA
//      group 8, the 1,4,16,512 tree's queries read root to third level in one unit, and get two
//      partial states instead of four); of that and no packing at all, each tree keeps the one
//      that moves fewer bytes, so packing never moves more than one unit per query would (the
//      split below adds partial states, for occupancy);
//   3. row chunking: a unit holds at most the largest M tile of query rows (queries x GQA
//      group); a node with more queries is read by several units, marked kv_shared so its KV
//      stays in L2, as are units of merged children (their ancestors' KV is read by others);
//   4. the long-KV split: units longer than a worker's fair share of the batch are cut into
//      equal pieces, so no worker finishes long after the others (the paper cuts at the batch
//      mean, which multiplies partial states where short tails dominate: prefix_plan.cpp), and
//      units all of one length are cut into pieces that fill their rounds over the workers,
//      unless whole they fill whole rounds of fewer workers and the cut's partial states
//      would cost more than the workers left idle;
//   5. tails (options.max_tail_tokens): a unit whose queries all belong to one unit of an
//      ancestor (its private leaves, the nodes below it that fit its row chunk) joins that one
//      (the last piece of a split one), read after its KV by those queries' rows alone, where the
//      units with tails still fill the workers' rounds (prefix_plan.cpp);
//   6. merges: a query covered by several units gets one partial state per unit and a merge task
//      (merge.h's ⊕, one per kv head); a query covered by one unit gets its output from it.
// The plan reads block ids and lengths only. Kernels run its items in order (item i: unit
// i / num_kv_heads for kv head i % num_kv_heads), then its merges.
#pragma once

#include <cstdint>
#include <vector>

#include "pagoda/attention/decode_batch.h"
#include "pagoda/attention/plan.h"
#include "pagoda/attention/prefix_forest.h"

namespace pagoda::attention {

struct PrefixPlanOptions {
  // false: no packing, one unit per query over its whole KV (what packing is measured against).
  bool pack = true;
  // false: no long-KV split (every unit reads its whole node run in one piece).
  bool split = true;
  // The M tiles the executor has, ascending (the tile selector rounds a unit's rows up to one);
  // the largest bounds the rows of a unit.
  std::vector<int32_t> m_tiles{16, 32, 64, 128};
  int32_t min_kv_tokens_per_unit = 128;  // the split never cuts pieces shorter (rounded to blocks)
  int32_t kv_bytes_per_element = 2;      // f16/bf16 KV: the byte model's weight of KV reads
  int32_t partial_o_bytes_per_element = 4;  // the executor's partial o: fp32 on the CPU, f16/bf16 on the GPU
  // Tails: a unit whose queries all belong to one unit of its ancestors' KV is read by that unit
  // instead (after its own KV, for those queries' rows alone), which saves each of them a
  // partial state and, when that unit then covers all of a query's KV, the merge. Tails of at
  // most this many tokens share the executor's tiles, two at a time (blocks of at most as many
  // tokens). 0: no tails.
  int32_t max_tail_tokens = 0;
};

struct PrefixUnit {
  int32_t block_begin;  // index in DecodeBatch::block_ids of the first block read, from slot 0
  int32_t num_tokens;   // KV tokens read from there on
  int32_t query_begin;  // PrefixPlan::unit_queries[query_begin, query_begin + num_queries)
  int32_t num_queries;
  int32_t m_tile;     // tensor-core rows: the smallest of options.m_tiles >= num_queries * group
  int32_t kv_shared;  // 1: other units read the same KV tokens (keep them in L2), else 0
  int32_t tail_begin;  // its tails: PrefixPlan::unit_tails[tail_begin, tail_begin + num_tails)
  int32_t num_tails;
};

// KV some of a unit's queries read after the unit's own: tokens [0, num_tokens) of the blocks
// from DecodeBatch::block_ids index block_begin, for the unit's queries [query_begin, query_end)
// (counted from the unit's first).
struct UnitTail {
  int32_t query_begin;
  int32_t query_end;
  int32_t block_begin;
  int32_t num_tokens;
};

struct UnitQuery {
  int32_t seq;
  int32_t piece;  // -1: the unit covers all of seq's KV and writes its output rows; else the
                  // partial slot of (seq, kv head h) is h * PrefixPlan::num_pieces + piece (the
                  // GPU's workspace strides the heads by a capacity: PrefixParams::piece_stride)
};

struct PrefixPlan {
  // In launch order: the longest first (a worker that starts a long unit late finishes late),
  // row chunks of one KV run side by side (they read it together, while it is in L2).
  std::vector<PrefixUnit> units;
  std::vector<UnitQuery> unit_queries;
  std::vector<UnitTail> unit_tails;  // PrefixUnit::tail_begin
  // One per sequence with several pieces, or with no KV at all (num_partials 0: the merge writes
  // the empty state, o = 0 and lse = -inf), with kv_head 0: it stands for one task per kv head h,
  // folding slots partial_begin + h * num_pieces + [0, num_partials). Run after every item.
  std::vector<MergeTask> merges;
  int32_t num_pieces = 0;  // partial slots per kv head
  int32_t num_kv_heads = 0;
  int32_t group = 0;
  int32_t split_tokens = 0;  // the long-KV split's piece length, 0 when nothing was split

  // Partial-state scratch the executor provides, as for DecodePlan:
  //   o [num_partials, group, head_dim] (options.partial_o_bytes_per_element), lse [num_partials, group] fp32.
  int32_t num_partials() const { return num_pieces * num_kv_heads; }
  int64_t num_items() const { return int64_t(units.size()) * num_kv_heads; }
};

// Bytes a plan moves through device memory in one layer, by what they are.
struct PlanTraffic {
  int64_t kv = 0;       // K and V tokens of every item
  int64_t q = 0;        // query rows of every item
  int64_t partial = 0;  // partial states written by items and read by merges (o and fp32 lse)
  int64_t out = 0;      // output rows written once
  int64_t total() const { return kv + q + partial + out; }
};

// Throws Error(kInvalidArgument) when the batch or shape is inconsistent (as plan_decode) or the
// options are (no m tile, a tile not a positive multiple of 16).
PrefixPlan plan_prefix(const DecodeBatch& batch, const AttentionShape& shape, const DeviceInfo& device,
                       const PrefixPlanOptions& options = {});

// The same plan from a forest already built for this batch.
PrefixPlan plan_prefix(const PrefixForest& forest, const DecodeBatch& batch, const AttentionShape& shape,
                       const DeviceInfo& device, const PrefixPlanOptions& options = {});

// Cascade attention (FlashInfer's cascade inference, merge.h): every request reads one shared
// prefix (shared_blocks, shared_tokens) and then its own suffix. The batch it builds, planned by
// plan_prefix like any other: the prefix is a root node read once for all requests.
//   suffix_blocks[r]: request r's own blocks; suffix_tokens[r]: its tokens in them.
// shared_tokens must fill shared_blocks exactly (a multiple of block_size).
DecodeBatch cascade_batch(const std::vector<int32_t>& shared_blocks, int32_t shared_tokens,
                          const std::vector<std::vector<int32_t>>& suffix_blocks,
                          const std::vector<int32_t>& suffix_tokens, int32_t block_size);

// KV tokens the plan's units read for one kv head, their tails included.
int64_t plan_kv_tokens(const PrefixPlan& plan);

// Element sizes from the options the plan was made with.
PlanTraffic plan_traffic(const PrefixPlan& plan, const AttentionShape& shape, const PrefixPlanOptions& options);

// KV tokens the batch holds once each: every distinct block counted once, at the most tokens any
// sequence reads from it. unique tokens x 2 x kv heads x head_dim x bytes is the bound's numerator.
int64_t unique_kv_tokens(const DecodeBatch& batch, int32_t block_size);

// Keeps the last batch's forest and plan: a step whose block tables are unchanged gets the same
// plan back without planning, and a step in which sequences only grew at their private ends (a
// token or a new block appended: the usual decode step) updates the forest in place and repacks,
// skipping the forest build. Anything else plans from scratch.
class PrefixPlanner {
 public:
  PrefixPlanner(const AttentionShape& shape, const DeviceInfo& device, PrefixPlanOptions options = {});

  const PrefixPlan& plan(const DecodeBatch& batch);

  enum class Update : uint8_t { kReused, kGrown, kRebuilt };
  Update last_update() const { return last_update_; }

 private:
  bool grow_in_place(const DecodeBatch& batch);

  AttentionShape shape_;
  DeviceInfo device_;
  PrefixPlanOptions options_;
  DecodeBatch batch_;
  PrefixForest forest_;
  std::vector<int32_t> leaf_of_;  // per sequence: its node when it is that node's only query, else -1
  PrefixPlan plan_;
  bool valid_ = false;
  Update last_update_ = Update::kRebuilt;
};

}  // namespace pagoda::attention

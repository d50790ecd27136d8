// The CPU executor of a DecodePlan: the reference every other backend's decode attention is
// tested against, and the decode attention of the CPU backend.
#pragma once

#include "pagoda/attention/decode_batch.h"
#include "pagoda/attention/plan.h"
#include "pagoda/attention/prefix_plan.h"
#include "pagoda/core/paged_kv.h"

namespace pagoda::cpu {

// Runs `plan` (from plan_decode(batch, shape, ...)) over one layer's pools: every work item in
// parallel (OpenMP), then every merge.
//   q:   [num_seqs, num_q_heads, head_dim] fp32, one query token per sequence
//   out: [num_seqs, num_q_heads, head_dim] fp32
//   lse: [num_seqs, num_q_heads] fp32, natural log of the softmax denominator; may be null
// A sequence with no KV gets o = 0 and lse = -inf. Throws Error(kInvalidArgument) when the pool
// does not match the shape or a block id is outside the pool.
void run_decode_cpu(const attention::DecodePlan& plan, const attention::DecodeBatch& batch, const attention::AttentionShape& shape,
                    const PagedKv& kv, const float* q, float* out, float* lse = nullptr);

// The same for a prefix plan (prefix_plan.h): every (unit, kv head) item computes the states of
// its queries over its KV run, then the merges fold the partial states. Same arguments.
void run_prefix_cpu(const attention::PrefixPlan& plan, const attention::DecodeBatch& batch, const attention::AttentionShape& shape,
                    const PagedKv& kv, const float* q, float* out, float* lse = nullptr);

}  // namespace pagoda::cpu

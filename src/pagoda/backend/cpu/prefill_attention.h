// Causal attention on the CPU for a chunk of new tokens of one sequence whose K and V are
// already in the pool. The chunk may start anywhere: start_pos > 0 is a later chunk of a chunked
// prefill, or the first chunk after a prefix-cache hit (the prefix's blocks, possibly shared
// with other sequences, are simply the table's leading ids).
#pragma once

#include <cstdint>
#include <span>

#include "pagoda/attention/decode_batch.h"
#include "pagoda/core/paged_kv.h"

namespace pagoda::cpu {

// New token i (position start_pos + i) attends to pool tokens [0, start_pos + i].
//   block_ids: the sequence's blocks, covering at least start_pos + num_new tokens
//   q:   [num_new, num_q_heads, head_dim] fp32
//   out: [num_new, num_q_heads, head_dim] fp32
//   lse: [num_new, num_q_heads] fp32, natural log; may be null
// Parallel (OpenMP) over (token, kv head) pairs, each serving its GQA group of q heads.
// Throws Error(kInvalidArgument) for a shape, pool or block list that does not fit.
void prefill_attention_cpu(const attention::AttentionShape& shape, const PagedKv& kv,
                           std::span<const int32_t> block_ids, int32_t start_pos, int32_t num_new,
                           const float* q, float* out, float* lse = nullptr);

}  // namespace pagoda::cpu

// What both decode kernels read: the plan's work items over one layer's paged pools, and where
// each item's state goes (the output rows, or a partial slot for the merge). Plain data, shared
// by the host code that fills it and the kernels that take it by value.
#pragma once

#include <cstdint>

#include "pagoda/attention/plan.h"
#include "pagoda/backend/cuda/kernels/kv_pool_params.h"

namespace pagoda::cuda {

struct DecodeParams {
  const attention::WorkItem* items;
  const int32_t* block_ids;  // DecodeBatch::block_ids; an item's blocks start at block_begin
  KvPoolParams pool;  // the layer's K and V
  bool blocks_contiguous;  // HND: one block of one head is one run of block_size * head_dim
  const void* q;           // [num_seqs, num_q_heads, head_dim] T
  void* out;               // [num_seqs, num_q_heads, head_dim] T
  float* lse;              // [num_seqs, num_q_heads] or null
  void* partial_o;         // [num_partials, group, head_dim] T
  float* partial_lse;      // [num_partials, group]
  int32_t num_q_heads;
  int32_t group;        // query rows per item: q heads kv_head * group + [0, group)
  float scale_log2;     // softmax scale * log2(e): scores live in the exp2 domain
  bool l2_prefetch;     // prefetch upcoming blocks into L2
  bool evict_first;     // load KV with an evict_first L2 policy
  int32_t prefetch_distance;  // kernel-specific units, always > 0
};

}  // namespace pagoda::cuda

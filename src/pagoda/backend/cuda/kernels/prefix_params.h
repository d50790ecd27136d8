// What prefix_tiled_kernel reads: a PrefixPlan's units over one layer's paged pools (item i is
// unit i / num_kv_heads for kv head i % num_kv_heads), and where each item's states go. Plain
// data, filled on the host and taken by value by the kernel.
#pragma once

#include <cstdint>

#include "pagoda/attention/prefix_plan.h"
#include "pagoda/backend/cuda/kernels/kv_pool_params.h"

namespace pagoda::cuda {

struct PrefixParams {
  const attention::PrefixUnit* units;  // launch order
  const attention::UnitQuery* unit_queries;
  const int32_t* block_ids;  // DecodeBatch::block_ids
  KvPoolParams pool;  // the layer's K and V
  const void* q;       // [num_seqs, num_q_heads, head_dim] T
  void* out;           // [num_seqs, num_q_heads, head_dim] T
  float* lse;          // [num_seqs, num_q_heads] or null
  void* partial_o;     // [num_kv_heads * num_pieces, group, head_dim] T
  float* partial_lse;  // [num_kv_heads * num_pieces, group]
  int32_t num_items;  // units x kv heads
  int32_t num_q_heads;
  int32_t num_kv_heads;
  int32_t group;
  int32_t num_pieces;
  float scale_log2;  // softmax scale * log2(e)
};

}  // namespace pagoda::cuda

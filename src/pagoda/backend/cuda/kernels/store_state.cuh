// Where a work item's final state goes: its query rows of the output (and lse) when the item
// covers its sequence's whole KV, else its slot in the partial-state scratch for the merge.
#pragma once

#include <cstdint>

#include "pagoda/backend/cuda/kernels/decode_params.h"
#include "pagoda/backend/cuda/kernels/ptx.cuh"

namespace pagoda::cuda {

// Element d of query row r (of the item's group) of the normalized o.
template <typename T, int kHeadDim>
__device__ __forceinline__ void store_state_o(const DecodeParams& p, const attention::WorkItem& item,
                                              int r, int d, float o) {
  if (item.partial < 0) {
    const int64_t row = int64_t(item.seq) * p.num_q_heads + int64_t(item.kv_head) * p.group + r;
    static_cast<T*>(p.out)[row * kHeadDim + d] = ptx::from_float<T>(o);
  } else {
    static_cast<T*>(p.partial_o)[(int64_t(item.partial) * p.group + r) * kHeadDim + d] = ptx::from_float<T>(o);
  }
}

// lse: natural log of the softmax denominator, -inf for an empty range.
__device__ __forceinline__ void store_state_lse(const DecodeParams& p, const attention::WorkItem& item,
                                                int r, float lse) {
  if (item.partial < 0) {
    const int64_t row = int64_t(item.seq) * p.num_q_heads + int64_t(item.kv_head) * p.group + r;
    if (p.lse) p.lse[row] = lse;
  } else {
    p.partial_lse[int64_t(item.partial) * p.group + r] = lse;
  }
}

}  // namespace pagoda::cuda

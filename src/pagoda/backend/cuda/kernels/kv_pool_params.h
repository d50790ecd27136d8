// One layer's paged K and V pools as the attention kernels (decode, prefill, prefix) read them.
// Plain data, held by value in each kernel's params and filled on the host by kv_pool_params.
#pragma once

#include <bit>
#include <cstdint>

#include "pagoda/core/paged_kv.h"

namespace pagoda::cuda {

struct KvPoolParams {
  const void* k;  // elements of the kernel's T
  const void* v;
  int64_t page_stride;  // in elements (core/paged_kv.h)
  int64_t head_stride;
  int64_t token_stride;
  int32_t block_size_log2;
};

// block_size: the attention shape's, a power of two the callers have checked against the pool's.
inline KvPoolParams kv_pool_params(const PagedKv& kv, int32_t block_size) {
  return {.k = kv.k,
          .v = kv.v,
          .page_stride = kv.page_stride,
          .head_stride = kv.head_stride,
          .token_stride = kv.token_stride,
          .block_size_log2 = std::countr_zero(uint32_t(block_size))};
}

}  // namespace pagoda::cuda

// PagedKv: one layer's paged K and V pools as attention reads them. It lives in core/ because
// both kv/ (which owns and writes the pools) and attention/ (which reads them) need it, and the
// two must not depend on each other.
//
// A pool is num_blocks pages of block_size tokens. Strides (page, head, token) describe where an
// element lives, so one executor serves both layouts; head_dim is always contiguous.
//   HND (default): [num_blocks][num_kv_heads][block_size][head_dim]. One block of one head is one
//                  contiguous run (16 x 128 x 2 B = 4 KB): one prefetch, one bulk copy.
//   NHD:           [num_blocks][block_size][num_kv_heads][head_dim], as vLLM and FlashAttention.
// In both a whole page is contiguous, so copying a block is one memcpy of page_stride elements.
#pragma once

#include <cstdint>

#include "pagoda/core/dtype.h"
#include "pagoda/core/tensor.h"

namespace pagoda {

enum class KvLayout : uint8_t { kHnd, kNhd };

struct PagedKv {
  // Element (block, head, token, d) of K is k[block * page_stride + head * head_stride +
  // token * token_stride + d], in elements of dtype; V has the same layout.
  void* k = nullptr;
  void* v = nullptr;
  DType dtype = DType::kF32;  // f32, f16 or bf16
  Device device = Device::kCpu;
  int32_t num_blocks = 0;
  int32_t block_size = 0;  // tokens per block
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int64_t page_stride = 0;
  int64_t head_stride = 0;
  int64_t token_stride = 0;

  int64_t elements_per_pool() const { return int64_t(num_blocks) * page_stride; }
  friend bool operator==(const PagedKv&, const PagedKv&) = default;
};

// The view of pools k and v laid out as `layout`.
inline PagedKv make_paged_kv(void* k, void* v, DType dtype, KvLayout layout, int32_t num_blocks,
                             int32_t block_size, int32_t num_kv_heads, int32_t head_dim,
                             Device device = Device::kCpu) {
  PagedKv kv{.k = k,
             .v = v,
             .dtype = dtype,
             .device = device,
             .num_blocks = num_blocks,
             .block_size = block_size,
             .num_kv_heads = num_kv_heads,
             .head_dim = head_dim};
  kv.page_stride = int64_t(block_size) * num_kv_heads * head_dim;
  if (layout == KvLayout::kHnd) {
    kv.head_stride = int64_t(block_size) * head_dim;
    kv.token_stride = head_dim;
  } else {
    kv.head_stride = head_dim;
    kv.token_stride = int64_t(num_kv_heads) * head_dim;
  }
  return kv;
}

}  // namespace pagoda

// KvCache: CPU-owned K and V pools for every layer, addressed by the block ids of a BlockPool of
// the same num_blocks. Each layer's pools are described to attention as a PagedKv (strides for
// the HND or NHD layout; see core/paged_kv.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "pagoda/core/dtype.h"
#include "pagoda/core/paged_kv.h"
#include "pagoda/core/quantized_paged_kv.h"
#include "pagoda/core/tensor.h"
#include "pagoda/kv/block_table.h"
#include "pagoda/kv/kv_cache_config.h"

namespace pagoda::cpu {

class KvCache {
 public:
  // Allocates the pools (uninitialized); throws Error(kInvalidArgument) for a bad config.
  explicit KvCache(const kv::KvCacheConfig& config);

  const kv::KvCacheConfig& config() const { return config_; }
  // Bytes of K and V storage over all layers.
  size_t nbytes() const { return nbytes_; }

  // Layer `layer`'s pools.
  PagedKv layer(int32_t layer) const;

  // Stores K and V of the sequence's tokens [start_pos, start_pos + n) in layer `layer`,
  // converting from fp32 to the pool dtype (round to nearest even).
  //   k, v: [n, num_kv_heads, head_dim] fp32, contiguous
  // The table must already cover the tokens (append_tokens first): start_pos + n <= table.length.
  void write(int32_t layer, const kv::BlockTable& table, int32_t start_pos, const Tensor& k,
             const Tensor& v);
  // Same, given the sequence's block ids alone (as a backend holds them for a step): the blocks
  // must cover start_pos + n tokens.
  void write(int32_t layer, std::span<const kv::BlockId> block_ids, int32_t start_pos,
             const Tensor& k, const Tensor& v);

  // Copies block src into block dst in every layer, K and V (for a BlockCopy from append_tokens).
  void copy_block(kv::BlockId src, kv::BlockId dst);

 private:
  kv::KvCacheConfig config_;
  size_t pool_bytes_ = 0;  // one layer's K (or V) pool
  size_t nbytes_ = 0;
  std::unique_ptr<std::byte[]> storage_;  // [num_layers][2 (K, V)][pool_bytes_]
};

}  // namespace pagoda::cpu

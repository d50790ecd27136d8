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

namespace pagoda::kv {

struct KvCacheConfig {
  int32_t num_layers = 0;
  int32_t num_blocks = 0;
  int32_t block_size = 16;  // tokens per block
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  DType dtype = DType::kF32;  // f32, f16 or bf16
  KvLayout layout = KvLayout::kHnd;
  // kFp8 or kInt2: stored quantized (backend/cpu/quantized_kv_cache.h; KvCache refuses them),
  // int2 in partitions of `partition` elements, with stochastic rounding seeded by `seed`.
  KvQuant quant = KvQuant::kNone;
  int32_t partition = 64;
  uint64_t seed = 0;
  // Keys (and the queries that meet them) are rotated by a randomized Hadamard transform before
  // they are stored (backend/cpu/hadamard.h): scores are unchanged, outlier channels spread out.
  bool hadamard = false;
};

class KvCache {
 public:
  // Allocates the pools (uninitialized); throws Error(kInvalidArgument) for a bad config.
  explicit KvCache(const KvCacheConfig& config);

  const KvCacheConfig& config() const { return config_; }
  // Bytes of K and V storage over all layers.
  size_t nbytes() const { return nbytes_; }

  // Layer `layer`'s pools.
  PagedKv layer(int32_t layer) const;

  // Stores K and V of the sequence's tokens [start_pos, start_pos + n) in layer `layer`,
  // converting from fp32 to the pool dtype (round to nearest even).
  //   k, v: [n, num_kv_heads, head_dim] fp32, contiguous
  // The table must already cover the tokens (append_tokens first): start_pos + n <= table.length.
  void write(int32_t layer, const BlockTable& table, int32_t start_pos, const Tensor& k,
             const Tensor& v);
  // Same, given the sequence's block ids alone (as a backend holds them for a step): the blocks
  // must cover start_pos + n tokens.
  void write(int32_t layer, std::span<const BlockId> block_ids, int32_t start_pos,
             const Tensor& k, const Tensor& v);

  // Copies block src into block dst in every layer, K and V (for a BlockCopy from append_tokens).
  void copy_block(BlockId src, BlockId dst);

 private:
  KvCacheConfig config_;
  size_t pool_bytes_ = 0;  // one layer's K (or V) pool
  size_t nbytes_ = 0;
  std::unique_ptr<std::byte[]> storage_;  // [num_layers][2 (K, V)][pool_bytes_]
};

}  // namespace pagoda::kv

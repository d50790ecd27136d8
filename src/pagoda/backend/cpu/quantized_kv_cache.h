// QuantizedKvCache: the CPU backend's K and V pools for every layer in int2 or fp8
// (core/quantized_paged_kv.h), addressed by the block ids of a BlockPool, quantizing as tokens
// are appended.
//
// int2's V partitions run along the sequence, so a partition is quantized only when its Π-th
// token arrives; until then its tokens wait in f16 in a tail slot of the block. A block takes a
// slot when its partition's first token is written (keeping the one it had: a freed block that
// is reused starts at a partition boundary) and gives it back when its last partition seals, so
// the slots in use are about one per sequence in flight, not one per block. Sink tokens (the
// first config.sink_tokens of a sequence) are kept in f16 in a sink slot of the block that holds
// position 0, taken when position 0 is written and given back when the block is written again
// from a later position.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "pagoda/core/quantized_paged_kv.h"
#include "pagoda/core/tensor.h"
#include "pagoda/kv/kv_cache_config.h"

namespace pagoda::cpu {

class QuantizedKvCache {
 public:
  // config.quant is kFp8 or kInt2; throws Error(kInvalidArgument) for a bad config (an int2
  // partition that does not divide head_dim or block_size, ...).
  explicit QuantizedKvCache(const kv::KvCacheConfig& config);

  const kv::KvCacheConfig& config() const { return config_; }
  // Bytes of the quantized pools and their metadata over all layers (tail slots, which grow on
  // demand, excluded).
  size_t nbytes() const { return nbytes_; }

  // Layer `layer`'s pools; valid until the next write or copy_block.
  QuantizedPagedKv layer(int32_t layer) const;

  // Quantizes and stores K and V of tokens [start_pos, start_pos + n) of a sequence whose blocks
  // are block_ids: k, v [n, num_kv_heads, head_dim] fp32, contiguous.
  void write(int32_t layer, std::span<const int32_t> block_ids, int32_t start_pos, const Tensor& k,
             const Tensor& v);

  // Copies block src into dst in every layer: codes, metadata and the tail (copy on write).
  void copy_block(int32_t src, int32_t dst);

  // A block's K or V page in one layer: its codes and metadata as stored, the same bytes for K
  // and V (what moves between servers, Backend::read_kv_pages).
  size_t page_bytes() const;
  // The K pages of `blocks` in order, then their V pages, page_bytes() each. write_pages marks
  // every V partition of the blocks sealed (int2): write_tail then sets the last block's.
  void read_pages(int32_t layer, std::span<const int32_t> blocks, std::byte* dst) const;
  void write_pages(int32_t layer, std::span<const int32_t> blocks, const std::byte* src);
  // int2: the f16 rows of the V partition a block of `tokens` tokens is still filling
  // ([kv head][tokens % Π][head_dim]); 0 bytes for fp8 or a whole number of partitions.
  size_t tail_bytes(int32_t tokens) const;
  void read_tail(int32_t layer, int32_t block, int32_t tokens, std::byte* dst) const;
  // Makes block hold `tokens` tokens' V partitions: tokens / Π sealed, the rest from src.
  void write_tail(int32_t layer, int32_t block, int32_t tokens, const std::byte* src);

 private:
  struct Layer {
    std::unique_ptr<std::byte[]> arena;
    QuantizedPagedKv view;  // its tail fields are set by layer()
    std::vector<int32_t> sealed, tail_slot, free_slots;
    std::vector<f16> tail;
    std::vector<int32_t> sink_slot, free_sink_slots;
    std::vector<f16> sink_k, sink_v;
  };
  int32_t acquire_sink_slot(Layer& layer, int32_t block);
  void release_sink_slot(Layer& layer, int32_t block);
  void write_fp8_keys(Layer& layer, int32_t block, int32_t slot, const float* k);
  int32_t acquire_tail_slot(Layer& layer, int32_t block);
  void release_tail_slot(Layer& layer, int32_t block);
  void write_int2_token(int32_t layer_index, Layer& layer, int32_t block, int32_t slot, int32_t pos,
                        const float* k, const float* v);
  void write_fp8_token(Layer& layer, int32_t block, int32_t slot, const float* k, const float* v);
  // The arrays of one block's K page (is_v false) or V page: base pointer and bytes per block.
  struct PageArray {
    std::byte* base;
    size_t block_bytes;
  };
  std::vector<PageArray> page_arrays(const QuantizedPagedKv& kv, bool is_v) const;
  void check_block(int32_t layer, int32_t block, int32_t tokens) const;

  kv::KvCacheConfig config_;
  size_t nbytes_ = 0;
  std::vector<Layer> layers_;
};

}  // namespace pagoda::cpu

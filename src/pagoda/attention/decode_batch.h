// The description of one decode step's attention: the shape of the heads, and per query sequence
// its KV block ids and length. Block ids are stored CSR-style (all sequences concatenated plus
// offsets), the form a GPU kernel takes directly.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace pagoda::attention {

struct AttentionShape {
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;  // GQA: q head h reads kv head h / group_size()
  int32_t head_dim = 0;
  int32_t block_size = 0;     // tokens per KV block
  float softmax_scale = 0.f;  // usually 1 / sqrt(head_dim)

  int32_t group_size() const { return num_q_heads / num_kv_heads; }
};

struct DecodeBatch {
  std::vector<int32_t> block_ids;      // [sum over sequences of their block count]
  std::vector<int32_t> block_offsets{0};  // [num_seqs + 1]: sequence s owns block_ids[offsets[s], offsets[s + 1])
  std::vector<int32_t> kv_lengths;     // [num_seqs]: tokens of KV each sequence attends to

  int32_t num_seqs() const { return int32_t(kv_lengths.size()); }
  std::span<const int32_t> blocks_of(int32_t seq) const {
    return std::span(block_ids).subspan(size_t(block_offsets[size_t(seq)]),
                                        size_t(block_offsets[size_t(seq) + 1] - block_offsets[size_t(seq)]));
  }
  // Appends a query sequence attending to kv_length tokens held in `blocks` (in order).
  void add_sequence(std::span<const int32_t> blocks, int32_t kv_length) {
    block_ids.insert(block_ids.end(), blocks.begin(), blocks.end());
    block_offsets.push_back(int32_t(block_ids.size()));
    kv_lengths.push_back(kv_length);
  }
};

}  // namespace pagoda::attention

// TensorShard: which part of a model one tensor-parallel rank holds (Megatron-LM's split,
// "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model Parallelism",
// arXiv:1909.08053): attention heads and the SwiGLU width column-parallel, the vocabulary by rows.
//
// Splits need not be even: the default model has 9 q heads and 3 kv heads, and N = 2 or 4 must
// run it. Only the collectives need equal shapes on every rank, and they move [rows, hidden]
// activations and [rows, vocab / N] logits, so only the vocabulary is padded (its last shard with
// zero rows, whose logits are dropped).
#pragma once

#include "pagoda/model/config.h"

namespace pagoda {

struct TensorShard {
  int rank = 0;
  int world_size = 1;
};

struct ShardLayout {
  // q heads [q_head_begin, + num_q_heads) and the kv heads they read, [kv_head_begin, +
  // num_kv_heads). With more ranks than kv heads, each rank's q heads fall in one GQA group and
  // the rank holds that group's kv head (replicated on the ranks that share the group).
  int q_head_begin = 0, num_q_heads = 0;
  int kv_head_begin = 0, num_kv_heads = 0;
  // Rows [ffn_begin, + ffn_size) of gate and of up, and the same columns of down: a multiple of
  // 256 or 32 where the width allows, so that a block-quantized down splits on block boundaries.
  int ffn_begin = 0, ffn_size = 0;
  // Ids [vocab_begin, + vocab_rows) of the embedding and lm_head; vocab_rows is ceil(vocab / N)
  // on every rank, the file holding only vocab_stored of them (the last shard is padded).
  int vocab_begin = 0, vocab_rows = 0, vocab_stored = 0;
};

// Throws Error(kInvalidArgument) when the model cannot be split over world_size ranks: fewer q
// heads than ranks (a rank would hold no head), or a SwiGLU width narrower than the ranks.
void check_tensor_parallel(const ModelConfig& config, int world_size);
ShardLayout shard_layout(const ModelConfig& config, TensorShard shard);
// The config a rank's forward pass runs: its heads, SwiGLU width and (padded) vocabulary share.
ModelConfig shard_config(const ModelConfig& config, const ShardLayout& layout);

}  // namespace pagoda

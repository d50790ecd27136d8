// Model: the Llama-family forward pass (RMSNorm, RoPE, GQA attention over the paged KV cache,
// SwiGLU, optional QKV bias, tied embeddings), written once against the Backend interface.
//
// One forward() is one engine step: any mix of prefill chunks and single-token decodes, each
// sequence attending to its own paged KV. Logits are computed only for rows that sample.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "pagoda/backend/backend.h"
#include "pagoda/model/checkpoint.h"
#include "pagoda/model/weights.h"

namespace pagoda {

struct SequenceChunk {
  std::span<const int32_t> tokens;     // the new tokens, at positions start_pos...
  int32_t start_pos = 0;               // tokens of this sequence already in the KV cache
  std::span<const int32_t> block_ids;  // its block table, with room for start_pos + tokens.size()
  bool want_logits = false;            // return logits for the last new token
};

class Model {
 public:
  Model(const Checkpoint& checkpoint, Backend& backend, const LoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  Backend& backend() const { return backend_; }
  int32_t kv_block_size() const { return kv_block_size_; }
  // Bytes of weights in backend memory: what one decode step must read (the embedding table once,
  // as lm_head, when tied).
  size_t weight_bytes() const;
  // Storage type of the matmul weights.
  DType weight_dtype() const { return weights_.embedding.dtype; }

  // Allocates the backend's paged KV cache: num_blocks blocks of block_size tokens, every layer.
  // Returns its size in bytes.
  size_t allocate_kv_cache(int32_t num_blocks, int32_t block_size, DType dtype = DType::kF32);

  // Runs one step. Returns logits [number of chunks with want_logits, vocab] (f32, host), in chunk
  // order; valid until the next call.
  std::span<const float> forward(std::span<const SequenceChunk> chunks);

 private:
  void ensure_workspace(int64_t rows, int64_t logit_rows);
  AttentionStep plan_step(std::span<const SequenceChunk> chunks) const;

  ModelConfig config_;
  Backend& backend_;
  ModelWeights weights_;
  int32_t kv_block_size_ = 0;
  int32_t kv_num_blocks_ = 0;

  // Activations, sized for the largest step so far.
  int64_t workspace_rows_ = 0;
  int64_t workspace_logit_rows_ = 0;
  std::shared_ptr<Backend::Buffer> x_, h_, qkv_, attn_, gate_up_, act_, logits_in_, logits_;
  std::vector<float> host_logits_;
};

}  // namespace pagoda

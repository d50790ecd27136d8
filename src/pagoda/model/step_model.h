// StepModel: what the engine drives, one step at a time: a Model on one backend, or one split
// over tensor-parallel ranks (parallel/tensor_parallel_model.h). The engine's calls are per step,
// never per op, so the virtual calls cost nothing measurable.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "pagoda/backend/backend.h"
#include "pagoda/model/config.h"

namespace pagoda {

struct SequenceChunk {
  std::span<const int32_t> tokens;     // the new tokens, at positions start_pos...
  int32_t start_pos = 0;               // tokens of this sequence already in the KV cache
  std::span<const int32_t> block_ids;  // its block table, with room for start_pos + tokens.size()
  bool want_logits = false;            // return logits for the last new token
};

class StepModel {
 public:
  virtual ~StepModel() = default;

  // The whole model's shape (not a rank's share of it).
  virtual const ModelConfig& config() const = 0;
  // Bytes of weights one device holds (one rank's, the largest, when split).
  virtual size_t weight_bytes() const = 0;
  virtual DType weight_dtype() const = 0;

  // Bytes of KV one block of block_size tokens takes on one device (the largest rank's share).
  virtual size_t kv_block_bytes(int32_t block_size) const = 0;
  // Allocates num_blocks KV blocks on every device; the block ids (one kv::BlockPool) are shared.
  virtual size_t allocate_kv_cache(int32_t num_blocks, int32_t block_size) = 0;
  virtual void reserve(int64_t max_rows, int64_t max_logit_rows) = 0;
  // Backend::graph_rows, can_sample and copy_kv_block, on every device.
  virtual int32_t graph_rows(int32_t rows) const = 0;
  virtual bool can_sample() const = 0;
  virtual void copy_kv_block(int32_t src, int32_t dst) = 0;

  // One step (Model::run); the logits of the chunks with want_logits stay on the device until
  // download_logits() or sample() (full vocabulary rows, once, however the model is split).
  // after_layer_kv, when set, is called with each layer's index once its K/V are stored.
  virtual void run(std::span<const SequenceChunk> chunks,
                   const std::function<void(int32_t layer)>& after_layer_kv = {}) = 0;
  virtual std::span<const float> download_logits() = 0;
  virtual std::vector<int32_t> sample(std::span<const SamplingRow> rows, int32_t valid_vocab) = 0;
  // The k most likely tokens of some of the last step's logit rows (indices among them) by
  // log-softmax over the first valid_vocab ids, on the device: [rows.size(), k], best first.
  virtual void top_logprobs(std::span<const int32_t> rows, int32_t k, int32_t valid_vocab,
                            std::vector<int32_t>& tokens, std::vector<float>& logprobs) = 0;
  // run(chunks), then download_logits().
  std::span<const float> forward(std::span<const SequenceChunk> chunks) {
    run(chunks);
    return download_logits();
  }

  virtual int64_t prefix_steps() const = 0;
  virtual double step_planning_seconds() const = 0;
};

}  // namespace pagoda

// Model: the Llama-family forward pass (RMSNorm, RoPE, GQA attention over the paged KV cache,
// SwiGLU, optional QKV bias, tied embeddings), written once against the Backend interface.
//
// One run() is one engine step: any mix of prefill chunks and single-token decodes, each
// sequence attending to its own paged KV. Logits are computed only for rows that sample, and stay
// in backend memory until download_logits() or sample() asks for them: a GPU step then moves
// token ids to the host, not a [batch, vocab] matrix.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "pagoda/backend/backend.h"
#include "pagoda/model/checkpoint.h"
#include "pagoda/model/step_model.h"
#include "pagoda/model/weights.h"
#include "pagoda/parallel/communicator.h"

namespace pagoda {

class Model final : public StepModel {
 public:
  // communicator non-null: this is one tensor-parallel rank of communicator->world_size(), holding
  // its shard of the weights and KV heads (shard.h); its collectives join the other ranks'.
  Model(const Checkpoint& checkpoint, Backend& backend, const LoadOptions& options = {},
        parallel::Communicator* communicator = nullptr);

  const ModelConfig& config() const { return config_; }
  Backend& backend() const { return backend_; }
  int32_t kv_block_size() const { return kv_block_size_; }
  // How the KV cache stores K and V (LoadOptions): an unquantized cache's dtype (an int2 cache's
  // tail: f16), its quantization, int2's partition, and whether keys are rotated.
  DType kv_dtype() const { return kv_dtype_; }
  KvQuant kv_quant() const { return kv_quant_; }
  int32_t kv_partition() const { return kv_partition_; }
  bool kv_hadamard() const { return kv_hadamard_; }
  KvQuant kv_key_quant() const { return kv_key_quant_; }
  int32_t kv_sink_tokens() const { return kv_sink_tokens_; }
  // Bytes of weights in backend memory: what one decode step must read (the embedding table once,
  // as lm_head, when tied).
  size_t weight_bytes() const;
  // Storage type of the matmul weights.
  DType weight_dtype() const { return weights_.embedding.dtype; }

  // Allocates the backend's paged KV cache: num_blocks blocks of block_size tokens, every layer,
  // stored as LoadOptions asked (kv_dtype, kv_quant). Returns its size in bytes.
  size_t allocate_kv_cache(int32_t num_blocks, int32_t block_size);
  // Bytes of KV one block of block_size tokens takes over all layers and kv heads (an int2
  // cache's tail slots excluded).
  size_t kv_block_bytes(int32_t block_size) const;
  // Sizes the activations for steps of up to max_rows tokens and max_logit_rows sampled rows now,
  // so that no later step reallocates them (and invalidates the backend's captured graphs).
  void reserve(int64_t max_rows, int64_t max_logit_rows);

  // Runs one step. The logits of the chunks with want_logits, in chunk order, stay in backend
  // memory until the next run. after_layer_kv, when set, is called with each layer's index as
  // soon as the step's K/V of that layer are stored (a decode step replayed as a CUDA graph: for
  // every layer after the graph), so that they can be read while the next layers compute.
  void run(std::span<const SequenceChunk> chunks,
           const std::function<void(int32_t layer)>& after_layer_kv = {}) override;
  // The last step's logits on the host: [chunks with want_logits, vocab] f32; valid until the
  // next run.
  std::span<const float> download_logits();
  // One token per row of the last step's logits, sampled on the backend (backend().can_sample())
  // among the first valid_vocab ids (a tokenizer may have fewer tokens than the padded embedding
  // table). rows: one per logit row, in order.
  std::vector<int32_t> sample(std::span<const SamplingRow> rows, int32_t valid_vocab);
  int32_t graph_rows(int32_t rows) const { return backend_.graph_rows(rows); }
  bool can_sample() const { return backend_.can_sample(); }
  void copy_kv_block(int32_t src, int32_t dst) { backend_.copy_kv_block(src, dst); }
  // The k most likely tokens of some of the last step's logit rows (indices among them) by
  // log-softmax over the first valid_vocab ids, on the backend (Backend::top_logprobs): tokens and
  // log-probs [rows.size(), k], best first.
  void top_logprobs(std::span<const int32_t> rows, int32_t k, int32_t valid_vocab, std::vector<int32_t>& tokens,
                    std::vector<float>& logprobs) override;
  // Steps so far whose decode rows attended prefix-aware (LoadOptions::attention).
  int64_t prefix_steps() const { return prefix_steps_; }
  // Host seconds, summed over steps, spent making each step ready to launch: its batch, its
  // attention plan (the prefix planner's or plan_decode's) and the backend's per-step upload. The
  // engine waits for a step's tokens before it plans the next, so the GPU idles for this long.
  double step_planning_seconds() const { return step_planning_seconds_; }

 private:
  StepBatch plan_step(std::span<const SequenceChunk> chunks);
  attention::AttentionShape attention_shape() const;
  void forward_layers(const StepBatch& step, const std::function<void(int32_t layer)>& after_layer_kv);
  // Columns of the gathered logits: the vocabulary, padded to a multiple of the ranks.
  int64_t logits_width() const {
    return communicator_ ? int64_t(local_.vocab_size) * communicator_->world_size() : config_.vocab_size;
  }

  ModelConfig config_;
  // A tensor-parallel rank's share (its heads, SwiGLU width and padded vocabulary; config_ when
  // not split), and the collectives that join the shares (null when not split).
  parallel::Communicator* communicator_;
  ShardLayout shard_;
  ModelConfig local_;
  Backend& backend_;
  ModelWeights weights_;
  int32_t kv_block_size_ = 0;
  int32_t kv_num_blocks_ = 0;
  LoadOptions::Attention attention_mode_;
  DType kv_dtype_;  // of an unquantized cache (and of an int2 cache's tail: f16)
  KvQuant kv_quant_;
  int32_t kv_partition_;
  bool kv_hadamard_;
  KvQuant kv_key_quant_;
  int32_t kv_sink_tokens_;
  bool kv_stochastic_rounding_;
  // Made with the KV cache when decode steps may attend prefix-aware; it keeps the last step's
  // plan, so a step whose sequences only grew updates it instead of planning anew.
  std::optional<attention::PrefixPlanner> prefix_planner_;
  int64_t prefix_steps_ = 0;
  double step_planning_seconds_ = 0;

  // Activations, sized for the largest step so far (reallocating them, through the backend's
  // allocate(), drops the CUDA graphs captured over them).
  int64_t workspace_rows_ = 0;
  int64_t workspace_logit_rows_ = 0;
  std::shared_ptr<Backend::Buffer> x_, h_, qkv_, q_, attn_, proj_, gate_up_, act_, logits_in_, logits_;
  std::shared_ptr<Backend::Buffer> shard_logits_;  // a rank's [rows, vocab share], before the gather
  StepBatch step_;          // the last step (its ops may still be running on the backend)
  int64_t logit_rows_ = 0;  // of the last step
  std::vector<float> host_logits_;
};

}  // namespace pagoda

// The weights of a Llama-family model in backend memory, in the layout the forward pass wants:
// q/k/v fused into one projection and gate/up into another, so each layer runs two fewer GEMMs.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "pagoda/backend/backend.h"
#include "pagoda/core/quantized_paged_kv.h"
#include "pagoda/model/checkpoint.h"
#include "pagoda/model/shard.h"

namespace pagoda {

struct LayerWeights {
  Tensor attn_norm;  // [hidden] of the backend's activation dtype (as the biases and final_norm)
  Tensor qkv;        // [q_dim + 2 * kv_dim, hidden]: q rows, then k, then v (rotate-half order)
  Tensor qkv_bias;   // [q_dim + 2 * kv_dim]; data == nullptr when the model has none
  Tensor o;          // [hidden, q_dim]
  Tensor ffn_norm;   // [hidden]
  Tensor gate_up;    // [2 * intermediate, hidden]: gate rows, then up rows
  Tensor down;       // [hidden, intermediate]
};

struct ModelWeights {
  Tensor embedding;   // [vocab, hidden]
  std::vector<LayerWeights> layers;
  Tensor final_norm;  // [hidden]
  Tensor lm_head;     // [vocab, hidden]; the embedding itself when tied
  std::vector<float> rope_inv_freq;  // [head_dim / 2]
  std::vector<std::shared_ptr<Backend::Buffer>> buffers;  // owns the memory behind the views
};

struct LoadOptions {
  // Storage type of matmul weights stored quantized, f32 or f16 (bf16 checkpoints stay bf16
  // unless this is f32). f16 halves the bytes each decode step reads; f32 is exact. A backend
  // whose activations are f16 or bf16 stores every weight in that type instead.
  DType weight_dtype = DType::kF16;
  // Keep matmul weights (and the embedding) stored in a GGUF block-quantized type in that type,
  // where the backend multiplies it (Backend::takes_quantized_weights: q4_0, q4_1, q5_0, q5_1,
  // q8_0, q4_k, q5_k, q6_k on the CPU and the GPU); weight_dtype then applies to the rest. A fused
  // projection whose parts differ in type is dequantized.
  bool keep_quantized = false;
  bool show_progress = true;
  // How decode steps attend: kPaged, one work item per sequence (split when the batch is small);
  // kPrefix, prefix-aware packing (attention/prefix_plan.h), so that blocks the batch shares are
  // read once; kAuto, prefix packing when the backend can and the step's sequences share blocks.
  enum class Attention : uint8_t { kAuto, kPaged, kPrefix };
  Attention attention = Attention::kAuto;
  // The KV cache's storage: kv_dtype (nullopt: the backend's activation dtype), or, when kv_quant
  // is kFp8 or kInt2, quantized (int2 in partitions of kv_partition elements; see
  // docs/kv-quantization.md).
  std::optional<DType> kv_dtype;
  KvQuant kv_quant = KvQuant::kNone;
  int32_t kv_partition = 64;
  bool kv_hadamard = false;  // rotate keys and queries before a quantized cache stores keys
  // int2 only: the keys' format (kInt2 or kFp8), the first tokens kept in f16, the rounding.
  KvQuant kv_key_quant = KvQuant::kInt2;
  int32_t kv_sink_tokens = 0;
  bool kv_stochastic_rounding = false;
};

// Loads the weights, or (shard.world_size > 1) only a tensor-parallel rank's shard of them
// (shard.h): its rows and columns read straight from the file. Block-quantized weights stay so
// where a shard's columns fall on block boundaries; elsewhere they are dequantized.
ModelWeights load_weights(const Checkpoint& checkpoint, Backend& backend, const LoadOptions& options,
                          TensorShard shard = {});

}  // namespace pagoda

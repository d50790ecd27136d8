// ModelConfig: the shape of a Llama-family model, read from GGUF metadata or a Hugging Face
// config.json. Everything the forward pass needs to know about a model, and nothing else.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

namespace pagoda {

class GgufFile;

// Llama 3.1's frequency-dependent RoPE scaling ("rope_type": "llama3").
struct Llama3RopeScaling {
  bool enabled = false;
  float factor = 1.f;
  float low_freq_factor = 1.f;
  float high_freq_factor = 4.f;
  int original_max_position = 8192;
};

struct ModelConfig {
  std::string architecture;  // "llama", "mistral", "qwen2"
  int vocab_size = 0;
  int hidden_size = 0;        // d_model
  int intermediate_size = 0;  // SwiGLU hidden width
  int num_layers = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int max_context = 0;        // positions the model was trained for
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.f;
  Llama3RopeScaling rope_scaling;
  bool tie_word_embeddings = false;  // lm_head shares the embedding table
  bool qkv_bias = false;             // Qwen2: biases on q/k/v projections

  int q_dim() const { return num_q_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }

  // Both throw Error(kUnsupported) for an architecture pagoda does not run and kCorrupt for
  // missing or inconsistent fields.
  static ModelConfig from_gguf(const GgufFile& file);
  static ModelConfig from_hf_json(const nlohmann::json& config, const std::string& origin);

  void validate(const std::string& origin) const;
};

}  // namespace pagoda

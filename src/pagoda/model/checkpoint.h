// Checkpoint: a model file (GGUF) or Hugging Face folder (config.json + safetensors) opened for
// loading, with its tensors named the Hugging Face way whatever the format, so the loader is
// written once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "pagoda/format/ggml_type.h"
#include "pagoda/model/config.h"

namespace pagoda {

class GgufFile;
class SafetensorsModel;

// A 2-D view of a stored tensor: [rows, cols] row-major, each row `row_bytes` long.
// Dense types (f32/f16/bf16) use the matching GgmlType, so one dequantizer reads every format.
struct StoredTensor {
  std::string name;
  int64_t rows = 0;
  int64_t cols = 0;
  GgmlType type = GgmlType::kF32;
  const uint8_t* data = nullptr;
  size_t row_bytes = 0;

  // Dequantizes rows [first, first + count) into dst [count, cols].
  void read_rows(int64_t first, int64_t count, float* dst) const;
};

class Checkpoint {
 public:
  // A .gguf file, a .safetensors file with config.json beside it, or a folder with config.json and
  // model.safetensors (or a sharded index). Throws Error(kNotFound / kCorrupt / kUnsupported).
  static Checkpoint open(const std::string& path);
  ~Checkpoint();
  Checkpoint(Checkpoint&&) noexcept;

  const ModelConfig& config() const { return config_; }
  const std::string& path() const { return path_; }
  // The GGUF file, or null for a safetensors checkpoint (the tokenizer loads from it).
  const GgufFile* gguf() const { return gguf_.get(); }

  // Hugging Face names: "model.embed_tokens.weight", "model.layers.3.self_attn.q_proj.weight",
  // "lm_head.weight"... find() returns null when absent; get() throws Error(kNotFound).
  // 2-D tensors are [out_features, in_features]; 1-D ones are [1, n].
  const StoredTensor* find(const std::string& hf_name) const;
  const StoredTensor& get(const std::string& hf_name) const;

  // llama.cpp stores Llama's q/k projection rows interleaved for its RoPE; true when rows must be
  // reordered back to the Hugging Face (rotate-half) order on load.
  bool qk_rows_interleaved() const { return qk_rows_interleaved_; }
  // Llama 3.1 GGUF: per-frequency RoPE divisors (empty when absent).
  const std::vector<float>& rope_freq_divisors() const { return rope_freq_divisors_; }

 private:
  Checkpoint() = default;
  std::string path_;
  ModelConfig config_;
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<SafetensorsModel> safetensors_;
  std::vector<StoredTensor> tensors_;  // sorted by name
  bool qk_rows_interleaved_ = false;
  std::vector<float> rope_freq_divisors_;
};

}  // namespace pagoda

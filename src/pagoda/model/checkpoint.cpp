#include "pagoda/model/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/format/dequantize.h"
#include "pagoda/format/gguf.h"
#include "pagoda/format/safetensors.h"

namespace pagoda {
namespace fs = std::filesystem;
namespace {

// GGUF (llama.cpp) tensor names -> Hugging Face names.
std::string hf_name_from_gguf(const std::string& name) {
  static const std::pair<const char*, const char*> kGlobal[] = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
  };
  for (auto [gguf, hf] : kGlobal)
    if (name == gguf) return hf;
  static const std::pair<const char*, const char*> kLayer[] = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_q.bias", "self_attn.q_proj.bias"},
      {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.bias", "self_attn.v_proj.bias"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
  };
  if (name.starts_with("blk.")) {
    const size_t dot = name.find('.', 4);
    if (dot != std::string::npos) {
      const std::string layer = name.substr(4, dot - 4), rest = name.substr(dot + 1);
      for (auto [gguf, hf] : kLayer)
        if (rest == gguf) return "model.layers." + layer + "." + hf;
    }
  }
  return "";  // not a tensor the forward pass reads
}

size_t row_bytes_of(GgmlType type, int64_t cols, const std::string& name) {
  const GgmlTypeTraits traits = ggml_type_traits(uint32_t(type));
  if (!traits.can_dequantize)
    fail(ErrorKind::kUnsupported, "tensor '{}' has type {}, which pagoda cannot load", name, traits.name);
  return size_t(cols / traits.block_size) * size_t(traits.block_bytes);
}

GgmlType ggml_type_of(DType dtype, const std::string& name) {
  switch (dtype) {
    case DType::kF32: return GgmlType::kF32;
    case DType::kF16: return GgmlType::kF16;
    case DType::kBF16: return GgmlType::kBF16;
    default: fail(ErrorKind::kUnsupported, "tensor '{}' has dtype {}, not a weight type", name, dtype_name(dtype));
  }
}

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) fail(ErrorKind::kNotFound, "cannot open '{}'", path.string());
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kCorrupt, "'{}' is not valid JSON: {}", path.string(), e.what());
  }
}

}  // namespace

void StoredTensor::read_rows(int64_t first, int64_t count, float* dst) const {
  for (int64_t r = 0; r < count; ++r)
    dequantize_row(type, data + size_t(first + r) * row_bytes, dst + r * cols, cols);
}

Checkpoint::~Checkpoint() = default;
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;

Checkpoint Checkpoint::open(const std::string& path) {
  Checkpoint c;
  c.path_ = path;
  if (!fs::exists(path)) fail(ErrorKind::kNotFound, "model '{}' does not exist", path);

  if (fs::is_regular_file(path) && path.ends_with(".gguf")) {
    c.gguf_ = std::make_unique<GgufFile>(GgufFile::open(path));
    c.config_ = ModelConfig::from_gguf(*c.gguf_);
    // llama.cpp's converter interleaves q/k rows for Llama-style models; Qwen2 keeps HF order.
    c.qk_rows_interleaved_ = c.config_.architecture == "llama" || c.config_.architecture == "mistral";
    for (const GgufTensorInfo& t : c.gguf_->tensors()) {
      if (t.name == "rope_freqs.weight") {
        c.rope_freq_divisors_.resize(size_t(t.numel()));
        dequantize_row(t.type, t.data, c.rope_freq_divisors_.data(), t.numel());
        continue;
      }
      std::string hf = hf_name_from_gguf(t.name);
      if (hf.empty()) continue;
      if (t.dims.empty() || t.dims.size() > 2)
        fail(ErrorKind::kCorrupt, "'{}': tensor '{}' has {} dimensions, expected 1 or 2", path, t.name, t.dims.size());
      StoredTensor s{.name = std::move(hf),
                     .rows = t.dims.size() == 2 ? t.dims[1] : 1,
                     .cols = t.dims[0],
                     .type = t.type,
                     .data = t.data};
      s.row_bytes = row_bytes_of(t.type, s.cols, t.name);
      c.tensors_.push_back(std::move(s));
    }
  } else {
    // Hugging Face: a folder (config.json + weights) or a .safetensors file inside one.
    const fs::path dir = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
    c.config_ = ModelConfig::from_hf_json(read_json(dir / "config.json"), (dir / "config.json").string());
    c.safetensors_ = std::make_unique<SafetensorsModel>(SafetensorsModel::open(path));
    for (const SafetensorsTensor* tensor : c.safetensors_->tensors()) {
      const SafetensorsTensor& t = *tensor;
      if (t.shape.empty() || t.shape.size() > 2) continue;  // scalars and conv weights: not ours
      StoredTensor s{.name = t.name,
                     .rows = t.shape.size() == 2 ? t.shape[0] : 1,
                     .cols = t.shape.back(),
                     .type = ggml_type_of(t.dtype, t.name),
                     .data = t.data};
      s.row_bytes = row_bytes_of(s.type, s.cols, t.name);
      c.tensors_.push_back(std::move(s));
    }
  }
  std::sort(c.tensors_.begin(), c.tensors_.end(),
            [](const StoredTensor& a, const StoredTensor& b) { return a.name < b.name; });
  return c;
}

const StoredTensor* Checkpoint::find(const std::string& hf_name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), hf_name,
                             [](const StoredTensor& t, const std::string& n) { return t.name < n; });
  return it != tensors_.end() && it->name == hf_name ? &*it : nullptr;
}

const StoredTensor& Checkpoint::get(const std::string& hf_name) const {
  const StoredTensor* t = find(hf_name);
  if (!t) fail(ErrorKind::kNotFound, "'{}': missing tensor '{}'", path_, hf_name);
  return *t;
}

}  // namespace pagoda

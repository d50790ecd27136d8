#include "pagoda/model/weights.h"

#include <cstring>
#include <optional>
#include <string>

#include "pagoda/core/error.h"
#include "pagoda/core/half.h"
#include "pagoda/core/progress.h"
#include "pagoda/model/rope.h"

namespace pagoda {
namespace {

// One source tensor's rows placed in a fused destination, optionally with the rows reordered.
struct Part {
  const StoredTensor* source;
  bool undo_qk_interleave = false;  // llama.cpp q/k row order -> rotate-half order
  int head_dim = 0;
};

// Source row feeding destination row `row` of a q/k projection. llama.cpp stores, per head, the
// rotate-half pair (i, i + d/2) as adjacent rows (2i, 2i + 1); undo that.
int64_t source_row(const Part& part, int64_t row) {
  if (!part.undo_qk_interleave) return row;
  const int64_t d = part.head_dim, head = row / d, within = row % d;
  const int64_t half = within / (d / 2), i = within % (d / 2);
  return head * d + 2 * i + half;
}

void convert_row(const float* src, int64_t n, DType dtype, void* dst) {
  switch (dtype) {
    case DType::kF32: std::memcpy(dst, src, size_t(n) * 4); break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_f16(src[i]);
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_bf16(src[i]);
      break;
    default: fail(ErrorKind::kInternal, "weight storage dtype {}", dtype_name(dtype));
  }
}

std::optional<DType> quantized_dtype(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return DType::kQ4_0;
    case GgmlType::kQ4_1: return DType::kQ4_1;
    case GgmlType::kQ5_0: return DType::kQ5_0;
    case GgmlType::kQ5_1: return DType::kQ5_1;
    case GgmlType::kQ8_0: return DType::kQ8_0;
    case GgmlType::kQ4_K: return DType::kQ4_K;
    case GgmlType::kQ5_K: return DType::kQ5_K;
    case GgmlType::kQ6_K: return DType::kQ6_K;
    default: return std::nullopt;
  }
}

class Loader {
 public:
  Loader(const Checkpoint& checkpoint, Backend& backend, const LoadOptions& options, ModelWeights& out)
      : checkpoint_(checkpoint), backend_(backend), options_(options), out_(out) {}

  // Concatenates the parts' rows into one [rows, cols] tensor of `dtype` in backend memory.
  Tensor fused(const std::vector<Part>& parts, DType dtype, ProgressBar* progress) {
    const int64_t cols = parts[0].source->cols;
    int64_t rows = 0;
    for (const Part& p : parts) {
      if (p.source->cols != cols)
        fail(ErrorKind::kCorrupt, "'{}': tensor '{}' has {} columns, expected {}", checkpoint_.path(),
             p.source->name, p.source->cols, cols);
      rows += p.source->rows;
    }
    const size_t row_bytes = dtype_bytes(dtype, cols);
    std::vector<uint8_t> host(size_t(rows) * row_bytes);
    int64_t dst_row = 0;
    for (const Part& p : parts) {
      const int64_t n = p.source->rows;
      if (is_block_quantized(dtype)) {  // the file's blocks, rows in place
        for (int64_t r = 0; r < n; ++r)
          std::memcpy(host.data() + size_t(dst_row + r) * row_bytes,
                      p.source->data + size_t(source_row(p, r)) * p.source->row_bytes, row_bytes);
        dst_row += n;
        if (progress) progress->advance(int64_t(n) * cols);
        continue;
      }
#pragma omp parallel
      {
        std::vector<float> row(static_cast<size_t>(cols));
#pragma omp for schedule(static)
        for (int64_t r = 0; r < n; ++r) {
          p.source->read_rows(source_row(p, r), 1, row.data());
          convert_row(row.data(), cols, dtype, host.data() + size_t(dst_row + r) * row_bytes);
        }
      }
      dst_row += n;
      if (progress) progress->advance(int64_t(n) * cols);
    }
    auto buffer = backend_.allocate(host.size());
    backend_.upload(buffer->data(), host.data(), host.size());
    out_.buffers.push_back(buffer);
    return Tensor::contiguous(buffer->data(), dtype, {rows, cols}, backend_.device());
  }

  Tensor vector(const std::string& name, int64_t expected, ProgressBar* progress) {
    const StoredTensor& t = checkpoint_.get(name);
    if (t.rows * t.cols != expected)
      fail(ErrorKind::kCorrupt, "'{}': tensor '{}' has {} elements, expected {}", checkpoint_.path(),
           name, t.rows * t.cols, expected);
    Tensor v = fused({Part{&t}}, vector_dtype(), progress);
    v.ndim = 1;
    v.shape = {expected};
    v.strides = {1};
    return v;
  }

  // Storage type of a matmul weight made of `parts`: their block-quantized type when they share
  // one the backend multiplies and options ask to keep it, else matmul_dtype of the first.
  DType storage_dtype(const std::vector<Part>& parts) const {
    const GgmlType type = parts[0].source->type;
    for (const Part& p : parts)
      if (p.source->type != type) return matmul_dtype(type);
    if (options_.keep_quantized)
      if (const std::optional<DType> q = quantized_dtype(type); q && backend_.takes_quantized_weights(*q)) return *q;
    return matmul_dtype(type);
  }

  // Storage type of a matmul weight stored as `type`. A backend with f16 or bf16 activations
  // multiplies weights of that same type only.
  DType matmul_dtype(GgmlType type) const {
    if (backend_.activation_dtype() != DType::kF32) return backend_.activation_dtype();
    if (type == GgmlType::kBF16 && options_.weight_dtype != DType::kF32) return DType::kBF16;
    return options_.weight_dtype;
  }
  // Norm weights and biases: the activations' type, as Hugging Face keeps them in the model's.
  DType vector_dtype() const { return backend_.activation_dtype(); }

  void check_shape(const StoredTensor& t, int64_t rows, int64_t cols) const {
    if (t.rows != rows || t.cols != cols)
      fail(ErrorKind::kCorrupt, "'{}': tensor '{}' is [{}, {}], expected [{}, {}]", checkpoint_.path(),
           t.name, t.rows, t.cols, rows, cols);
  }

 private:
  const Checkpoint& checkpoint_;
  Backend& backend_;
  const LoadOptions& options_;
  ModelWeights& out_;
};

}  // namespace

ModelWeights load_weights(const Checkpoint& checkpoint, Backend& backend, const LoadOptions& options) {
  if (options.weight_dtype != DType::kF32 && options.weight_dtype != DType::kF16 &&
      options.weight_dtype != DType::kBF16)
    fail(ErrorKind::kInvalidArgument, "weight dtype must be f32, f16 or bf16");
  const ModelConfig& c = checkpoint.config();
  if (c.head_dim > 1024) fail(ErrorKind::kUnsupported, "head_dim {} > 1024", c.head_dim);
  ModelWeights w;
  Loader loader(checkpoint, backend, options, w);

  int64_t total = 0;
  for (const char* name : {"model.embed_tokens.weight", "lm_head.weight"})
    if (const StoredTensor* t = checkpoint.find(name)) total += t->rows * t->cols;
  total += int64_t(c.num_layers) *
           (int64_t(c.hidden_size) * (2 * c.q_dim() + 2 * c.kv_dim() + 3 * c.intermediate_size) + 2 * c.hidden_size);
  ProgressBar progress_bar("loading " + checkpoint.path(), total);
  ProgressBar* progress = options.show_progress ? &progress_bar : nullptr;

  const StoredTensor& embed = checkpoint.get("model.embed_tokens.weight");
  loader.check_shape(embed, c.vocab_size, c.hidden_size);
  w.embedding = loader.fused({Part{&embed}}, loader.storage_dtype({Part{&embed}}), progress);

  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto get = [&](const char* suffix) -> const StoredTensor& { return checkpoint.get(p + suffix); };
    LayerWeights layer;
    layer.attn_norm = loader.vector(p + "input_layernorm.weight", c.hidden_size, progress);
    const StoredTensor& q = get("self_attn.q_proj.weight");
    const StoredTensor& k = get("self_attn.k_proj.weight");
    const StoredTensor& v = get("self_attn.v_proj.weight");
    loader.check_shape(q, c.q_dim(), c.hidden_size);
    loader.check_shape(k, c.kv_dim(), c.hidden_size);
    loader.check_shape(v, c.kv_dim(), c.hidden_size);
    const bool interleaved = checkpoint.qk_rows_interleaved();
    const std::vector<Part> qkv = {Part{&q, interleaved, c.head_dim}, Part{&k, interleaved, c.head_dim}, Part{&v}};
    layer.qkv = loader.fused(qkv, loader.storage_dtype(qkv), progress);
    if (c.qkv_bias) {
      const StoredTensor& qb = get("self_attn.q_proj.bias");
      const StoredTensor& kb = get("self_attn.k_proj.bias");
      const StoredTensor& vb = get("self_attn.v_proj.bias");
      // Biases are 1-D ([1, n]): the same row reordering applies to their columns, so read them
      // as columns of a one-row tensor and reorder there.
      std::vector<float> bias(size_t(c.q_dim() + 2 * c.kv_dim()));
      std::vector<float> tmp;
      size_t at = 0;
      for (const StoredTensor* b : {&qb, &kb, &vb}) {
        const int64_t expected = b == &qb ? c.q_dim() : c.kv_dim();
        if (b->rows != 1 || b->cols != expected)
          fail(ErrorKind::kCorrupt, "'{}': bias '{}' has {} x {} elements, expected {}", checkpoint.path(), b->name,
               b->rows, b->cols, expected);
        tmp.resize(size_t(b->cols));
        b->read_rows(0, 1, tmp.data());
        const bool reorder = interleaved && b != &vb;
        for (int64_t i = 0; i < b->cols; ++i) bias[at + size_t(i)] = tmp[size_t(source_row(Part{b, reorder, c.head_dim}, i))];
        at += size_t(b->cols);
      }
      const DType bias_dtype = loader.vector_dtype();
      std::vector<uint8_t> stored(bias.size() * dtype_size(bias_dtype));
      convert_row(bias.data(), int64_t(bias.size()), bias_dtype, stored.data());
      auto buffer = backend.allocate(stored.size());
      backend.upload(buffer->data(), stored.data(), stored.size());
      w.buffers.push_back(buffer);
      layer.qkv_bias = Tensor::contiguous(buffer->data(), bias_dtype, {int64_t(bias.size())}, backend.device());
    }
    const StoredTensor& o = get("self_attn.o_proj.weight");
    loader.check_shape(o, c.hidden_size, c.q_dim());
    layer.o = loader.fused({Part{&o}}, loader.storage_dtype({Part{&o}}), progress);
    layer.ffn_norm = loader.vector(p + "post_attention_layernorm.weight", c.hidden_size, progress);
    const StoredTensor& gate = get("mlp.gate_proj.weight");
    const StoredTensor& up = get("mlp.up_proj.weight");
    const StoredTensor& down = get("mlp.down_proj.weight");
    loader.check_shape(gate, c.intermediate_size, c.hidden_size);
    loader.check_shape(up, c.intermediate_size, c.hidden_size);
    loader.check_shape(down, c.hidden_size, c.intermediate_size);
    layer.gate_up = loader.fused({Part{&gate}, Part{&up}}, loader.storage_dtype({Part{&gate}, Part{&up}}), progress);
    layer.down = loader.fused({Part{&down}}, loader.storage_dtype({Part{&down}}), progress);
    w.layers.push_back(layer);
  }
  w.final_norm = loader.vector("model.norm.weight", c.hidden_size, progress);
  if (c.tie_word_embeddings) {
    w.lm_head = w.embedding;
  } else {
    const StoredTensor& head = checkpoint.get("lm_head.weight");
    loader.check_shape(head, c.vocab_size, c.hidden_size);
    w.lm_head = loader.fused({Part{&head}}, loader.storage_dtype({Part{&head}}), progress);
  }
  w.rope_inv_freq = rope_inv_freq(c, checkpoint.rope_freq_divisors());
  if (progress) progress->finish();
  return w;
}

}  // namespace pagoda

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

// One source tensor's rows [row_begin, row_begin + rows) placed in a fused destination,
// optionally with the rows reordered (a tensor-parallel rank reads only its rows).
struct Part {
  const StoredTensor* source;
  bool undo_qk_interleave = false;  // llama.cpp q/k row order -> rotate-half order
  int head_dim = 0;
  int64_t row_begin = 0;
  int64_t rows = -1;  // -1: to the end
  int64_t num_rows() const { return rows < 0 ? source->rows - row_begin : rows; }
};

// Columns [begin, begin + count) of every row (count -1: all): a row-parallel rank's share.
struct Columns {
  int64_t begin = 0;
  int64_t count = -1;
};

// Source row feeding row `row` of a part (of a q/k projection: llama.cpp stores, per head, the
// rotate-half pair (i, i + d/2) as adjacent rows (2i, 2i + 1); undo that).
int64_t source_row(const Part& part, int64_t row) {
  row += part.row_begin;
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

  // Concatenates the parts' rows (their `columns`) into one [rows + zero_rows, cols] tensor of
  // `dtype` in backend memory; the zero rows pad a tensor-parallel rank's vocabulary shard.
  Tensor fused(const std::vector<Part>& parts, DType dtype, ProgressBar* progress, Columns columns = {},
               int64_t zero_rows = 0) {
    const int64_t source_cols = parts[0].source->cols;
    const int64_t cols = columns.count < 0 ? source_cols : columns.count;
    int64_t rows = zero_rows;
    for (const Part& p : parts) {
      if (p.source->cols != source_cols)
        fail(ErrorKind::kCorrupt, "'{}': tensor '{}' has {} columns, expected {}", checkpoint_.path(),
             p.source->name, p.source->cols, source_cols);
      rows += p.num_rows();
    }
    const size_t row_bytes = dtype_bytes(dtype, cols);
    std::vector<uint8_t> host(size_t(rows) * row_bytes);  // zero bytes are zeros in every dtype
    int64_t dst_row = 0;
    for (const Part& p : parts) {
      const int64_t n = p.num_rows();
      if (is_block_quantized(dtype)) {  // the file's blocks, rows in place (columns on block bounds)
        const size_t skip = dtype_bytes(dtype, columns.begin);
        for (int64_t r = 0; r < n; ++r)
          std::memcpy(host.data() + size_t(dst_row + r) * row_bytes,
                      p.source->data + size_t(source_row(p, r)) * p.source->row_bytes + skip, row_bytes);
        dst_row += n;
        if (progress) progress->advance(int64_t(n) * cols);
        continue;
      }
#pragma omp parallel
      {
        std::vector<float> row(static_cast<size_t>(source_cols));
#pragma omp for schedule(static)
        for (int64_t r = 0; r < n; ++r) {
          p.source->read_rows(source_row(p, r), 1, row.data());
          convert_row(row.data() + columns.begin, cols, dtype, host.data() + size_t(dst_row + r) * row_bytes);
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

  // Storage type of a matmul weight made of `parts`' `columns`: their block-quantized type when
  // they share one the backend multiplies, options ask to keep it and the columns fall on block
  // boundaries; else matmul_dtype of the first (dequantized).
  DType storage_dtype(const std::vector<Part>& parts, Columns columns = {}) const {
    const GgmlType type = parts[0].source->type;
    for (const Part& p : parts)
      if (p.source->type != type) return matmul_dtype(type);
    const int64_t block = ggml_type_traits(uint32_t(type)).block_size;
    if (columns.count >= 0 && block > 0 && (columns.begin % block != 0 || columns.count % block != 0))
      return matmul_dtype(type);
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

ModelWeights load_weights(const Checkpoint& checkpoint, Backend& backend, const LoadOptions& options,
                          TensorShard shard) {
  if (options.weight_dtype != DType::kF32 && options.weight_dtype != DType::kF16 &&
      options.weight_dtype != DType::kBF16)
    fail(ErrorKind::kInvalidArgument, "weight dtype must be f32, f16 or bf16");
  const ModelConfig& c = checkpoint.config();
  if (c.head_dim > 1024) fail(ErrorKind::kUnsupported, "head_dim {} > 1024", c.head_dim);
  ModelWeights w;
  Loader loader(checkpoint, backend, options, w);
  const bool split = shard.world_size > 1;
  const ShardLayout s = shard_layout(c, shard);
  const int64_t d = c.head_dim;
  // A row-parallel weight's columns: all of them on a single rank.
  auto columns = [&](int64_t begin, int64_t count) { return split ? Columns{begin, count} : Columns{}; };

  int64_t total = 0;
  for (const char* name : {"model.embed_tokens.weight", "lm_head.weight"})
    if (const StoredTensor* t = checkpoint.find(name)) total += t->rows * t->cols;
  total += int64_t(c.num_layers) *
           (int64_t(c.hidden_size) * (2 * c.q_dim() + 2 * c.kv_dim() + 3 * c.intermediate_size) + 2 * c.hidden_size);
  ProgressBar progress_bar("loading " + checkpoint.path(), total / shard.world_size);
  ProgressBar* progress = options.show_progress ? &progress_bar : nullptr;

  const StoredTensor& embed = checkpoint.get("model.embed_tokens.weight");
  loader.check_shape(embed, c.vocab_size, c.hidden_size);
  // A rank's embedding shard ends with a zero row: ids outside its shard are remapped to it, so
  // the sum over ranks of their embeddings is every id's row, exactly.
  const Part embed_part{&embed, false, 0, s.vocab_begin, s.vocab_stored};
  w.embedding = loader.fused({embed_part}, loader.storage_dtype({embed_part}), progress, {},
                             split ? s.vocab_rows - s.vocab_stored + 1 : 0);

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
    const int64_t q_begin = s.q_head_begin * d, q_rows = s.num_q_heads * d;
    const int64_t kv_begin = s.kv_head_begin * d, kv_rows = s.num_kv_heads * d;
    const std::vector<Part> qkv = {Part{&q, interleaved, c.head_dim, q_begin, q_rows},
                                   Part{&k, interleaved, c.head_dim, kv_begin, kv_rows},
                                   Part{&v, false, 0, kv_begin, kv_rows}};
    layer.qkv = loader.fused(qkv, loader.storage_dtype(qkv), progress);
    if (c.qkv_bias) {
      const StoredTensor& qb = get("self_attn.q_proj.bias");
      const StoredTensor& kb = get("self_attn.k_proj.bias");
      const StoredTensor& vb = get("self_attn.v_proj.bias");
      // Biases are 1-D ([1, n]): the same row reordering applies to their columns, so read them
      // as columns of a one-row tensor and reorder there.
      std::vector<float> bias(size_t(q_rows + 2 * kv_rows));
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
        const Part part = b == &qb ? Part{b, reorder, c.head_dim, q_begin, q_rows}
                                   : Part{b, reorder, c.head_dim, kv_begin, kv_rows};
        for (int64_t i = 0; i < part.num_rows(); ++i) bias[at + size_t(i)] = tmp[size_t(source_row(part, i))];
        at += size_t(part.num_rows());
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
    const Columns o_columns = columns(q_begin, q_rows);
    layer.o = loader.fused({Part{&o}}, loader.storage_dtype({Part{&o}}, o_columns), progress, o_columns);
    layer.ffn_norm = loader.vector(p + "post_attention_layernorm.weight", c.hidden_size, progress);
    const StoredTensor& gate = get("mlp.gate_proj.weight");
    const StoredTensor& up = get("mlp.up_proj.weight");
    const StoredTensor& down = get("mlp.down_proj.weight");
    loader.check_shape(gate, c.intermediate_size, c.hidden_size);
    loader.check_shape(up, c.intermediate_size, c.hidden_size);
    loader.check_shape(down, c.hidden_size, c.intermediate_size);
    const std::vector<Part> gate_up = {Part{&gate, false, 0, s.ffn_begin, s.ffn_size},
                                       Part{&up, false, 0, s.ffn_begin, s.ffn_size}};
    layer.gate_up = loader.fused(gate_up, loader.storage_dtype(gate_up), progress);
    const Columns down_columns = columns(s.ffn_begin, s.ffn_size);
    layer.down = loader.fused({Part{&down}}, loader.storage_dtype({Part{&down}}, down_columns), progress, down_columns);
    w.layers.push_back(layer);
  }
  w.final_norm = loader.vector("model.norm.weight", c.hidden_size, progress);
  if (c.tie_word_embeddings) {
    w.lm_head = w.embedding.rows(0, s.vocab_rows);  // without the zero row
  } else {
    const StoredTensor& head = checkpoint.get("lm_head.weight");
    loader.check_shape(head, c.vocab_size, c.hidden_size);
    const Part head_part{&head, false, 0, s.vocab_begin, s.vocab_stored};
    w.lm_head = loader.fused({head_part}, loader.storage_dtype({head_part}), progress, {}, s.vocab_rows - s.vocab_stored);
  }
  w.rope_inv_freq = rope_inv_freq(c, checkpoint.rope_freq_divisors());
  if (progress) progress->finish();
  return w;
}

}  // namespace pagoda

#include "pagoda/model/model.h"

#include <cmath>

#include "pagoda/core/error.h"

namespace pagoda {

Model::Model(const Checkpoint& checkpoint, Backend& backend, const LoadOptions& options)
    : config_(checkpoint.config()), backend_(backend), weights_(load_weights(checkpoint, backend, options)) {}

size_t Model::weight_bytes() const {
  size_t bytes = 0;
  for (const auto& buffer : weights_.buffers) bytes += buffer->size();
  return bytes;
}

size_t Model::allocate_kv_cache(int32_t num_blocks, int32_t block_size, DType dtype) {
  kv_block_size_ = block_size;
  kv_num_blocks_ = num_blocks;
  return backend_.allocate_kv_cache(kv::KvCacheConfig{.num_layers = config_.num_layers,
                                                      .num_blocks = num_blocks,
                                                      .block_size = block_size,
                                                      .num_kv_heads = config_.num_kv_heads,
                                                      .head_dim = config_.head_dim,
                                                      .dtype = dtype,
                                                      .layout = KvLayout::kHnd});
}

void Model::ensure_workspace(int64_t rows, int64_t logit_rows) {
  const ModelConfig& c = config_;
  if (rows > workspace_rows_) {
    auto floats = [&](int64_t n) { return backend_.allocate(size_t(n) * sizeof(float)); };
    x_ = floats(rows * c.hidden_size);
    h_ = floats(rows * c.hidden_size);
    qkv_ = floats(rows * (c.q_dim() + 2 * c.kv_dim()));
    attn_ = floats(rows * c.q_dim());
    gate_up_ = floats(rows * 2 * c.intermediate_size);
    act_ = floats(rows * c.intermediate_size);
    workspace_rows_ = rows;
  }
  if (logit_rows > workspace_logit_rows_) {
    logits_in_ = backend_.allocate(size_t(logit_rows * c.hidden_size) * sizeof(float));
    logits_ = backend_.allocate(size_t(logit_rows) * size_t(c.vocab_size) * sizeof(float));
    workspace_logit_rows_ = logit_rows;
  }
}

AttentionStep Model::plan_step(std::span<const SequenceChunk> chunks) const {
  AttentionStep step;
  step.shape = attention::AttentionShape{.num_q_heads = config_.num_q_heads,
                                         .num_kv_heads = config_.num_kv_heads,
                                         .head_dim = config_.head_dim,
                                         .block_size = kv_block_size_,
                                         .softmax_scale = 1.f / std::sqrt(float(config_.head_dim))};
  int32_t row = 0;
  for (const SequenceChunk& chunk : chunks) {
    const int32_t n = int32_t(chunk.tokens.size());
    const int64_t end = int64_t(chunk.start_pos) + n;
    if (n == 0) fail(ErrorKind::kInvalidArgument, "a sequence chunk has no tokens");
    if (chunk.start_pos < 0 || end > config_.max_context)
      fail(ErrorKind::kInvalidArgument, "positions [{}, {}) exceed the model's context of {} tokens",
           chunk.start_pos, end, config_.max_context);
    if (int64_t(chunk.block_ids.size()) * kv_block_size_ < end)
      fail(ErrorKind::kInternal, "block table of {} blocks cannot hold {} tokens", chunk.block_ids.size(), end);
    for (int32_t id : chunk.block_ids)
      if (id < 0 || id >= kv_num_blocks_) fail(ErrorKind::kInternal, "block id {} outside the KV cache", id);
    const auto seq = int32_t(step.sequences.size());
    step.sequences.push_back({chunk.block_ids, chunk.start_pos, n, row});
    for (int32_t i = 0; i < n; ++i) step.positions.push_back(chunk.start_pos + i);
    if (n == 1) {
      step.decode_rows.push_back(row);
      step.decode_batch.add_sequence(chunk.block_ids, chunk.start_pos + 1);
    } else {
      step.prefill_seqs.push_back(seq);
    }
    row += n;
  }
  if (step.decode_batch.num_seqs() > 0)
    step.decode_plan = attention::plan_decode(step.decode_batch, step.shape, backend_.device_info());
  return step;
}

std::span<const float> Model::forward(std::span<const SequenceChunk> chunks) {
  if (kv_block_size_ == 0) fail(ErrorKind::kInternal, "forward before allocate_kv_cache");
  const ModelConfig& c = config_;
  const AttentionStep step = plan_step(chunks);
  const int64_t rows = int64_t(step.positions.size());
  std::vector<int32_t> tokens;
  tokens.reserve(size_t(rows));
  int64_t logit_rows = 0;
  for (const SequenceChunk& chunk : chunks) {
    tokens.insert(tokens.end(), chunk.tokens.begin(), chunk.tokens.end());
    logit_rows += chunk.want_logits;
  }
  ensure_workspace(rows, logit_rows);

  const Device dev = backend_.device();
  const int64_t qkv_width = c.q_dim() + 2 * c.kv_dim();
  Tensor x = Tensor::contiguous(x_->data(), DType::kF32, {rows, c.hidden_size}, dev);
  Tensor h = Tensor::contiguous(h_->data(), DType::kF32, {rows, c.hidden_size}, dev);
  Tensor qkv = Tensor::contiguous(qkv_->data(), DType::kF32, {rows, qkv_width}, dev);
  Tensor attn = Tensor::contiguous(attn_->data(), DType::kF32, {rows, c.q_dim()}, dev);
  Tensor gate_up = Tensor::contiguous(gate_up_->data(), DType::kF32, {rows, 2 * int64_t(c.intermediate_size)}, dev);
  Tensor act = Tensor::contiguous(act_->data(), DType::kF32, {rows, c.intermediate_size}, dev);

  // Views of q, k and v inside each qkv row: [rows, heads, head_dim] with the row stride of qkv.
  auto heads_view = [&](int64_t column, int64_t heads) {
    Tensor t = qkv;
    t.data = qkv.ptr<float>() + column;
    t.ndim = 3;
    t.shape = {rows, heads, c.head_dim, 0};
    t.strides = {qkv_width, c.head_dim, 1, 0};
    return t;
  };
  Tensor q = heads_view(0, c.num_q_heads);
  Tensor k = heads_view(c.q_dim(), c.num_kv_heads);
  Tensor v = heads_view(c.q_dim() + c.kv_dim(), c.num_kv_heads);
  Tensor attn_heads = Tensor::contiguous(attn.data, DType::kF32, {rows, c.num_q_heads, c.head_dim}, dev);

  backend_.embed(weights_.embedding, tokens, x);
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = weights_.layers[size_t(l)];
    backend_.rms_norm(x, w.attn_norm, c.rms_norm_eps, h);
    backend_.matmul(h, w.qkv, w.qkv_bias.data ? &w.qkv_bias : nullptr, qkv);
    backend_.rope(q, step.positions, weights_.rope_inv_freq);
    backend_.rope(k, step.positions, weights_.rope_inv_freq);
    backend_.attention(l, step, q, k, v, attn_heads);
    backend_.matmul(attn, w.o, nullptr, h);
    backend_.add(x, h);
    backend_.rms_norm(x, w.ffn_norm, c.rms_norm_eps, h);
    backend_.matmul(h, w.gate_up, nullptr, gate_up);
    backend_.silu_mul(gate_up, act);
    backend_.matmul(act, w.down, nullptr, h);
    backend_.add(x, h);
  }

  // Final norm and lm_head only for the rows that sample.
  Tensor logits_in = Tensor::contiguous(logits_in_ ? logits_in_->data() : nullptr, DType::kF32,
                                        {logit_rows, c.hidden_size}, dev);
  int64_t out_row = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (!chunks[i].want_logits) continue;
    const SequenceStep& s = step.sequences[i];
    const int64_t last = s.row_begin + s.num_new - 1;
    backend_.rms_norm(x.rows(last, last + 1), weights_.final_norm, c.rms_norm_eps,
                      logits_in.rows(out_row, out_row + 1));
    ++out_row;
  }
  host_logits_.resize(size_t(logit_rows) * size_t(c.vocab_size));
  if (logit_rows == 0) return {};
  Tensor logits = Tensor::contiguous(logits_->data(), DType::kF32, {logit_rows, c.vocab_size}, dev);
  backend_.matmul(logits_in, weights_.lm_head, nullptr, logits);
  backend_.download(host_logits_.data(), logits.data, host_logits_.size() * sizeof(float));
  return host_logits_;
}

}  // namespace pagoda

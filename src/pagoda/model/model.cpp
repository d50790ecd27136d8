#include "pagoda/model/model.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "pagoda/core/error.h"

namespace pagoda {

namespace {

// kAuto attends prefix-aware where sequences share blocks, which merges a shared prefix's partial
// states in another order than a lone sequence's pass: a last-bit difference. Weights kept
// quantized on the CPU multiply 8-bit activations, re-quantized before every matmul, where such a
// difference can move a rounding boundary and grow, so that a request's tokens would depend on
// which other requests share its steps. There, auto means paged.
LoadOptions::Attention resolve_attention(LoadOptions::Attention requested, const ModelWeights& weights,
                                         const Backend& backend) {
  const bool int8_activations = backend.activation_dtype() == DType::kF32 && !weights.layers.empty() &&
                                is_block_quantized(weights.layers[0].qkv.dtype);
  if (requested == LoadOptions::Attention::kAuto && int8_activations) return LoadOptions::Attention::kPaged;
  return requested;
}

TensorShard shard_of(const parallel::Communicator* communicator) {
  return communicator ? TensorShard{communicator->rank(), communicator->world_size()} : TensorShard{};
}

}  // namespace

Model::Model(const Checkpoint& checkpoint, Backend& backend, const LoadOptions& options,
             parallel::Communicator* communicator)
    : config_(checkpoint.config()),
      communicator_(communicator),
      shard_(shard_layout(config_, shard_of(communicator))),
      local_(shard_config(config_, shard_)),
      backend_(backend),
      weights_(load_weights(checkpoint, backend, options, shard_of(communicator))),
      attention_mode_(resolve_attention(options.attention, weights_, backend)),
      kv_dtype_(options.kv_quant != KvQuant::kNone ? DType::kF16 : options.kv_dtype.value_or(backend.activation_dtype())),
      kv_quant_(options.kv_quant),
      kv_partition_(options.kv_partition),
      kv_hadamard_(options.kv_hadamard),
      kv_key_quant_(options.kv_key_quant),
      kv_sink_tokens_(options.kv_sink_tokens),
      kv_stochastic_rounding_(options.kv_stochastic_rounding) {}

attention::AttentionShape Model::attention_shape() const {
  return {.num_q_heads = local_.num_q_heads,
          .num_kv_heads = local_.num_kv_heads,
          .head_dim = config_.head_dim,
          .block_size = kv_block_size_,
          .softmax_scale = 1.f / std::sqrt(float(config_.head_dim))};
}

size_t Model::weight_bytes() const {
  size_t bytes = 0;
  for (const auto& buffer : weights_.buffers) bytes += buffer->size();
  return bytes;
}

size_t Model::kv_block_bytes(int32_t block_size) const {
  return size_t(config_.num_layers) * size_t(local_.num_kv_heads) *
         size_t(kv_block_head_bytes(kv_quant_, int32_t(dtype_size(kv_dtype_)), config_.head_dim, kv_partition_, block_size,
                                                kv_key_quant_));
}

size_t Model::allocate_kv_cache(int32_t num_blocks, int32_t block_size) {
  kv_block_size_ = block_size;
  kv_num_blocks_ = num_blocks;
  prefix_planner_.reset();
  // A quantized cache's CPU executors attend one sequence at a time: no plan to make.
  if (attention_mode_ != LoadOptions::Attention::kPaged && kv_quant_ == KvQuant::kNone) {
    const auto planning = backend_.prefix_planning(attention_shape());
    if (planning) {
      prefix_planner_.emplace(attention_shape(), planning->device, planning->options);
    } else if (attention_mode_ == LoadOptions::Attention::kPrefix) {
      fail(ErrorKind::kUnsupported, "--attention prefix: the {} backend cannot run prefix-aware attention for {} q "
           "heads, {} kv heads, head_dim {}", backend_.name(), local_.num_q_heads, local_.num_kv_heads,
           config_.head_dim);
    }
  }
  return backend_.allocate_kv_cache(kv::KvCacheConfig{.num_layers = config_.num_layers,
                                                      .num_blocks = num_blocks,
                                                      .block_size = block_size,
                                                      .num_kv_heads = local_.num_kv_heads,
                                                      .head_dim = config_.head_dim,
                                                      .dtype = kv_dtype_,
                                                      .layout = KvLayout::kHnd,
                                                      .quant = kv_quant_,
                                                      .partition = kv_partition_,
                                                      .hadamard = kv_hadamard_,
                                                      .stochastic_rounding = kv_stochastic_rounding_,
                                                      .key_quant = kv_key_quant_,
                                                      .sink_tokens = kv_sink_tokens_});
}

void Model::reserve(int64_t rows, int64_t logit_rows) {
  const ModelConfig& c = local_;
  const size_t act = dtype_size(backend_.activation_dtype());
  auto buffer = [&](int64_t elements, size_t element_bytes) { return backend_.allocate(size_t(elements) * element_bytes); };
  if (rows > workspace_rows_) {
    x_.reset(), h_.reset(), qkv_.reset(), q_.reset(), attn_.reset(), proj_.reset(), gate_up_.reset(), act_.reset();
    x_ = buffer(rows * c.hidden_size, act);
    h_ = buffer(rows * c.hidden_size, act);
    qkv_ = buffer(rows * (c.q_dim() + 2 * c.kv_dim()), act);
    q_ = buffer(rows * c.q_dim(), act);
    attn_ = buffer(rows * c.q_dim(), act);
    proj_ = buffer(rows * c.hidden_size, act);
    gate_up_ = buffer(rows * 2 * c.intermediate_size, act);
    act_ = buffer(rows * c.intermediate_size, act);
    workspace_rows_ = rows;
  }
  if (logit_rows > workspace_logit_rows_) {
    logits_in_.reset(), logits_.reset(), shard_logits_.reset();
    logits_in_ = buffer(logit_rows * c.hidden_size, act);
    if (communicator_) shard_logits_ = buffer(logit_rows * c.vocab_size, sizeof(float));
    logits_ = buffer(logit_rows * logits_width(), sizeof(float));
    workspace_logit_rows_ = logit_rows;
  }
}

// Whether any two sequences share a block. Shared prefixes start at block 0, so comparing the
// first blocks is enough.
static bool shares_blocks(const attention::DecodeBatch& batch) {
  std::vector<int32_t> first;
  for (int32_t s = 0; s < batch.num_seqs(); ++s) {
    if (!batch.blocks_of(s).empty()) first.push_back(batch.blocks_of(s)[0]);
  }
  std::sort(first.begin(), first.end());
  return std::adjacent_find(first.begin(), first.end()) != first.end();
}

StepBatch Model::plan_step(std::span<const SequenceChunk> chunks) {
  StepBatch step;
  step.shape = attention_shape();
  step.rope_inv_freq = weights_.rope_inv_freq;
  for (const SequenceChunk& chunk : chunks) {
    const int64_t end = int64_t(chunk.start_pos) + int64_t(chunk.tokens.size());
    if (chunk.tokens.empty()) fail(ErrorKind::kInvalidArgument, "a sequence chunk has no tokens");
    if (chunk.start_pos < 0 || end > config_.max_context)
      fail(ErrorKind::kInvalidArgument, "positions [{}, {}) exceed the model's context of {} tokens",
           chunk.start_pos, end, config_.max_context);
    if (int64_t(chunk.block_ids.size()) * kv_block_size_ < end)
      fail(ErrorKind::kInternal, "block table of {} blocks cannot hold {} tokens", chunk.block_ids.size(), end);
    for (int32_t id : chunk.block_ids)
      if (id < 0 || id >= kv_num_blocks_) fail(ErrorKind::kInternal, "block id {} outside the KV cache", id);
  }

  // Rows: the decoding chunks first (the decode kernels read their rows as one block), then the
  // prefill chunks, each in the callers' order.
  std::vector<int32_t> last_row(chunks.size());
  auto add_chunk = [&](size_t i) {
    const SequenceChunk& chunk = chunks[i];
    const auto n = int32_t(chunk.tokens.size());
    const auto row = int32_t(step.tokens.size());
    const auto seq = int32_t(step.sequences.size());
    step.sequences.push_back({chunk.block_ids, chunk.start_pos, n, row});
    for (int32_t t = 0; t < n; ++t) {
      const int32_t pos = chunk.start_pos + t;
      step.tokens.push_back(chunk.tokens[size_t(t)]);
      step.positions.push_back(pos);
      step.slot_blocks.push_back(chunk.block_ids[size_t(pos / kv_block_size_)]);
    }
    if (n == 1) {
      step.decode_batch.add_sequence(chunk.block_ids, chunk.start_pos + 1);
    } else {
      step.prefill_seqs.push_back(seq);
    }
    last_row[i] = row + n - 1;
  };
  for (size_t i = 0; i < chunks.size(); ++i)
    if (chunks[i].tokens.size() == 1) add_chunk(i);
  for (size_t i = 0; i < chunks.size(); ++i)
    if (chunks[i].tokens.size() != 1) add_chunk(i);
  if (communicator_) {  // ids outside this rank's vocabulary read its zero row (weights.h)
    for (int32_t& token : step.tokens) {
      const int32_t id = token - shard_.vocab_begin;
      token = id >= 0 && id < shard_.vocab_stored ? id : shard_.vocab_rows;
    }
  }
  bool all_want_logits = true;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].want_logits) step.logit_rows.push_back(last_row[i]);
    all_want_logits = all_want_logits && chunks[i].want_logits;
  }

  const int32_t num_decode = step.decode_batch.num_seqs();
  if (num_decode == 0) return step;
  // A decode-only step the backend replays as a graph is padded to the graph's size with rows
  // that store nothing.
  const int32_t graph_rows = step.prefill_seqs.empty() && all_want_logits ? backend_.graph_rows(num_decode) : 0;
  auto pad_rows = [&] {
    step.graph_rows = graph_rows;
    for (int32_t r = num_decode; r < graph_rows; ++r) {
      step.tokens.push_back(0);
      step.positions.push_back(0);
      step.slot_blocks.push_back(-1);
      step.logit_rows.push_back(r);
    }
  };
  // auto: prefix-aware where the batch shares blocks: there it reads the shared KV once, and where
  // nothing is shared its planning only costs host time (docs/experiments/engine.md).
  if (prefix_planner_ &&
      (attention_mode_ == LoadOptions::Attention::kPrefix || shares_blocks(step.decode_batch))) {
    step.prefix_plan = &prefix_planner_->plan(step.decode_batch);  // of the real rows, not the padding
    ++prefix_steps_;
    if (graph_rows >= num_decode) pad_rows();
    return step;
  }
  const attention::DeviceInfo device = backend_.device_info();
  if (graph_rows >= num_decode) {
    // Here the padding rows are sequences of no KV, as long as the padded plan needs no split (a
    // graph fixes the number of the paged kernel's work items and has no merge).
    attention::DecodeBatch padded = step.decode_batch;
    for (int32_t r = num_decode; r < graph_rows; ++r) padded.add_sequence({}, 0);
    attention::DecodePlan plan = attention::plan_decode(padded, step.shape, device);
    if (plan.merges.empty()) {
      step.decode_batch = std::move(padded);
      step.decode_plan = std::move(plan);
      pad_rows();
      return step;
    }
  }
  step.decode_plan = attention::plan_decode(step.decode_batch, step.shape, device);
  return step;
}

void Model::forward_layers(const StepBatch& step, const std::function<void(int32_t layer)>& after_layer_kv) {
  const ModelConfig& c = local_;
  const int64_t rows = step.num_rows();
  const auto logit_rows = int64_t(step.logit_rows.size());
  const Device dev = backend_.device();
  const DType act = backend_.activation_dtype();
  auto view = [&](const std::shared_ptr<Backend::Buffer>& b, std::initializer_list<int64_t> shape) {
    return Tensor::contiguous(b->data(), act, shape, dev);
  };
  Tensor x = view(x_, {rows, c.hidden_size});
  Tensor h = view(h_, {rows, c.hidden_size});
  Tensor qkv = view(qkv_, {rows, c.q_dim() + 2 * c.kv_dim()});
  Tensor q = view(q_, {rows, c.num_q_heads, c.head_dim});
  Tensor attn_heads = view(attn_, {rows, c.num_q_heads, c.head_dim});
  Tensor attn = view(attn_, {rows, c.q_dim()});
  Tensor proj = view(proj_, {rows, c.hidden_size});
  Tensor gate_up = view(gate_up_, {rows, 2 * int64_t(c.intermediate_size)});
  Tensor act_out = view(act_, {rows, c.intermediate_size});

  backend_.embed(weights_.embedding, step, x);
  if (communicator_) communicator_->all_reduce_sum(x);
  backend_.rms_norm(x, weights_.layers[0].attn_norm, c.rms_norm_eps, h);
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = weights_.layers[size_t(l)];
    backend_.matmul(h, w.qkv, w.qkv_bias.data ? &w.qkv_bias : nullptr, qkv);
    backend_.rope_append_kv(l, step, qkv, q);
    if (after_layer_kv) after_layer_kv(l);
    backend_.attention(l, step, q, attn_heads);
    backend_.matmul(attn, w.o, nullptr, proj);
    if (communicator_) communicator_->all_reduce_sum(proj);
    backend_.add_rms_norm(x, proj, w.ffn_norm, c.rms_norm_eps, h);
    backend_.matmul(h, w.gate_up, nullptr, gate_up);
    backend_.silu_mul(gate_up, act_out);
    backend_.matmul(act_out, w.down, nullptr, proj);
    if (communicator_) communicator_->all_reduce_sum(proj);
    if (l + 1 < c.num_layers) {
      backend_.add_rms_norm(x, proj, weights_.layers[size_t(l) + 1].attn_norm, c.rms_norm_eps, h);
    } else {
      backend_.add(x, proj);
    }
  }
  if (logit_rows == 0) return;
  // Final norm and lm_head only for the rows that sample.
  Tensor logits_in = view(logits_in_, {logit_rows, c.hidden_size});
  backend_.rms_norm_logit_rows(x, step, weights_.final_norm, c.rms_norm_eps, logits_in);
  Tensor logits = Tensor::contiguous(logits_->data(), DType::kF32, {logit_rows, logits_width()}, dev);
  if (!communicator_) {
    backend_.matmul(logits_in, weights_.lm_head, nullptr, logits);
    return;
  }
  Tensor shard_logits = Tensor::contiguous(shard_logits_->data(), DType::kF32, {logit_rows, c.vocab_size}, dev);
  backend_.matmul(logits_in, weights_.lm_head, nullptr, shard_logits);
  communicator_->all_gather(shard_logits, logits);
}

void Model::run(std::span<const SequenceChunk> chunks, const std::function<void(int32_t layer)>& after_layer_kv) {
  if (kv_block_size_ == 0) fail(ErrorKind::kInternal, "forward before allocate_kv_cache");
  const auto planning_start = std::chrono::steady_clock::now();
  step_ = plan_step(chunks);
  logit_rows_ = 0;
  for (const SequenceChunk& chunk : chunks) logit_rows_ += chunk.want_logits;
  reserve(step_.num_rows(), int64_t(step_.logit_rows.size()));
  backend_.begin_step(step_);
  step_planning_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - planning_start).count();
  if (step_.graph_rows > 0) {
    backend_.run_graph([this] { forward_layers(step_, {}); });  // a capture would not call back on replay
    if (after_layer_kv)
      for (int32_t l = 0; l < config_.num_layers; ++l) after_layer_kv(l);
  } else {
    forward_layers(step_, after_layer_kv);
  }
}

std::span<const float> Model::download_logits() {
  const auto vocab = size_t(config_.vocab_size), width = size_t(logits_width());
  host_logits_.resize(size_t(logit_rows_) * vocab);
  if (logit_rows_ > 0 && width == vocab)
    backend_.download(host_logits_.data(), logits_->data(), host_logits_.size() * sizeof(float));
  for (size_t r = 0; width != vocab && r < size_t(logit_rows_); ++r)  // without a padded shard's ids
    backend_.download(host_logits_.data() + r * vocab, static_cast<const float*>(logits_->data()) + r * width,
                      vocab * sizeof(float));
  return host_logits_;
}

std::vector<int32_t> Model::sample(std::span<const SamplingRow> rows, int32_t valid_vocab) {
  if (int64_t(rows.size()) != logit_rows_)
    fail(ErrorKind::kInternal, "sample: {} sampling rows for {} logit rows", rows.size(), logit_rows_);
  std::vector<int32_t> tokens(rows.size());
  if (rows.empty()) return tokens;
  const Tensor logits = Tensor::contiguous(logits_->data(), DType::kF32,
                                           {int64_t(step_.logit_rows.size()), logits_width()}, backend_.device());
  backend_.sample(logits, std::clamp(valid_vocab, 1, config_.vocab_size), rows, tokens);
  return tokens;
}

void Model::top_logprobs(std::span<const int32_t> rows, int32_t k, int32_t valid_vocab, std::vector<int32_t>& tokens,
                         std::vector<float>& logprobs) {
  tokens.resize(rows.size() * size_t(k));
  logprobs.resize(tokens.size());
  if (rows.empty()) return;
  const Tensor logits = Tensor::contiguous(logits_->data(), DType::kF32,
                                           {int64_t(step_.logit_rows.size()), logits_width()}, backend_.device());
  backend_.top_logprobs(logits, std::clamp(valid_vocab, 1, config_.vocab_size), rows, k, tokens, logprobs);
}

}  // namespace pagoda

// Backend: the operations the model's forward pass needs. The Llama-family forward (model/) is
// written once against this interface; backend/cpu and backend/cuda implement it, and tests
// compare them on the same inputs.
//
// Conventions: tensors are row-major views; "rows" are tokens. Activations are f32 on the CPU
// backend. Weights may be f32, f16 or bf16 ([out_features, in_features], as in PyTorch): the
// matmul widens them on the fly, so they stay small in memory.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pagoda/core/tensor.h"
#include "pagoda/attention/plan.h"
#include "pagoda/kv/kv_cache.h"

namespace pagoda {

// One sequence's share of a forward step: num_new tokens at positions [start_pos, start_pos +
// num_new), stored in rows [row_begin, row_begin + num_new) of the step's activations. Its K/V
// for those positions are written into the blocks of its block table, then it attends to all
// start_pos + num_new tokens.
struct SequenceStep {
  std::span<const int32_t> block_ids;  // the sequence's block table (capacity for all tokens)
  int32_t start_pos = 0;
  int32_t num_new = 0;
  int32_t row_begin = 0;
};

// What attention needs for a whole step, prepared once on the host and shared by every layer:
// the sequences; the decode plan for those with a single new token; the rest are prefill chunks.
struct AttentionStep {
  std::vector<SequenceStep> sequences;
  std::vector<int32_t> positions;      // [num_rows] position of each row's token
  std::vector<int32_t> decode_rows;    // [decode_batch.num_seqs()] the row of each decode sequence
  std::vector<int32_t> prefill_seqs;   // indices into sequences of the multi-token chunks
  attention::AttentionShape shape;
  attention::DecodeBatch decode_batch;
  attention::DecodePlan decode_plan;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Device device() const = 0;

  // Owning device memory. A Buffer frees itself through its backend.
  class Buffer;
  virtual std::shared_ptr<Buffer> allocate(size_t bytes) = 0;
  virtual void upload(void* device_dst, const void* host_src, size_t bytes) = 0;
  virtual void download(void* host_dst, const void* device_src, size_t bytes) = 0;

  // out[i, :] = table[ids[i], :]                      table [vocab, hidden], out [n, hidden]
  virtual void embed(const Tensor& table, std::span<const int32_t> ids, Tensor out) = 0;
  // out = x / sqrt(mean(x^2) + eps) * weight           x, out [n, hidden]; weight [hidden]
  virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor out) = 0;
  // out = x @ w^T (+ bias)                             x [n, k], w [m, k], bias [m], out [n, m]
  virtual void matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor out) = 0;
  // Rotary embedding in place, rotate-half (GPT-NeoX / Hugging Face) pairing (i, i + d/2).
  // x [n, heads, head_dim]; positions [n]; inv_freq [head_dim / 2].
  virtual void rope(Tensor x, std::span<const int32_t> positions, std::span<const float> inv_freq) = 0;
  // out = silu(gate) * up, where gate_up [n, 2 * width] holds gate then up in each row.
  virtual void silu_mul(const Tensor& gate_up, Tensor out) = 0;
  // x += y                                             x, y [n, hidden]
  virtual void add(Tensor x, const Tensor& y) = 0;

  // The paged KV cache lives in backend memory, one per backend; blocks are addressed by the ids
  // of a kv::BlockPool of config.num_blocks. Returns the bytes allocated.
  virtual size_t allocate_kv_cache(const kv::KvCacheConfig& config) = 0;
  // Copies KV block src to dst in every layer (copy on write of a shared partial block).
  virtual void copy_kv_block(int32_t src, int32_t dst) = 0;
  // Writes k, v ([num_rows, kv_heads, head_dim], strided rows) of the step's rows into the cache
  // at `layer`, then computes attention for every row: out [num_rows, q_heads, head_dim].
  virtual void attention(int layer, const AttentionStep& step, const Tensor& q, const Tensor& k,
                         const Tensor& v, Tensor out) = 0;

  // What the decode planner needs to know (parallel workers available to split KV across).
  virtual attention::DeviceInfo device_info() const = 0;
};

class Backend::Buffer {
 public:
  virtual ~Buffer() = default;
  void* data() const { return data_; }
  size_t size() const { return size_; }

 protected:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace pagoda

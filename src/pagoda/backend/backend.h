// Backend: the operations the model's forward pass needs. The Llama-family forward (model/) is
// written once against this interface; backend/cpu and backend/cuda implement it, and tests
// compare them on the same inputs.
//
// Conventions: tensors are row-major views; "rows" are tokens. Activations are of
// activation_dtype(): f32 on the CPU backend, the weights' f16 or bf16 on the GPU. Weights may be
// f32, f16 or bf16 ([out_features, in_features], as in PyTorch). Logits are always f32.
//
// A step's metadata (token ids, positions, block tables, the decode plan) lives in a StepBatch
// that the model builds on the host. begin_step() hands it to the backend once, before the first
// op of the step (a GPU backend uploads it there), and every op that needs it takes the same
// StepBatch, so no op moves host data by itself: that is what lets a GPU backend capture a whole
// decode step in a CUDA graph.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/core/tensor.h"
#include "pagoda/attention/plan.h"
#include "pagoda/attention/prefix_plan.h"
#include "pagoda/backend/top_logprobs.h"
#include "pagoda/kv/kv_cache_config.h"

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

// Everything a step needs besides activations and weights, built once on the host and shared by
// every layer. Sequences that decode (one new token) come first, so their rows are [0,
// decode_batch.num_seqs()): the decode kernels read them as one contiguous block.
struct StepBatch {
  std::vector<SequenceStep> sequences;
  std::vector<int32_t> tokens;       // [num_rows] the token of each row
  std::vector<int32_t> positions;    // [num_rows] its position in its sequence
  std::vector<int32_t> slot_blocks;  // [num_rows] the KV block its K/V go to; -1: a padding row
  std::vector<int32_t> logit_rows;   // rows whose logits the step computes, in output order
  std::vector<int32_t> prefill_seqs;  // indices into sequences of the multi-token chunks
  std::span<const float> rope_inv_freq;  // [head_dim / 2]
  attention::AttentionShape shape;
  attention::DecodeBatch decode_batch;  // the decode sequences, rows [0, num_seqs())
  attention::DecodePlan decode_plan;    // how they attend, unless prefix_plan is set
  // Non-null: they attend by this prefix-aware plan instead, the model's PrefixPlanner's, valid
  // until the model plans its next step.
  const attention::PrefixPlan* prefix_plan = nullptr;
  // > 0: a decode-only step padded to this many rows (padding rows store no K/V, and their
  // attention output and logits go unused) so that a backend can replay one CUDA graph per padded
  // size and attention kind.
  int32_t graph_rows = 0;

  int64_t num_rows() const { return int64_t(tokens.size()); }
};

// How the backend samples one row of logits (the engine's SamplingParams without the penalties
// and logprobs, which only the host sampler does). See backend/cuda/sampling.h.
struct SamplingRow {
  float temperature = 0.f;  // below kGreedyBelowTemperature: greedy
  int32_t top_k = 0;
  float top_p = 1.f;
  float min_p = 0.f;
  uint64_t seed = 0;
  uint64_t offset = 0;  // tokens the request sampled before this one
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Device device() const = 0;
  // The dtype of activations (and of the KV cache): the model allocates its workspace in it.
  virtual DType activation_dtype() const = 0;
  // Called once on a thread that will issue this backend's ops (a tensor-parallel rank's thread):
  // the CPU backend gives it its share of the cores there, a GPU backend would select its device.
  virtual void bind_to_this_thread() {}
  // Whether matmul() and embed() take weights stored in the GGUF block-quantized type t (the
  // loader keeps such weights in their blocks when asked, LoadOptions::keep_quantized).
  virtual bool takes_quantized_weights(DType /*t*/) const { return false; }

  // Owning device memory. A Buffer frees itself through its backend.
  class Buffer;
  virtual std::shared_ptr<Buffer> allocate(size_t bytes) = 0;
  virtual void upload(void* device_dst, const void* host_src, size_t bytes) = 0;
  virtual void download(void* host_dst, const void* device_src, size_t bytes) = 0;

  // The step's metadata, before its first op. The StepBatch stays valid while the step's ops are
  // issued, but the block tables it spans change right after: what a backend reads later (a GPU
  // running the step asynchronously) it copies here.
  virtual void begin_step(const StepBatch& step) = 0;

  // out[i, :] = table[step.tokens[i], :]              table [vocab, hidden], out [rows, hidden]
  virtual void embed(const Tensor& table, const StepBatch& step, Tensor out) = 0;
  // out = x / sqrt(mean(x^2) + eps) * weight           x, out [n, hidden]; weight [hidden]
  virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor out) = 0;
  // Row j of out = rms_norm of row step.logit_rows[j] of x: the final norm, only where logits are
  // wanted.                                            out [logit_rows, hidden]
  virtual void rms_norm_logit_rows(const Tensor& x, const StepBatch& step, const Tensor& weight, float eps,
                                   Tensor out) = 0;
  // x += y, then out = rms_norm(x) (x rounded to its dtype first, as the two ops apart would).
  virtual void add_rms_norm(Tensor x, const Tensor& y, const Tensor& weight, float eps, Tensor out) = 0;
  // out = x @ w^T (+ bias)                             x [n, k], w [m, k], bias [m], out [n, m]
  virtual void matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor out) = 0;
  // out = silu(gate) * up, where gate_up [n, 2 * width] holds gate then up in each row.
  virtual void silu_mul(const Tensor& gate_up, Tensor out) = 0;
  // x += y                                             x, y [n, hidden]
  virtual void add(Tensor x, const Tensor& y) = 0;

  // The paged KV cache lives in backend memory, one per backend; blocks are addressed by the ids
  // of a kv::BlockPool of config.num_blocks. Returns the bytes allocated.
  virtual size_t allocate_kv_cache(const kv::KvCacheConfig& config) = 0;
  // Copies KV block src to dst in every layer (copy on write of a shared partial block).
  virtual void copy_kv_block(int32_t src, int32_t dst) = 0;
  // Whole KV pages (one block of one layer's K or V pool, kv_page_bytes() each) to and from host
  // memory, for moving a request's KV between servers (disagg/): the pages of `blocks` in
  // `layer`, their K pages in order, then their V pages. A quantized pool's page is the block's
  // codes and metadata as stored (core/quantized_paged_kv.h), K and V pages of the same size; the
  // blocks written hold complete V partitions until write_kv_tail says otherwise.
  virtual size_t kv_page_bytes() const = 0;
  virtual void read_kv_pages(int layer, std::span<const int32_t> blocks, std::byte* dst) = 0;
  virtual void write_kv_pages(int layer, std::span<const int32_t> blocks, const std::byte* src) = 0;
  // An int2 pool keeps a block's V partition unquantized (f16) until its last token arrives: the
  // tail. For a block holding `tokens` tokens, kv_tail_bytes(tokens) bytes of tail rows are what
  // read_kv_tail copies out and write_kv_tail puts back (0 when tokens is a multiple of the
  // partition); write_kv_tail also marks which of the block's V partitions are sealed, so it
  // follows write_kv_pages for the last block of a sequence. Pools without tails (f32, f16, bf16,
  // fp8) keep these defaults.
  virtual size_t kv_tail_bytes(int32_t /*tokens*/) const { return 0; }
  virtual void read_kv_tail(int /*layer*/, int32_t /*block*/, int32_t /*tokens*/, std::byte* /*dst*/) {}
  virtual void write_kv_tail(int /*layer*/, int32_t /*block*/, int32_t /*tokens*/, const std::byte* /*src*/) {}
  // Rotary embedding (rotate-half pairing, step.positions, step.rope_inv_freq) of the q and k
  // heads of qkv [rows, (q_heads + 2 kv_heads) * head_dim]: the rotated q goes to q [rows,
  // q_heads, head_dim]; the rotated k and the v of each row are stored in layer's KV cache at
  // step.slot_blocks / position. qkv is not changed.
  virtual void rope_append_kv(int layer, const StepBatch& step, const Tensor& qkv, Tensor q) = 0;
  // Attention of every row's query over its sequence's cached K/V up to its own position
  // (causal): q, out [rows, q_heads, head_dim]. Runs after rope_append_kv of the same layer.
  virtual void attention(int layer, const StepBatch& step, const Tensor& q, Tensor out) = 0;

  // What the decode planner needs to know (parallel workers available to split KV across).
  virtual attention::DeviceInfo device_info() const = 0;

  // How to plan prefix-aware decode attention (attention/prefix_plan.h) for this shape, or
  // nullopt when the backend cannot run it.
  struct PrefixPlanning {
    attention::PrefixPlanOptions options;
    attention::DeviceInfo device;
  };
  virtual std::optional<PrefixPlanning> prefix_planning(const attention::AttentionShape& /*shape*/) const {
    return std::nullopt;
  }

  // Decode-only steps of `rows` sequences are padded to this many rows and run through
  // run_graph (under paged attention, where the padded plan splits no KV); 0: never (the CPU
  // backend).
  virtual int32_t graph_rows(int32_t /*rows*/) const { return 0; }
  // Runs body, which issues the ops of the padded decode step given to begin_step. A GPU backend
  // runs it and captures it the first time the step's key is seen (its padded rows, attention
  // kind and launch shape, and the generation of the buffers it reads), and replays the capture
  // after: ops inside must depend on nothing but that StepBatch and buffers made by allocate()
  // (whose allocation or release moves the generation). The default, and a backend whose
  // graph_rows() is 0, just runs it.
  virtual void run_graph(const std::function<void()>& body) { body(); }
  // Steps run_graph captured and replayed so far, and how many times the graphs were dropped
  // because an address or count captured in them changed (a workspace array grew, a buffer was
  // allocated or freed).
  struct GraphStats {
    int64_t captures = 0;
    int64_t replays = 0;
    int64_t invalidations = 0;
  };
  virtual GraphStats graph_stats() const { return {}; }

  // Whether sample() is available; when not, the engine samples downloaded logits on the host.
  virtual bool can_sample() const { return false; }
  // One token for each of rows.size() leading rows of logits [n, ld] f32, whose first `vocab`
  // columns are valid.
  virtual void sample(const Tensor& logits, int32_t vocab, std::span<const SamplingRow> rows,
                      std::span<int32_t> tokens);

  // The k most likely tokens of some rows of logits [n, ld] f32, by log-softmax over each row's
  // first `vocab` columns (a beam search's candidates: k pairs per row cross to the host, not a
  // row): for the i-th of `rows`, tokens and logprobs [i * k, (i + 1) * k), best first, equal
  // log-probs lower id first. The log-probs are rank_top_logprobs()'s (top_logprobs.h), whose
  // rounding the ranking follows. 1 <= k <= min(vocab, kMaxTopLogprobs). The default downloads the
  // rows and ranks them on the host; that is the CPU backend's implementation.
  virtual void top_logprobs(const Tensor& logits, int32_t vocab, std::span<const int32_t> rows, int32_t k,
                            std::span<int32_t> tokens, std::span<float> logprobs);
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

inline void Backend::sample(const Tensor&, int32_t, std::span<const SamplingRow>, std::span<int32_t>) {
  fail(ErrorKind::kUnsupported, "the {} backend does not sample; sample downloaded logits", name());
}

inline void Backend::top_logprobs(const Tensor& logits, int32_t vocab, std::span<const int32_t> rows, int32_t k,
                                  std::span<int32_t> tokens, std::span<float> logprobs) {
  check_top_logprobs_args(logits, vocab, rows, k, tokens.size(), logprobs.size());
  std::vector<float> row(static_cast<size_t>(vocab));
  const size_t ld = size_t(logits.size(1)), kk = size_t(k);
  for (size_t i = 0; i < rows.size(); ++i) {
    download(row.data(), static_cast<const float*>(logits.data) + size_t(rows[i]) * ld, row.size() * sizeof(float));
    rank_top_logprobs(row, tokens.subspan(i * kk, kk), logprobs.subspan(i * kk, kk));
  }
}

}  // namespace pagoda

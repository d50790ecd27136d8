// Engine: iteration-level continuous batching on one model.
//
// Each step() builds one forward pass from every running sequence: one token for each that is
// decoding, plus prompt chunks (chunked prefill) up to a per-step token budget, admitting waiting
// requests while KV blocks and batch slots allow. When the KV pool cannot give a decoding
// sequence its next block, the most recently admitted sequence is preempted: its blocks are
// freed and it goes back to the front of the queue with its generated tokens, to be recomputed
// later (its sampler state is kept, so its output is unchanged).
//
// With prefix caching on, every full block a sequence computes goes into a radix-tree prefix
// cache (kv/prefix_cache.h) and stays there after the sequence ends. A newly admitted (or
// recomputed) sequence starts from the longest cached prefix of its tokens, in whole blocks, and
// computes only the rest. Cached blocks no sequence holds are freed, least recently used first,
// whenever the pool runs short (admission, growth, copy on write) and before anything is
// preempted, so they count as free for admission.
//
// A beam-search request (params.beam_width = W >= 1, docs/beam-search.md) computes its prompt once
// into one block table, then runs W beams whose tables share the prompt's blocks and each other's
// (refcounts): every step all W beams decode together (W of the step's rows and batch slots),
// BeamSearch picks the W best continuations, and the beams are re-formed by forking their
// parents' tables (the partly filled last block is copied when it is next written), dropped beams'
// blocks going back to the pool at once. It is preempted, and recomputed, as a whole: the prompt
// once, then every beam's generated tokens.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "pagoda/engine/beam_search.h"
#include "pagoda/engine/request.h"
#include "pagoda/engine/stop_matcher.h"
#include "pagoda/kv/block_pool.h"
#include "pagoda/kv/block_table.h"
#include "pagoda/kv/prefix_cache.h"
#include "pagoda/model/model.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda {

struct EngineOptions {
  int32_t block_size = 16;         // tokens per KV block
  int32_t num_kv_blocks = 0;       // 0: enough for max_batch sequences of the full context, capped by kv_memory_bytes
  size_t kv_memory_bytes = size_t(1) << 30;
  int32_t max_batch = 16;          // sequences in flight
  int32_t max_step_tokens = 512;   // tokens per forward pass (decode tokens + prefill chunks)
  bool prefix_caching = true;      // reuse the KV of cached prompt prefixes (whole blocks)
};

struct EngineStats {
  int64_t prompt_tokens = 0;      // prompt tokens computed (recomputes after preemption included)
  int64_t generated_tokens = 0;
  int64_t steps = 0;
  int64_t preemptions = 0;
  // Prompt tokens whose KV came from the prefix cache when their request was first admitted
  // (the recompute of a preempted request is not counted again), so that the hit rate is
  // prefix_hit_tokens / prompt tokens submitted, at most 1.
  int64_t prefix_hit_tokens = 0;
};

class Engine {
 public:
  Engine(StepModel& model, const Tokenizer& tokenizer, const EngineOptions& options = {});
  ~Engine();

  // Queues a request. Throws Error(kInvalidArgument) for bad parameters, an empty prompt, or a
  // prompt that does not fit the context (or could never fit the KV pool).
  RequestId submit(Request request);
  // Stops a request; its blocks are freed and it reports FinishReason::kCancelled at the next step.
  void cancel(RequestId id);

  // One iteration: one forward pass over the scheduled batch. Returns the events it produced.
  // If the forward pass throws, the scheduled sequences are requeued for recompute (no blocks
  // leak) and the exception propagates; the events already made come with the next step.
  std::vector<TokenEvent> step();
  bool has_work() const {
    return !waiting_.empty() || !running_.empty() || !cancelled_.empty() || !unreported_.empty();
  }

  int32_t num_running() const { return int32_t(running_.size()); }
  int32_t num_waiting() const { return int32_t(waiting_.size() + remote_queued_.size()); }
  int32_t num_free_blocks() const { return pool_.num_free(); }  // free in the pool (cached blocks are not)
  int32_t num_kv_blocks() const { return pool_.num_blocks(); }
  int32_t num_cached_blocks() const { return cache_.num_cached_blocks(); }
  // Cached blocks no request holds: num_kv_blocks() - num_free_blocks() - num_evictable_blocks()
  // are the blocks requests hold.
  int32_t num_evictable_blocks() const { return cache_.num_evictable_blocks(); }
  const EngineStats& stats() const { return stats_; }

  // Disaggregated serving (disagg/, docs/disaggregation.md). On a decode server, a request
  // submitted with prefill_remotely waits in a queue of its own; start_remote_prefills() gives
  // each that fits (a batch slot, and KV blocks for its prompt after its longest cached prefix)
  // its blocks and returns it, to be sent to a prefill server. Once its pages are written into
  // the blocks, complete_remote_prefill() makes it a decoding sequence with its first token (the
  // token's event comes with the next step); fail_remote_prefill() frees its blocks and queues it
  // for prefill here instead.
  struct RemotePrefill {
    RequestId id = 0;
    std::vector<int32_t> prompt;
    SamplingParams params;           // seed set
    std::vector<kv::BlockId> block_ids;  // covers the prompt
    int32_t cached_blocks = 0;       // leading blocks from the prefix cache: their KV is here
  };
  std::vector<RemotePrefill> start_remote_prefills();
  // Throws Error(kInvalidArgument) for a token outside the vocabulary (then nothing changed).
  // Returns false, doing nothing, when the request is no longer waiting for its KV (cancelled).
  bool complete_remote_prefill(RequestId id, int32_t first_token);
  void fail_remote_prefill(RequestId id);
  bool remote_prefill_pending(RequestId id) const;
  int32_t num_remote_queued() const { return int32_t(remote_queued_.size()); }
  int32_t num_remote_prefilling() const { return int32_t(remote_prefilling_.size()); }
  // On a prefill server, a request submitted with keep_kv keeps its blocks after it finishes
  // (its last event), so that its pages can be read and sent; release_kept_kv frees them.
  // Null when the request kept nothing (unknown, or cancelled).
  const kv::BlockTable* kept_kv(RequestId id) const;
  void release_kept_kv(RequestId id);
  // Called on the engine thread as a step's forward pass stores each layer's K/V, with the
  // keep_kv requests whose prompts the step completes (their block tables then hold that layer's
  // whole prompt), so that a prefill server sends each layer while the next ones compute.
  struct KeptKvLayer {
    RequestId id;
    std::span<const int32_t> block_ids;
  };
  using KeptKvLayerHook = std::function<void(int32_t layer, std::span<const KeptKvLayer> requests)>;
  void set_kept_kv_layer_hook(KeptKvLayerHook hook) { kept_kv_layer_hook_ = std::move(hook); }

 private:
  struct Sequence;
  struct ScheduledChunk {
    Sequence* seq;
    int32_t start;   // first token index (== tokens already in the KV cache)
    int32_t count;
    int32_t beam = -1;  // a beam of a beam-search request; -1: the sequence's own tokens and table
  };

  std::vector<ScheduledChunk> schedule();
  void reuse_cached_prefix(Sequence& seq);
  void forget_kv(Sequence& seq);
  bool grow(Sequence& seq, int32_t tokens);
  bool grow_beams(Sequence& seq, int32_t tokens);
  bool schedule_tokens(Sequence& seq, int32_t tokens, std::vector<ScheduledChunk>& chunks);
  int32_t batch_slots_in_use() const;
  void fork_beams_from_prompt(Sequence& seq);
  void step_beams(Sequence& seq, std::span<const BeamSearch::RankedRow> ranked, std::vector<TokenEvent>& events);
  void finish_beams(Sequence& seq, std::vector<TokenEvent>& events);
  void cache_full_blocks(Sequence& seq);
  void preempt(Sequence& victim);
  void finish(Sequence& seq, FinishReason reason, std::vector<TokenEvent>& events);
  void release_finished(Sequence& seq);
  TokenEvent accept_token(Sequence& seq, const SampledToken& sampled);

  StepModel& model_;
  const Tokenizer& tokenizer_;
  EngineOptions options_;
  kv::BlockPool pool_;
  kv::PrefixCache cache_;  // after pool_: it releases its blocks into the pool when destroyed
  RequestId next_id_ = 1;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // in admission order
  std::vector<RequestId> cancelled_;
  std::deque<std::unique_ptr<Sequence>> remote_queued_;       // prefill_remotely, no KV yet
  std::vector<std::unique_ptr<Sequence>> remote_prefilling_;  // holding blocks, KV on its way
  std::unordered_map<RequestId, kv::BlockTable> kept_kv_;
  KeptKvLayerHook kept_kv_layer_hook_;
  std::vector<TokenEvent> unreported_;  // made by a step whose forward pass threw
  std::vector<int32_t> model_stop_ids_;
  EngineStats stats_;
};

}  // namespace pagoda

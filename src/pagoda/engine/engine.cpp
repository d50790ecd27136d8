#include "pagoda/engine/engine.h"

#include <algorithm>
#include <limits>
#include <random>
#include <span>
#include <utility>

#include "pagoda/core/error.h"

namespace pagoda {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "?";
}

namespace {

// A request without a seed gets one now: the backend's sampler needs it explicitly.
SamplingParams with_seed(SamplingParams params) {
  if (!params.seed) params.seed = std::random_device{}();
  return params;
}

// Penalties and logprobs exist only in the host sampler.
bool needs_host_sampler(const SamplingParams& p) {
  return p.repetition_penalty != 1.f || p.presence_penalty != 0.f || p.frequency_penalty != 0.f || p.logprobs > 0;
}

}  // namespace

struct Engine::Sequence {
  Sequence(RequestId id, Request request, const Tokenizer& tokenizer)
      : id(id),
        params(with_seed(std::move(request.params))),
        tokens(std::move(request.prompt)),
        num_prompt(int32_t(tokens.size())),
        sampler(params),
        decoder(tokenizer),
        stop(params.stop) {}

  RequestId id;
  SamplingParams params;
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int32_t num_prompt;
  int32_t num_computed = 0;     // leading tokens whose K/V are in the cache
  kv::BlockTable table;         // covers num_computed tokens (more while a step is in flight)
  int32_t num_blocks_cached = 0;  // leading blocks of table already in the prefix cache
  bool admitted_before = false;   // its prefix-cache hit has been counted
  Sampler sampler;
  IncrementalDecoder decoder;
  StopMatcher stop;
  bool kv_exhausted = false;  // alone, it filled the KV cache: it ends with FinishReason::kLength

  int32_t pending() const { return int32_t(tokens.size()) - num_computed; }
  int32_t generated() const { return int32_t(tokens.size()) - num_prompt; }
};

namespace {

// Checked before anything is sized from them.
const EngineOptions& checked(const EngineOptions& o) {
  if (o.block_size <= 0 || o.block_size > 1024 || o.max_batch <= 0 || o.max_step_tokens <= 0 || o.num_kv_blocks < 0)
    fail(ErrorKind::kInvalidArgument, "engine: block size (1..1024), batch size and step tokens must be positive");
  return o;
}

int32_t default_num_blocks(const ModelConfig& c, const EngineOptions& o, size_t block_bytes) {
  const int64_t for_batch = int64_t(o.max_batch) * ((c.max_context + o.block_size - 1) / o.block_size);
  const int64_t for_memory = int64_t(o.kv_memory_bytes / block_bytes);
  return int32_t(std::max<int64_t>(1, std::min(for_batch, for_memory)));
}

}  // namespace

Engine::Engine(Model& model, const Tokenizer& tokenizer, const EngineOptions& options)
    : model_(model),
      tokenizer_(tokenizer),
      options_(checked(options)),
      pool_(options.num_kv_blocks > 0
                ? options.num_kv_blocks
                : default_num_blocks(model.config(), options, model.kv_block_bytes(options.block_size)),
            options.block_size),
      cache_(pool_) {
  model_.allocate_kv_cache(pool_.num_blocks(), options.block_size);
  // Every activation buffer at its largest now: a decode step replayed as a graph keeps using it.
  // A step samples at most one row per sequence it runs.
  const int32_t max_logit_rows = std::min(options_.max_batch, options_.max_step_tokens);
  const int32_t graph_rows = model_.backend().graph_rows(max_logit_rows);
  model_.reserve(std::max(options_.max_step_tokens, graph_rows), std::max(max_logit_rows, graph_rows));
  model_stop_ids_ = tokenizer.stop_ids();
}

Engine::~Engine() = default;

RequestId Engine::submit(Request request) {
  validate(request.params);
  const int32_t context = model_.config().max_context;
  const auto n = int64_t(request.prompt.size());
  if (n == 0) fail(ErrorKind::kInvalidArgument, "the prompt is empty");
  if (n >= context)
    fail(ErrorKind::kInvalidArgument, "the prompt has {} tokens; the model's context is {} tokens", n, context);
  const int64_t blocks = (n + 1 + options_.block_size - 1) / options_.block_size;
  if (blocks > pool_.num_blocks())
    fail(ErrorKind::kInvalidArgument, "the prompt needs {} KV blocks; the KV cache has {}", blocks, pool_.num_blocks());
  for (int32_t id : request.prompt)
    if (id < 0 || id >= model_.config().vocab_size)
      fail(ErrorKind::kInvalidArgument, "prompt token {} is outside the vocabulary", id);
  const RequestId id = next_id_++;
  waiting_.push_back(std::make_unique<Sequence>(id, std::move(request), tokenizer_));
  return id;
}

void Engine::cancel(RequestId id) {
  auto matches = [id](const std::unique_ptr<Sequence>& s) { return s->id == id; };
  if (auto it = std::find_if(waiting_.begin(), waiting_.end(), matches); it != waiting_.end()) {
    waiting_.erase(it);
  } else if (auto run = std::find_if(running_.begin(), running_.end(), matches); run != running_.end()) {
    kv::release((*run)->table, pool_);
    running_.erase(run);
  } else {
    return;  // unknown or already finished
  }
  cancelled_.push_back(id);
}

// A waiting sequence (no KV yet) starts from the longest cached prefix of its tokens. The last
// token is never taken from the cache: computing it is what produces the logits to sample from.
// So the sequence's own blocks start at a block boundary, after the cached ones, and nothing is
// ever written into a cached block.
void Engine::reuse_cached_prefix(Sequence& seq) {
  if (!options_.prefix_caching) return;
  const std::vector<kv::BlockId> cached = cache_.match(std::span(seq.tokens).first(seq.tokens.size() - 1));
  for (kv::BlockId id : cached) pool_.retain(id);
  seq.table = {.block_ids = cached, .length = int32_t(cached.size()) * options_.block_size};
  seq.num_computed = seq.table.length;
  seq.num_blocks_cached = int32_t(cached.size());
}

// Back to holding no KV (cached blocks it used stay cached).
void Engine::forget_kv(Sequence& seq) {
  kv::release(seq.table, pool_);
  seq.num_computed = 0;
  seq.num_blocks_cached = 0;
}

bool Engine::grow(Sequence& seq, int32_t tokens) {
  const int32_t needed = kv::blocks_needed(seq.table, tokens, pool_);
  // Cached blocks that no sequence holds are as good as free: evict before giving up.
  if (needed > pool_.num_free()) cache_.evict(needed - pool_.num_free());
  if (needed > pool_.num_free()) return false;
  if (auto copy = kv::append_tokens(seq.table, tokens, pool_)) model_.backend().copy_kv_block(copy->src, copy->dst);
  return true;
}

// Puts the sequence's newly computed full blocks into the prefix cache. Where another sequence
// computed the same tokens first, the sequence switches to the cached block and frees its copy,
// so that it holds every cached block of its path (which keeps evictable blocks truly unheld).
void Engine::cache_full_blocks(Sequence& seq) {
  if (!options_.prefix_caching) return;
  const int32_t full = seq.num_computed / options_.block_size;
  if (full <= seq.num_blocks_cached) return;
  const std::vector<kv::BlockId> cached =
      cache_.insert(std::span(seq.tokens).first(size_t(full) * size_t(options_.block_size)), seq.table.block_ids);
  for (size_t i = 0; i < cached.size(); ++i) {
    kv::BlockId& own = seq.table.block_ids[i];
    if (own == cached[i]) continue;
    pool_.retain(cached[i]);
    pool_.release(own);
    own = cached[i];
  }
  seq.num_blocks_cached = full;
}

void Engine::preempt(Sequence& victim) {
  forget_kv(victim);
  auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& s) { return s.get() == &victim; });
  waiting_.push_front(std::move(*it));
  running_.erase(it);
  ++stats_.preemptions;
}

std::vector<Engine::ScheduledChunk> Engine::schedule() {
  std::vector<ScheduledChunk> chunks;
  int32_t budget = options_.max_step_tokens;

  // Decoding sequences first: they hold KV already and each needs one token.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence& seq = *running_[i];
    if (seq.pending() != 1 || seq.num_computed < seq.num_prompt) {
      ++i;
      continue;
    }
    if (grow(seq, 1)) {
      chunks.push_back({&seq, seq.num_computed, 1});
      --budget;
      ++i;
      continue;
    }
    // Out of blocks. Alone, the sequence has filled the whole KV cache and can never grow: it
    // ends (finish reason length). Otherwise preempt the most recently admitted sequence
    // (possibly this one) and retry.
    if (running_.size() == 1) {
      seq.kv_exhausted = true;
      break;
    }
    Sequence& victim = *running_.back();
    const bool self = &victim == &seq;
    preempt(victim);
    if (self) break;
  }

  // Prompt chunks: sequences already part-way through their prompt, then new admissions.
  for (auto& owned : running_) {
    Sequence& seq = *owned;
    if (budget == 0) break;
    if (seq.pending() <= 1 && seq.num_computed >= seq.num_prompt) continue;
    const int32_t n = std::min(seq.pending(), budget);
    if (!grow(seq, n)) break;
    chunks.push_back({&seq, seq.num_computed, n});
    budget -= n;
  }
  while (budget > 0 && !waiting_.empty() && int32_t(running_.size()) < options_.max_batch) {
    Sequence& seq = *waiting_.front();
    reuse_cached_prefix(seq);
    const int32_t n = std::min(seq.pending(), budget);
    if (!grow(seq, n)) {
      forget_kv(seq);
      break;
    }
    if (!seq.admitted_before) stats_.prefix_hit_tokens += std::min(seq.num_computed, seq.num_prompt);
    seq.admitted_before = true;
    chunks.push_back({&seq, seq.num_computed, n});
    budget -= n;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }

  return chunks;
}

TokenEvent Engine::accept_token(Sequence& seq, const SampledToken& sampled) {
  TokenEvent event{.request = seq.id, .token = sampled.token, .sampled = sampled, .prompt_tokens = seq.num_prompt};
  seq.tokens.push_back(sampled.token);
  event.generated_tokens = seq.generated();
  ++stats_.generated_tokens;

  const SamplingParams& p = seq.params;
  const bool is_stop_token =
      (!p.ignore_eos && std::find(model_stop_ids_.begin(), model_stop_ids_.end(), sampled.token) != model_stop_ids_.end()) ||
      std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), sampled.token) != p.stop_token_ids.end();
  if (is_stop_token) {
    event.finish = FinishReason::kStop;
  } else {
    const StopMatcher::Output out = seq.stop.push(seq.decoder.push(sampled.token));
    event.text = out.text;
    if (out.stopped) event.finish = FinishReason::kStop;
  }
  if (event.finish == FinishReason::kNone &&
      (seq.generated() >= p.max_tokens || int32_t(seq.tokens.size()) >= model_.config().max_context))
    event.finish = FinishReason::kLength;
  if (event.finish != FinishReason::kNone && !seq.stop.stopped()) {
    // Release text held back for an incomplete character or a possible stop string.
    const StopMatcher::Output out = seq.stop.push(seq.decoder.flush());
    event.text += out.text;
    if (!out.stopped) event.text += seq.stop.flush();
  }
  return event;
}

std::vector<TokenEvent> Engine::step() {
  std::vector<TokenEvent> events = std::exchange(unreported_, {});
  for (RequestId id : cancelled_) events.push_back({.request = id, .finish = FinishReason::kCancelled});
  cancelled_.clear();

  const std::vector<ScheduledChunk> scheduled = schedule();
  for (size_t i = 0; i < running_.size();) {
    Sequence& seq = *running_[i];
    if (!seq.kv_exhausted) {
      ++i;
      continue;
    }
    events.push_back({.request = seq.id, .text = seq.stop.push(seq.decoder.flush()).text + seq.stop.flush(),
                      .finish = FinishReason::kLength, .prompt_tokens = seq.num_prompt,
                      .generated_tokens = seq.generated()});
    kv::release(seq.table, pool_);
    running_.erase(running_.begin() + ptrdiff_t(i));
  }
  if (scheduled.empty()) return events;

  std::vector<SequenceChunk> chunks;
  chunks.reserve(scheduled.size());
  for (const ScheduledChunk& s : scheduled) {
    Sequence& seq = *s.seq;
    chunks.push_back({.tokens = std::span(seq.tokens).subspan(size_t(s.start), size_t(s.count)),
                      .start_pos = s.start,
                      .block_ids = seq.table.block_ids,
                      .want_logits = s.start + s.count == int32_t(seq.tokens.size())});
    if (seq.num_computed < seq.num_prompt) stats_.prompt_tokens += std::min(s.count, seq.num_prompt - seq.num_computed);
  }
  // A request is sampled by one sampler all its life, so its seed gives the same text whatever it
  // is batched with: the backend's (a Philox draw keyed by seed and token index) when the backend
  // samples and the request needs neither penalties nor logprobs, else the host's, from
  // downloaded logits.
  const bool backend_samples = model_.backend().can_sample();
  auto on_backend = [&](const Sequence& seq) { return backend_samples && !needs_host_sampler(seq.params); };
  bool any_on_backend = false, any_on_host = false;
  std::vector<SamplingRow> rows;
  for (size_t i = 0; i < scheduled.size(); ++i) {
    if (!chunks[i].want_logits) continue;
    const Sequence& seq = *scheduled[i].seq;
    const SamplingParams& p = seq.params;
    (on_backend(seq) ? any_on_backend : any_on_host) = true;
    rows.push_back({.temperature = p.temperature < kGreedyBelowTemperature ? 0.f : p.temperature, .top_k = p.top_k,
                    .top_p = p.top_p, .min_p = p.min_p, .seed = *p.seed, .offset = uint64_t(seq.generated())});
  }
  std::span<const float> logits;
  std::vector<int32_t> sampled_tokens;
  try {
    model_.run(chunks);
    if (any_on_backend) sampled_tokens = model_.sample(rows, tokenizer_.vocab_size());
    if (any_on_host) logits = model_.download_logits();
  } catch (...) {
    // Leave the engine as if the step never ran: the scheduled sequences give their blocks back
    // and wait to be recomputed, and the events already made are reported by the next step.
    for (const ScheduledChunk& s : scheduled) preempt(*s.seq);
    unreported_ = std::move(events);
    throw;
  }
  ++stats_.steps;

  const size_t vocab = size_t(model_.config().vocab_size);
  std::vector<float> row(any_on_host ? vocab : 0);
  size_t logit_row = 0;
  std::vector<Sequence*> finished;
  for (size_t i = 0; i < scheduled.size(); ++i) {
    Sequence& seq = *scheduled[i].seq;
    seq.num_computed += scheduled[i].count;
    cache_full_blocks(seq);
    if (!chunks[i].want_logits) continue;
    SampledToken sampled;
    if (on_backend(seq)) {
      sampled.token = sampled_tokens[logit_row];
    } else {
      std::copy_n(logits.begin() + ptrdiff_t(logit_row * vocab), vocab, row.begin());
      // Rows past the tokenizer's vocabulary (padding, e.g. Qwen2.5's 151936 vs 151665) have no
      // text: never sample them.
      std::fill(row.begin() + std::min<ptrdiff_t>(tokenizer_.vocab_size(), ptrdiff_t(vocab)), row.end(),
                -std::numeric_limits<float>::infinity());
      sampled = seq.sampler.sample(row, seq.tokens, size_t(seq.num_prompt));
    }
    ++logit_row;
    events.push_back(accept_token(seq, sampled));
    if (events.back().finish != FinishReason::kNone) finished.push_back(&seq);
  }
  for (Sequence* seq : finished) {
    kv::release(seq->table, pool_);
    std::erase_if(running_, [&](const auto& s) { return s.get() == seq; });
  }
  return events;
}

}  // namespace pagoda

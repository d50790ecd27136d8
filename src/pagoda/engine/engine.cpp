#include "pagoda/engine/engine.h"

#include <algorithm>
#include <limits>
#include <random>
#include <span>
#include <utility>

#include "pagoda/core/error.h"
#include "pagoda/engine/beam_search.h"

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

// Penalties and logprobs exist only on the host. (A beam search ranks its rows on the backend:
// Backend::top_logprobs.)
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
        stop(params.stop),
        prefill_remotely(request.prefill_remotely),
        keep_kv(request.keep_kv) {}

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
  bool prefill_remotely;
  bool keep_kv;

  // Beam search: `tokens` stays the prompt, computed once into `table`; past the prompt the
  // running beams carry the tokens and tables, all num_computed long. `beams` is empty until the
  // first step has scored the prompt's logits.
  struct Beam {
    std::vector<int32_t> tokens;  // prompt, then this beam's generated tokens
    kv::BlockTable table;
    IncrementalDecoder decoder;  // this beam's text so far, for stop strings
    StopMatcher stop;
  };
  std::unique_ptr<BeamSearch> search;
  std::vector<Beam> beams;
  int32_t beam_tokens = 0;  // tokens appended to any beam: the request's usage

  bool past_prompt() const { return num_computed >= num_prompt; }
  // Tokens to compute before the next logits: the prompt's, or each beam's past the prompt.
  int32_t pending() const {
    return int32_t(search && past_prompt() && !beams.empty() ? beams[0].tokens.size() : tokens.size()) - num_computed;
  }
  bool decoding() const { return past_prompt() && pending() == 1; }
  int32_t generated() const { return int32_t(tokens.size()) - num_prompt; }
  int32_t batch_slots() const { return search ? search->width() : 1; }  // rows it takes in a step
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

Engine::Engine(StepModel& model, const Tokenizer& tokenizer, const EngineOptions& options)
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
  const int32_t graph_rows = model_.graph_rows(max_logit_rows);
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
  const SamplingParams& p = request.params;
  if (p.beam_width > options_.max_batch || p.beam_width > options_.max_step_tokens)
    fail(ErrorKind::kInvalidArgument,
         "a beam width of {} needs {} batch slots and step tokens; the engine runs {} sequences and {} tokens per step",
         p.beam_width, p.beam_width, options_.max_batch, options_.max_step_tokens);
  const RequestId id = next_id_++;
  auto seq = std::make_unique<Sequence>(id, std::move(request), tokenizer_);
  if (p.beam_width > 0) {
    // From the sequence's copy: `request` (and so p's vectors) has been moved into it.
    const SamplingParams& q = seq->params;
    std::vector<int32_t> stops = q.ignore_eos ? std::vector<int32_t>() : model_stop_ids_;
    for (int32_t t : q.stop_token_ids)
      if (std::find(stops.begin(), stops.end(), t) == stops.end()) stops.push_back(t);
    seq->search = std::make_unique<BeamSearch>(q.beam_width, q.length_penalty, q.early_stopping,
                                               int32_t(std::min<int64_t>(q.max_tokens, context - n)), int32_t(stops.size()));
    if (seq->search->candidates_per_beam() > kMaxTopLogprobs)
      fail(ErrorKind::kInvalidArgument,
           "a beam search of width {} with {} stop token ids ranks {} candidates per beam; at most {}", q.beam_width,
           stops.size(), seq->search->candidates_per_beam(), kMaxTopLogprobs);
  }
  (seq->prefill_remotely && !seq->search ? remote_queued_ : waiting_).push_back(std::move(seq));
  return id;
}

void Engine::cancel(RequestId id) {
  auto matches = [id](const std::unique_ptr<Sequence>& s) { return s->id == id; };
  if (auto it = std::find_if(waiting_.begin(), waiting_.end(), matches); it != waiting_.end()) {
    waiting_.erase(it);
  } else if (auto run = std::find_if(running_.begin(), running_.end(), matches); run != running_.end()) {
    forget_kv(**run);
    running_.erase(run);
  } else if (auto queued = std::find_if(remote_queued_.begin(), remote_queued_.end(), matches);
             queued != remote_queued_.end()) {
    remote_queued_.erase(queued);
  } else if (auto remote = std::find_if(remote_prefilling_.begin(), remote_prefilling_.end(), matches);
             remote != remote_prefilling_.end()) {
    kv::release((*remote)->table, pool_);
    remote_prefilling_.erase(remote);
  } else if (kept_kv_.contains(id)) {
    release_kept_kv(id);
    return;  // it has reported its finish already
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

// Back to holding no KV (cached blocks it used stay cached). Beams keep their tokens.
void Engine::forget_kv(Sequence& seq) {
  kv::release(seq.table, pool_);
  for (Sequence::Beam& beam : seq.beams) kv::release(beam.table, pool_);
  seq.num_computed = 0;
  seq.num_blocks_cached = 0;
}

bool Engine::grow(Sequence& seq, int32_t tokens) {
  const int32_t needed = kv::blocks_needed(seq.table, tokens, pool_);
  // Cached blocks that no sequence holds are as good as free: evict before giving up.
  if (needed > pool_.num_free()) cache_.evict(needed - pool_.num_free());
  if (needed > pool_.num_free()) return false;
  if (auto copy = kv::append_tokens(seq.table, tokens, pool_)) model_.copy_kv_block(copy->src, copy->dst);
  return true;
}

// Every beam grows by `tokens`, or none does. The blocks counted assume that each beam sharing a
// partly filled last block copies it, which overcounts by one per shared block: the last sharer
// to write finds itself alone and writes in place.
bool Engine::grow_beams(Sequence& seq, int32_t tokens) {
  int32_t needed = 0;
  for (const Sequence::Beam& beam : seq.beams) needed += kv::blocks_needed(beam.table, tokens, pool_);
  if (needed > pool_.num_free()) cache_.evict(needed - pool_.num_free());
  if (needed > pool_.num_free()) return false;
  for (Sequence::Beam& beam : seq.beams)
    if (auto copy = kv::append_tokens(beam.table, tokens, pool_)) model_.copy_kv_block(copy->src, copy->dst);
  return true;
}

// Schedules `tokens` more of the sequence (of each of its beams past a beam search's prompt), if
// the KV blocks are there.
bool Engine::schedule_tokens(Sequence& seq, int32_t tokens, std::vector<ScheduledChunk>& chunks) {
  if (seq.search && seq.past_prompt()) {
    if (!grow_beams(seq, tokens)) return false;
    for (int32_t b = 0; b < int32_t(seq.beams.size()); ++b) chunks.push_back({&seq, seq.num_computed, tokens, b});
    return true;
  }
  if (!grow(seq, tokens)) return false;
  chunks.push_back({&seq, seq.num_computed, tokens});
  return true;
}

int32_t Engine::batch_slots_in_use() const {
  int32_t slots = 0;
  for (const auto& seq : running_) slots += seq->batch_slots();
  return slots;
}

// A recomputed beam search has its prompt back: every beam forks it, then recomputes its own
// generated tokens.
void Engine::fork_beams_from_prompt(Sequence& seq) {
  for (Sequence::Beam& beam : seq.beams) beam.table = kv::fork(seq.table, seq.num_prompt, pool_);
  kv::release(seq.table, pool_);
  seq.num_blocks_cached = 0;
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

  // Decoding sequences first: they hold KV already and each needs one token (a beam search one per
  // beam, all in this step or none).
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence& seq = *running_[i];
    if (!seq.decoding() || seq.batch_slots() > budget) {
      ++i;
      continue;
    }
    if (schedule_tokens(seq, 1, chunks)) {
      budget -= seq.batch_slots();
      ++i;
      continue;
    }
    // Out of blocks. Alone, the sequence has filled the whole KV cache and can never grow: it
    // ends (finish reason length), unless remote prefills hold blocks (they come back as
    // sequences that can be preempted: wait for them). Otherwise preempt the most recently
    // admitted sequence (possibly this one) and retry.
    if (running_.size() == 1 && !remote_prefilling_.empty()) break;
    if (running_.size() == 1) {
      seq.kv_exhausted = true;
      break;
    }
    Sequence& victim = *running_.back();
    const bool self = &victim == &seq;
    preempt(victim);
    if (self) break;
  }

  // Prompt chunks: sequences already part-way through their prompt (or, recomputing a beam
  // search, through its beams' tokens: the same number for each), then new admissions.
  for (auto& owned : running_) {
    Sequence& seq = *owned;
    if (budget == 0) break;
    if (seq.pending() <= 1 && seq.past_prompt()) continue;
    const int32_t per_beam = seq.search && seq.past_prompt() ? seq.batch_slots() : 1;
    const int32_t n = std::min(seq.pending(), budget / per_beam);
    if (n == 0) break;
    if (!schedule_tokens(seq, n, chunks)) break;
    budget -= n * per_beam;
  }
  while (budget > 0 && !waiting_.empty() &&
         batch_slots_in_use() + waiting_.front()->batch_slots() <= options_.max_batch) {
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
    if (seq.search) {
      std::vector<std::span<const int32_t>> running;
      for (const Sequence::Beam& beam : seq.beams) running.push_back(std::span(beam.tokens).subspan(size_t(seq.num_prompt)));
      seq.search->stop_early(running);
      finish_beams(seq, events);
      forget_kv(seq);
      running_.erase(running_.begin() + ptrdiff_t(i));
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
    const std::vector<int32_t>& tokens = s.beam < 0 ? seq.tokens : seq.beams[size_t(s.beam)].tokens;
    // A recomputed beam search's prompt is not scored again: its beams go on from their own tokens.
    const bool rescoring_prompt = seq.search && s.beam < 0 && !seq.beams.empty();
    chunks.push_back({.tokens = std::span(tokens).subspan(size_t(s.start), size_t(s.count)),
                      .start_pos = s.start,
                      .block_ids = s.beam < 0 ? seq.table.block_ids : seq.beams[size_t(s.beam)].table.block_ids,
                      .want_logits = s.start + s.count == int32_t(tokens.size()) && !rescoring_prompt});
    if (seq.num_computed < seq.num_prompt) stats_.prompt_tokens += std::min(s.count, seq.num_prompt - seq.num_computed);
  }
  // A request is sampled by one sampler all its life, so its seed gives the same text whatever it
  // is batched with: the backend's (a Philox draw keyed by seed and token index) when the backend
  // samples and the request needs neither penalties nor logprobs, else the host's, from
  // downloaded logits. A beam search's rows are ranked on the backend, whichever it is: only
  // their best K tokens come back.
  const bool backend_samples = model_.can_sample();
  auto on_backend = [&](const Sequence& seq) { return backend_samples && !needs_host_sampler(seq.params); };
  bool any_on_backend = false, any_on_host = false;
  std::vector<SamplingRow> rows;
  std::vector<int32_t> beam_logit_rows;
  int32_t beam_k = 0;
  for (size_t i = 0; i < scheduled.size(); ++i) {
    if (!chunks[i].want_logits) continue;
    const Sequence& seq = *scheduled[i].seq;
    const SamplingParams& p = seq.params;
    if (seq.search) {
      beam_logit_rows.push_back(int32_t(rows.size()));
      beam_k = std::max(beam_k, seq.search->candidates_per_beam());
    } else {
      (on_backend(seq) ? any_on_backend : any_on_host) = true;
    }
    rows.push_back({.temperature = p.temperature < kGreedyBelowTemperature ? 0.f : p.temperature, .top_k = p.top_k,
                    .top_p = p.top_p, .min_p = p.min_p, .seed = *p.seed, .offset = uint64_t(seq.generated())});
  }
  std::vector<KeptKvLayer> kept_now;
  for (size_t i = 0; i < scheduled.size(); ++i)
    if (chunks[i].want_logits && scheduled[i].seq->keep_kv && scheduled[i].beam < 0)
      kept_now.push_back({scheduled[i].seq->id, chunks[i].block_ids});
  std::function<void(int32_t)> after_layer_kv;
  if (kept_kv_layer_hook_ && !kept_now.empty())
    after_layer_kv = [&](int32_t layer) { kept_kv_layer_hook_(layer, kept_now); };
  std::span<const float> logits;
  std::vector<int32_t> sampled_tokens;
  // The beams' rows ranked: beam_k (token, log-prob) pairs each, in beam_logit_rows' order.
  const int32_t text_vocab = std::min(tokenizer_.vocab_size(), model_.config().vocab_size);
  beam_k = std::min(beam_k, text_vocab);
  std::vector<int32_t> top_tokens;
  std::vector<float> top_logprobs;
  try {
    model_.run(chunks, after_layer_kv);
    if (any_on_backend) sampled_tokens = model_.sample(rows, tokenizer_.vocab_size());
    if (!beam_logit_rows.empty()) model_.top_logprobs(beam_logit_rows, beam_k, text_vocab, top_tokens, top_logprobs);
    if (any_on_host) logits = model_.download_logits();
  } catch (...) {
    // Leave the engine as if the step never ran: the scheduled sequences give their blocks back
    // and wait to be recomputed, and the events already made are reported by the next step.
    std::vector<Sequence*> requeued;  // a beam search has a chunk per beam
    for (const ScheduledChunk& s : scheduled)
      if (std::find(requeued.begin(), requeued.end(), s.seq) == requeued.end()) requeued.push_back(s.seq);
    for (Sequence* seq : requeued) preempt(*seq);
    unreported_ = std::move(events);
    throw;
  }
  ++stats_.steps;

  const size_t vocab = size_t(model_.config().vocab_size);
  std::vector<float> row(any_on_host ? vocab : 0);
  size_t logit_row = 0, beam_row = 0;
  std::vector<Sequence*> finished;
  // Each beam search's ranked rows, in beam order.
  std::vector<std::pair<Sequence*, std::vector<BeamSearch::RankedRow>>> beam_rows;
  for (size_t i = 0; i < scheduled.size(); ++i) {
    Sequence& seq = *scheduled[i].seq;
    seq.num_computed = scheduled[i].start + scheduled[i].count;
    if (scheduled[i].beam < 0) cache_full_blocks(seq);  // a beam's tokens are not worth caching: most beams die
    if (seq.search && scheduled[i].beam < 0 && seq.past_prompt() && !seq.beams.empty()) fork_beams_from_prompt(seq);
    if (!chunks[i].want_logits) continue;
    if (seq.search) {
      if (beam_rows.empty() || beam_rows.back().first != &seq) beam_rows.push_back({&seq, {}});
      const size_t at = beam_row++ * size_t(beam_k);
      beam_rows.back().second.push_back({.tokens = std::span(top_tokens).subspan(at, size_t(beam_k)),
                                         .logprobs = std::span(top_logprobs).subspan(at, size_t(beam_k))});
      ++logit_row;
      continue;
    }
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
  for (auto& [seq, ranked] : beam_rows) {
    step_beams(*seq, ranked, events);
    if (seq->search->done()) finished.push_back(seq);
  }
  for (Sequence* seq : finished) {
    release_finished(*seq);
    std::erase_if(running_, [&](const auto& s) { return s.get() == seq; });
  }
  return events;
}

void Engine::release_finished(Sequence& seq) {
  if (seq.keep_kv)
    kept_kv_[seq.id] = std::exchange(seq.table, {});
  else
    forget_kv(seq);
}

std::vector<Engine::RemotePrefill> Engine::start_remote_prefills() {
  std::vector<RemotePrefill> started;
  while (!remote_queued_.empty() &&
         int32_t(running_.size() + remote_prefilling_.size()) < options_.max_batch) {
    Sequence& seq = *remote_queued_.front();
    reuse_cached_prefix(seq);
    // Blocks for the whole prompt; its KV arrives for all but the cached ones. Decoding
    // sequences come first: a queued request waits for blocks rather than preempt anyone.
    if (!grow(seq, seq.num_prompt - seq.num_computed)) {
      forget_kv(seq);
      break;
    }
    if (!seq.admitted_before) stats_.prefix_hit_tokens += seq.num_computed;
    seq.admitted_before = true;
    started.push_back({.id = seq.id,
                       .prompt = seq.tokens,
                       .params = seq.params,
                       .block_ids = seq.table.block_ids,
                       .cached_blocks = seq.num_blocks_cached});
    remote_prefilling_.push_back(std::move(remote_queued_.front()));
    remote_queued_.pop_front();
  }
  return started;
}

bool Engine::complete_remote_prefill(RequestId id, int32_t first_token) {
  auto it = std::find_if(remote_prefilling_.begin(), remote_prefilling_.end(),
                         [id](const auto& s) { return s->id == id; });
  if (it == remote_prefilling_.end()) return false;
  if (first_token < 0 || first_token >= tokenizer_.vocab_size())
    fail(ErrorKind::kInvalidArgument, "first token {} is outside the vocabulary", first_token);
  Sequence& seq = **it;
  seq.num_computed = seq.num_prompt;
  // The prefill server drew one number for it (host sampler, not greedy): stay in step with it.
  if (!model_.can_sample() || needs_host_sampler(seq.params)) seq.sampler.skip(1);
  running_.push_back(std::move(*it));
  remote_prefilling_.erase(it);
  unreported_.push_back(accept_token(seq, SampledToken{.token = first_token}));
  if (unreported_.back().finish != FinishReason::kNone) {
    kv::release(seq.table, pool_);
    std::erase_if(running_, [&](const auto& s) { return s.get() == &seq; });
  }
  return true;
}

void Engine::fail_remote_prefill(RequestId id) {
  auto it = std::find_if(remote_prefilling_.begin(), remote_prefilling_.end(),
                         [id](const auto& s) { return s->id == id; });
  if (it == remote_prefilling_.end()) return;
  forget_kv(**it);
  waiting_.push_front(std::move(*it));
  remote_prefilling_.erase(it);
}

bool Engine::remote_prefill_pending(RequestId id) const {
  return std::any_of(remote_prefilling_.begin(), remote_prefilling_.end(), [id](const auto& s) { return s->id == id; });
}

const kv::BlockTable* Engine::kept_kv(RequestId id) const {
  auto it = kept_kv_.find(id);
  return it == kept_kv_.end() ? nullptr : &it->second;
}

void Engine::release_kept_kv(RequestId id) {
  auto it = kept_kv_.find(id);
  if (it == kept_kv_.end()) return;
  kv::release(it->second, pool_);
  kept_kv_.erase(it);
}

// One step of a beam search, from its running beams' best tokens (one row: the prompt's, before
// the first step): score, pick the W best, and re-form the beams by block tables. A new beam forks its
// parent's table (every block shared, the partly filled last one copied when next written); the
// old tables are released after every fork, so a dropped beam's own blocks are freed at once.
void Engine::step_beams(Sequence& seq, std::span<const BeamSearch::RankedRow> ranked, std::vector<TokenEvent>& events) {
  BeamSearch& search = *seq.search;
  const std::vector<BeamSearch::Candidate> candidates = search.candidates(ranked);

  // Before the first step the one "beam" is the prompt itself.
  const bool first = seq.beams.empty();
  std::vector<std::span<const int32_t>> parents;
  if (first) {
    parents.push_back({});
  } else {
    for (const Sequence::Beam& beam : seq.beams) parents.push_back(std::span(beam.tokens).subspan(size_t(seq.num_prompt)));
  }
  const SamplingParams& p = seq.params;
  std::vector<uint8_t> ends(candidates.size(), BeamSearch::kGoesOn);
  for (size_t i = 0; i < candidates.size(); ++i) {
    const BeamSearch::Candidate& c = candidates[i];
    const bool stop_token =
        (!p.ignore_eos && std::find(model_stop_ids_.begin(), model_stop_ids_.end(), c.token) != model_stop_ids_.end()) ||
        std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), c.token) != p.stop_token_ids.end();
    bool stop_string = false;
    if (!stop_token && !p.stop.empty()) {
      IncrementalDecoder decoder = first ? seq.decoder : seq.beams[size_t(c.parent)].decoder;
      StopMatcher stop = first ? seq.stop : seq.beams[size_t(c.parent)].stop;
      stop_string = stop.push(decoder.push(c.token)).stopped;
    }
    if (stop_token || stop_string) {
      ends[i] = BeamSearch::kEndsByStop;
    } else if (search.generated() + 1 >= search.max_new_tokens()) {
      ends[i] = BeamSearch::kEndsByLength;
    }
  }
  const std::vector<int32_t> next = search.advance(candidates, ends, parents);
  // Usage: every token appended to a beam, running on or finished.
  int32_t appended = int32_t(next.size());
  for (size_t i = 0; i < candidates.size() && i < size_t(search.width()); ++i) appended += ends[i] ? 1 : 0;
  seq.beam_tokens += appended;
  stats_.generated_tokens += appended;
  if (search.done()) {
    finish_beams(seq, events);
    return;
  }

  std::vector<Sequence::Beam> beams;
  beams.reserve(next.size());
  for (int32_t index : next) {
    const BeamSearch::Candidate& c = candidates[size_t(index)];
    Sequence::Beam beam = first ? Sequence::Beam{.tokens = seq.tokens,
                                                 .table = kv::fork(seq.table, seq.num_computed, pool_),
                                                 .decoder = seq.decoder,
                                                 .stop = seq.stop}
                                : Sequence::Beam{.tokens = seq.beams[size_t(c.parent)].tokens,
                                                 .table = kv::fork(seq.beams[size_t(c.parent)].table, seq.num_computed, pool_),
                                                 .decoder = seq.beams[size_t(c.parent)].decoder,
                                                 .stop = seq.beams[size_t(c.parent)].stop};
    beam.tokens.push_back(c.token);
    if (!p.stop.empty()) beam.stop.push(beam.decoder.push(c.token));
    beams.push_back(std::move(beam));
  }
  kv::release(seq.table, pool_);
  seq.num_blocks_cached = 0;
  for (Sequence::Beam& beam : seq.beams) kv::release(beam.table, pool_);
  seq.beams = std::move(beams);
}

// The search is over: report its best num_return hypotheses with their text.
void Engine::finish_beams(Sequence& seq, std::vector<TokenEvent>& events) {
  TokenEvent event{.request = seq.id, .prompt_tokens = seq.num_prompt, .generated_tokens = seq.beam_tokens};
  for (BeamHypothesis& h : seq.search->finished()) {
    if (int32_t(event.beams.size()) == seq.params.num_return) break;
    BeamOutput out{.cumulative_logprob = h.cumulative_logprob, .score = h.score,
                   .finish = h.stopped ? FinishReason::kStop : FinishReason::kLength};
    IncrementalDecoder decoder(tokenizer_);
    StopMatcher stop(seq.params.stop);
    for (int32_t token : h.tokens) out.text += stop.push(decoder.push(token)).text;
    if (!stop.stopped()) out.text += stop.push(decoder.flush()).text;
    if (!stop.stopped()) out.text += stop.flush();
    out.tokens = std::move(h.tokens);
    event.beams.push_back(std::move(out));
  }
  event.finish = event.beams.empty() ? FinishReason::kLength : event.beams.front().finish;
  events.push_back(std::move(event));
}

}  // namespace pagoda

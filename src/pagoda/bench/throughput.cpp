// pagoda bench throughput: the engine under a workload, end to end, as a serving system sees it.
//
// Offline (--batch B --input I --output O): B requests of I synthetic token ids, all at t = 0,
// each generating exactly O tokens (greedy, past end-of-sequence); with --shared-prefix P the
// first P ids of every prompt are the same (a system prompt), as vLLM's random dataset's prefix
// length. Besides throughput and latencies, the decode-only steps (after every prompt is
// prefilled) are compared with their bandwidth roofline: a decode step must read every weight
// byte once (of an untied embedding table, only its tokens' rows) plus each running sequence's KV
// (context x layers x 2 x kv_heads x head_dim x dtype size), the shared prefix's whole KV blocks
// once (the prefix cache gives every sequence the same blocks), so those bytes over the device's
// streaming-read bandwidth, measured in the same run, are the fastest a step can be.
//
// Split over N ranks (--tensor-parallel N): on GPUs each rank reads its own memory, so a decode
// step is bound by the rank that reads the most (its weight shard and its kv heads' KV) over one
// device's bandwidth, plus the step's 2 x layers + 1 all-reduces (after the embedding, o and down)
// at the all-reduce's latency at the step's message size, measured on the ranks' communicators
// before the run (or given: --allreduce-us); the logits' all-gather is left out, so the bound stays
// a lower bound. On the CPU the ranks share one memory, so the main roofline counts every rank's
// bytes; the per-rank bound is reported beside it. Efficiency is against N = 1: the same workload
// run unsplit after the split run, or a figure given with --baseline-tokens-per-s (a model too
// large for one device), or none (--no-baseline).
//
// Replay (--trace FILE): a Mooncake trace (trace.h), each request submitted when its (scaled)
// arrival time passes while the engine steps (one thread: the clock is checked between steps).
// Requests whose hash ids start alike share a prompt prefix, so the prefix cache's hit rate is real.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/bench/beam_search.h"
#include "pagoda/bench/bench_report.h"
#include "pagoda/bench/counter_random.h"
#include "pagoda/bench/host_support.h"
#include "pagoda/bench/throughput.h"
#include "pagoda/bench/trace.h"
#include "pagoda/core/error.h"
#include "pagoda/engine/session.h"
#include "pagoda/model/shard.h"
#include "pagoda/model/tensor_parallel_model.h"

#if PAGODA_HAVE_CUDA
#include "pagoda/bench/cuda_support.h"
#endif

namespace pagoda::bench {
namespace {

using nlohmann::json;

// What happened to one request, in seconds from the start of the run.
struct RequestTiming {
  double arrival_s = 0;
  double first_token_s = -1;
  double last_token_s = -1;
  int32_t prompt_tokens = 0;
  int32_t generated = 0;
};

// One decode-only step: its wall time and the KV tokens its attention read (a kv head's K and V
// of one token in one layer, per kv head and layer: ReadBytes::kv_bytes_per_token counts those).
struct DecodeStep {
  double seconds = 0;
  double kv_tokens = 0;
  int32_t batch = 0;
};

struct RunResult {
  std::vector<RequestTiming> requests;
  std::vector<DecodeStep> decode_steps;
  double wall_s = 0;  // until the last token
  EngineStats stats;
  int32_t kv_blocks = 0;
  int64_t prefix_steps = 0;     // steps whose decode rows attended prefix-aware
  double step_planning_s = 0;   // host time making steps ready (Model::step_planning_seconds)
  Backend::GraphStats graphs;   // decode steps captured and replayed as CUDA graphs
};


// Prompts of `input` ids whose first `shared` are the same for every request: those come from a
// stream no request has, the rest from the request's own.
std::vector<ReplayRequest> offline_workload(int32_t batch, int32_t input, int32_t shared, int32_t output, int32_t vocab,
                                            uint64_t seed) {
  const std::vector<int32_t> prefix = synthetic_tokens(offline_request_stream(seed, UINT32_MAX), shared, vocab);
  std::vector<ReplayRequest> requests(static_cast<size_t>(batch));
  for (int32_t r = 0; r < batch; ++r) {
    std::vector<int32_t> prompt = prefix;
    const std::vector<int32_t> own = synthetic_tokens(offline_request_stream(seed, uint64_t(r)), input - shared, vocab);
    prompt.insert(prompt.end(), own.begin(), own.end());
    requests[size_t(r)] = {.prompt = std::move(prompt), .max_tokens = output};
  }
  return requests;
}

// Runs the workload on a fresh engine. A step is decode-only when every request had its first
// token before it, it computed no prompt token, and no request was ever preempted (a preempted
// request's recompute is prefill work in later steps). shared_kv_tokens: KV tokens every request
// reads from the same blocks, which a decode step's bound counts once.
RunResult run_workload(Session& session, const EngineOptions& options, const std::vector<ReplayRequest>& workload,
                       int64_t shared_kv_tokens, bool report_progress) {
  Engine engine(*session.model, session.tokenizer, options);
  RunResult result;
  result.kv_blocks = engine.num_kv_blocks();
  result.requests.resize(workload.size());
  std::unordered_map<RequestId, size_t> index_of;
  int64_t expected_tokens = 0;
  for (const ReplayRequest& r : workload) expected_tokens += r.max_tokens;

  size_t next = 0, started = 0, finished = 0;
  int64_t tokens = 0;
  // The model outlives each run's engine (warm-up, then the workload): its counters are differenced.
  const int64_t prefix_steps_before = session.model->prefix_steps();
  const double planning_before = session.model->step_planning_seconds();
  const Backend::GraphStats graphs_before = session.backend->graph_stats();
  const auto start = Clock::now();
  double last_report = 0;
  while (next < workload.size() || engine.has_work()) {
    const double now = seconds_since(start);
    for (; next < workload.size() && workload[next].arrival_s <= now; ++next) {
      const ReplayRequest& r = workload[next];
      SamplingParams params;  // greedy, past end-of-sequence: every request generates max_tokens
      params.temperature = 0.f;
      params.max_tokens = r.max_tokens;
      params.ignore_eos = true;
      index_of[engine.submit({.prompt = r.prompt, .params = params})] = next;
      result.requests[next].arrival_s = r.arrival_s;  // queueing behind a long step counts in TTFT
      result.requests[next].prompt_tokens = int32_t(r.prompt.size());
    }
    if (!engine.has_work()) {
      std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(workload[next].arrival_s)));
      continue;
    }
    const bool all_started = next == workload.size() && started == workload.size();
    const EngineStats before = engine.stats();
    const double step_start = seconds_since(start);
    const std::vector<TokenEvent> events = engine.step();
    const double step_end = seconds_since(start);
    double kv_tokens = 0;
    int64_t token_events = 0;
    for (const TokenEvent& e : events) {
      if (e.finish != FinishReason::kNone) ++finished;
      if (e.token < 0) continue;
      RequestTiming& t = result.requests[index_of.at(e.request)];
      if (t.first_token_s < 0) {
        t.first_token_s = step_end;
        ++started;
      }
      t.last_token_s = step_end;
      t.generated = e.generated_tokens;
      ++tokens;
      // The step fed the token before this one, at position prompt + generated - 2, and attended
      // to every token up to it: prompt + generated - 1 of them.
      kv_tokens += double(e.prompt_tokens + e.generated_tokens - 1);
      ++token_events;
    }
    if (token_events > 1) kv_tokens -= double(token_events - 1) * double(shared_kv_tokens);
    const EngineStats& after = engine.stats();
    if (all_started && after.prompt_tokens == before.prompt_tokens && after.preemptions == 0 && !events.empty())
      result.decode_steps.push_back({step_end - step_start, kv_tokens, int32_t(events.size())});
    if (report_progress && step_end - last_report >= 5) {
      last_report = step_end;
      std::fprintf(stderr, "bench: %.0f s, %lld steps, %lld / %lld tokens, %zu / %zu requests done\n", step_end,
                   static_cast<long long>(after.steps), static_cast<long long>(tokens),
                   static_cast<long long>(expected_tokens), finished, workload.size());
    }
  }
  result.stats = engine.stats();
  result.prefix_steps = session.model->prefix_steps() - prefix_steps_before;
  result.step_planning_s = session.model->step_planning_seconds() - planning_before;
  result.graphs = session.backend->graph_stats();
  result.graphs.captures -= graphs_before.captures;
  result.graphs.replays -= graphs_before.replays;
  result.graphs.invalidations -= graphs_before.invalidations;
  for (const RequestTiming& t : result.requests) result.wall_s = std::max(result.wall_s, t.last_token_s);
  return result;
}

struct Summary {
  double mean = 0, p50 = 0, p99 = 0;
};

// Percentiles by linear interpolation between the closest ranks (numpy's default).
Summary summarize(std::vector<double> values) {
  Summary s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  auto percentile = [&](double p) {
    const double rank = p / 100 * double(values.size() - 1);
    const size_t lo = size_t(rank);
    const size_t hi = std::min(lo + 1, values.size() - 1);
    return values[lo] + (values[hi] - values[lo]) * (rank - double(lo));
  };
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / double(values.size());
  s.p50 = percentile(50);
  s.p99 = percentile(99);
  return s;
}

json to_json(const Summary& s) { return {{"mean", s.mean}, {"p50", s.p50}, {"p99", s.p99}}; }

// What a model (or one tensor-parallel rank) reads in a decode step: every weight once, except
// an untied embedding table, of which only the rows of its tokens, plus the KV of its kv heads.
struct ReadBytes {
  double weight_bytes = 0;
  double step_weight_bytes = 0;
  double embedding_row_bytes = 0;
  double kv_bytes_per_token = 0;
  int kv_heads = 0;

  double step(const DecodeStep& s) const {
    return step_weight_bytes + s.batch * embedding_row_bytes + s.kv_tokens * kv_bytes_per_token;
  }
};

// embedding_rows: the rows of the model's (or the rank's) embedding table.
ReadBytes read_bytes(const ModelConfig& c, const StepModel& model, int kv_heads, int64_t embedding_rows,
                     DType kv_dtype) {
  ReadBytes b;
  b.weight_bytes = double(model.weight_bytes());
  b.embedding_row_bytes = double(dtype_bytes(model.weight_dtype(), c.hidden_size));
  b.step_weight_bytes =
      b.weight_bytes - (c.tie_word_embeddings ? 0 : double(embedding_rows) * b.embedding_row_bytes);
  b.kv_heads = kv_heads;
  b.kv_bytes_per_token = double(c.num_layers) * 2 * double(kv_heads) * c.head_dim * double(dtype_size(kv_dtype));
  return b;
}

json to_json(const ReadBytes& b) {
  return {{"weight_bytes", b.weight_bytes},
          {"step_weight_bytes", b.step_weight_bytes},
          {"embedding_row_bytes", b.embedding_row_bytes},
          {"kv_heads", b.kv_heads},
          {"kv_bytes_per_token", b.kv_bytes_per_token}};
}

// The decode-only steps against (bytes read) / bandwidth + the step's collectives' floor. The
// bytes of a step are the sum over `ranks` when they share one memory (one device, or ranks on
// one CPU), else the largest rank's (each its own device at `bandwidth`).
struct Roofline {
  int64_t steps = 0;
  double measured_s = 0;
  double bound_s = 0;
  double memory_bound_s = 0;
  double collective_bound_s = 0;
  double bytes = 0;
  double median_step_s = 0;
  double mean_batch = 0;
};

Roofline roofline(const std::vector<DecodeStep>& steps, const std::vector<ReadBytes>& ranks, bool ranks_share_memory,
                  double bandwidth, double step_collective_s) {
  Roofline r;
  std::vector<double> times;
  for (const DecodeStep& s : steps) {
    double bytes = 0;
    for (const ReadBytes& rank : ranks) bytes = ranks_share_memory ? bytes + rank.step(s) : std::max(bytes, rank.step(s));
    ++r.steps;
    r.measured_s += s.seconds;
    r.bytes += bytes;
    r.mean_batch += s.batch;
    times.push_back(s.seconds);
  }
  r.memory_bound_s = r.bytes / bandwidth;
  r.collective_bound_s = double(r.steps) * step_collective_s;
  r.bound_s = r.memory_bound_s + r.collective_bound_s;
  r.median_step_s = summarize(times).p50;
  if (r.steps > 0) r.mean_batch /= double(r.steps);
  return r;
}

std::string command_line(const ThroughputBenchOptions& f, const EngineOptions& options, bool offline) {
  std::string c = "pagoda bench throughput";
  if (!f.model.path.empty()) c += " -m " + f.model.path;
  c += " --backend " + f.model.backend + " --weight-dtype " + f.model.weight_dtype;
  if (offline) {
    c += fmt::format(" --batch {} --input {} --output {}", f.batch, f.input, f.output);
    if (f.shared_prefix > 0) c += fmt::format(" --shared-prefix {}", f.shared_prefix);
  } else {
    const TraceScaling& s = f.scaling;
    c += fmt::format(" --trace {} --time-scale {} --length-scale {} --max-requests {} --max-input {} --max-output {}",
                     f.trace, s.time_scale, s.length_scale, s.max_requests, s.max_input, s.max_output);
    if (s.output_scale > 0) c += fmt::format(" --output-scale {}", s.output_scale);
  }
  c += fmt::format(" --attention {} --max-batch {} --step-tokens {}", f.model.attention, options.max_batch,
                   options.max_step_tokens);
  if (f.model.enforce_eager) c += " --enforce-eager";
  if (f.model.tensor_parallel != 1) c += fmt::format(" --tensor-parallel {}", f.model.tensor_parallel);
  if (f.baseline_given) c += fmt::format(" --baseline-tokens-per-s {}", f.baseline_tokens_per_s);
  if (f.no_baseline) c += " --no-baseline";
  if (f.allreduce_given) c += fmt::format(" --allreduce-us {}", f.allreduce_us);
  if (options.num_kv_blocks == 0) c += fmt::format(" --kv-memory-mb {}", options.kv_memory_bytes >> 20);
  if (f.no_prefix_cache) c += " --no-prefix-cache";
  if (f.seed != 0) c += fmt::format(" --seed {}", f.seed);
  return c;
}

// The device the model runs on, as result files name it.
std::string device_name(const Backend& backend) {
#if PAGODA_HAVE_CUDA
  if (backend.device() == Device::kCuda) return describe_current_device().name;
#endif
  (void)backend;
  return cpu_name();
}

// Its streaming-read bandwidth in bytes/s, measured now with the probe its other benchmarks use,
// and which probe that was.
std::pair<double, std::string> measure_read_bandwidth(const Backend& backend) {
#if PAGODA_HAVE_CUDA
  if (backend.device() == Device::kCuda)
    return {measure_stream_read_bandwidth(), "measure_stream_read_bandwidth (as bench attention)"};
#endif
  (void)backend;
  return {measure_host_read_bandwidth(), "measure_host_read_bandwidth (as bench generate)"};
}

void check_flags(const ThroughputBenchOptions& f, bool offline) {
  const bool replay = !f.trace.empty();
  if (offline == replay)
    fail(ErrorKind::kInvalidArgument, "bench throughput needs either --batch/--input/--output (offline) or --trace FILE");
  if (offline && (f.batch < 1 || f.batch > 4096 || f.input < 1 || f.output < 1))
    fail(ErrorKind::kInvalidArgument, "--batch in [1, 4096], --input >= 1 and --output >= 1 please");
  if (f.shared_prefix < 0 || f.shared_prefix > f.input || (f.shared_prefix > 0 && !offline))
    fail(ErrorKind::kInvalidArgument, "--shared-prefix is for offline runs, in [0, --input], not {}", f.shared_prefix);
  if (f.beam_width != 0 && (!offline || f.beam_width < 1 || f.beam_width > kMaxBeamWidth))
    fail(ErrorKind::kInvalidArgument, "--beam-width is for offline runs, in [1, {}], not {}", kMaxBeamWidth, f.beam_width);
  const bool split = f.model.tensor_parallel > 1;
  if ((f.baseline_given || f.no_baseline || f.allreduce_given) && (!split || f.beam_width > 0))
    fail(ErrorKind::kInvalidArgument,
         "--baseline-tokens-per-s, --no-baseline and --allreduce-us are for --tensor-parallel N > 1 (without --beam-width)");
  if (f.baseline_given && f.no_baseline)
    fail(ErrorKind::kInvalidArgument, "--baseline-tokens-per-s and --no-baseline: one or the other");
  if (f.baseline_given && !(f.baseline_tokens_per_s > 0 && f.baseline_tokens_per_s < 1e9))
    fail(ErrorKind::kInvalidArgument, "--baseline-tokens-per-s must be in (0, 1e9), not {}", f.baseline_tokens_per_s);
  if (f.allreduce_given && (!offline || !(f.allreduce_us > 0 && f.allreduce_us < 1e6)))
    fail(ErrorKind::kInvalidArgument, "--allreduce-us is for offline runs (the roofline), in (0, 1e6), not {}",
         f.allreduce_us);
}

// The all-reduce that the per-rank bound charges for each of a decode step's collectives.
struct AllReduceFloor {
  int64_t rows = 0;  // of the [rows, hidden] activation it sums
  double seconds = 0;
  std::string source;
  int64_t per_step = 0;
};

json nullable(bool known, double value) { return known ? json(value) : json(nullptr); }

// Prints and returns the split run's figures: efficiency against N = 1, the time in collectives,
// and (offline) the decode steps against the per-rank bound.
json report_tensor_parallel(TensorParallelModel& split, const std::vector<ReadBytes>& ranks, const RunResult& run,
                            double output_tps, double reference_tps, const std::string& baseline_source,
                            double collective_s, bool offline, double bandwidth, const AllReduceFloor& allreduce) {
  const int n = split.world_size();
  const bool on_cpu = split.rank_backend(0).device() == Device::kCpu;
  const bool baseline = reference_tps > 0;
  std::printf("tensor parallel: %d ranks, %s\n", n,
              on_cpu ? "threads sharing the CPU's cores and memory" : "one GPU each, NCCL and the one-shot all-reduce");
  if (baseline) {
    std::printf("  N = 1: %.1f output tokens/s (%s): speed-up %.2fx, per-rank efficiency %.1f%%\n", reference_tps,
                baseline_source.c_str(), output_tps / reference_tps, 100 * output_tps / (n * reference_tps));
  } else {
    std::printf("  N = 1: %s, no efficiency\n", baseline_source.c_str());
  }
  if (on_cpu) {
    std::printf("  rank 0 in collectives %.2f s (%.1f%% of the wall time)\n", collective_s, 100 * collective_s / run.wall_s);
  } else {
    std::printf("  time in collectives: not measured on GPUs (enqueued on the stream, replayed in graphs); the bound "
                "below charges them\n");
  }
  json j = {{"ranks", n},
            {"communicator", on_cpu ? "cpu (threads sharing memory)" : "nccl (+ one-shot all-reduce)"},
            {"baseline", baseline_source},
            {"unsplit_output_tok_s", nullable(baseline, reference_tps)},
            {"speedup", nullable(baseline, output_tps / reference_tps)},
            {"per_rank_efficiency", nullable(baseline, output_tps / (n * reference_tps))},
            {"rank0_collective_s", nullable(on_cpu, collective_s)},
            {"collective_fraction_of_wall", nullable(on_cpu, collective_s / run.wall_s)},
            {"efficiency", "output tokens/s split / (ranks x output tokens/s at N = 1), same workload and flags; "
                           "collective time is rank 0's wait inside all-reduce and all-gather, the other ranks' late "
                           "arrival included (the CPU communicator's; GPU collectives are enqueued, not timed)"}};
  for (const ReadBytes& r : ranks) j["rank_bytes"].push_back(to_json(r));
  if (!offline) return j;

  const Roofline r = roofline(run.decode_steps, ranks, false, bandwidth, double(allreduce.per_step) * allreduce.seconds);
  std::printf("  per-rank roofline of the %lld decode-only steps: the largest rank's bytes over %.1f GB/s + %lld "
              "all-reduces of [%lld, hidden] x %.1f us (%s)\n",
              static_cast<long long>(r.steps), bandwidth / 1e9, static_cast<long long>(allreduce.per_step),
              static_cast<long long>(allreduce.rows), 1e6 * allreduce.seconds, allreduce.source.c_str());
  if (r.steps > 0) {
    std::printf("  measured %.3f ms/step, bound %.3f ms/step (%.3f memory + %.3f all-reduce, %.1f MB on the largest "
                "rank): %.1f%% of the per-rank roofline\n",
                1e3 * r.measured_s / double(r.steps), 1e3 * r.bound_s / double(r.steps),
                1e3 * r.memory_bound_s / double(r.steps), 1e3 * r.collective_bound_s / double(r.steps),
                r.bytes / double(r.steps) / 1e6, 100 * r.bound_s / r.measured_s);
  }
  j["per_rank_roofline"] = {
      {"decode_steps", r.steps},
      {"measured_s", r.measured_s},
      {"bound_s", r.bound_s},
      {"memory_bound_s", r.memory_bound_s},
      {"all_reduce_bound_s", r.collective_bound_s},
      {"fraction_of_bound", r.measured_s > 0 ? r.bound_s / r.measured_s : 0},
      {"mean_step_ms", r.steps ? 1e3 * r.measured_s / double(r.steps) : 0},
      {"bound_step_ms", r.steps ? 1e3 * r.bound_s / double(r.steps) : 0},
      {"largest_rank_bytes_read", r.bytes},
      {"read_bandwidth_bytes_per_s", bandwidth},
      {"all_reduce_rows", allreduce.rows},
      {"all_reduce_us", 1e6 * allreduce.seconds},
      {"all_reduce_source", allreduce.source},
      {"all_reduces_per_step", allreduce.per_step},
      {"bound", "per decode-only step, max over ranks of (the rank's weight bytes, of an untied embedding shard only "
                "the batch's rows, + its kv heads' KV bytes) / streaming-read bandwidth of one device, + (2 x layers "
                "+ 1) all-reduces of the step's [rows, hidden] activation x the all-reduce time at that size (the "
                "logits' all-gather not counted); fraction = bound / measured"},
  };
  return j;
}

}  // namespace

void run_throughput_bench(const ThroughputBenchOptions& f) {
  const bool offline = f.offline;
  check_flags(f, offline);
  std::vector<TraceEntry> trace;
  if (!offline) trace = read_trace_file(f.trace);  // a bad trace fails before the model loads

  Session session(f.model);
  const ModelConfig& c = session.model->config();
  // Ids within the tokenizer's vocabulary: the model's table may have padding rows past it.
  const int32_t vocab = std::min(session.tokenizer.vocab_size(), int32_t(c.vocab_size));
  EngineOptions options = session.engine_options;
  options.prefix_caching = !f.no_prefix_cache;
  std::vector<ReplayRequest> workload;
  Replay replay;
  if (offline) {
    if (int64_t(f.input) + f.output > c.max_context)
      fail(ErrorKind::kInvalidArgument, "--input {} + --output {} exceed the model's context of {} tokens", f.input,
           f.output, c.max_context);
    workload = offline_workload(f.batch, f.input, f.shared_prefix, f.output, vocab, f.seed);
    if (f.beam_width > 0) {
      if (!f.kv_memory_given) options.num_kv_blocks = 0;  // sized from the beam bound
      run_beam_search_bench(session, options, workload, f.beam_width, device_name(*session.backend),
                            command_line(f, options, true) + fmt::format(" --beam-width {}", f.beam_width), f.json_path);
      return;
    }
    // Unless told otherwise, every request runs at once and the KV cache holds them all: the
    // workload then measures the decode batch it names, not the scheduler's limits.
    if (!f.max_batch_given) options.max_batch = f.batch;
    if (!f.kv_memory_given) {
      const int32_t per_request = (f.input + f.output + options.block_size - 1) / options.block_size;
      options.num_kv_blocks = f.batch * (per_request + 1);
    }
  } else {
    replay = build_replay(trace, f.scaling, vocab, f.seed);
    for (size_t r = 0; r < replay.requests.size(); ++r) {
      const ReplayRequest& q = replay.requests[r];
      if (int64_t(q.prompt.size()) + q.max_tokens > c.max_context)
        fail(ErrorKind::kInvalidArgument,
             "trace request {} needs {} + {} tokens, more than the model's context of {}: scale it with "
             "--length-scale or cap it with --max-input/--max-output",
             r, q.prompt.size(), q.max_tokens, c.max_context);
    }
    workload = std::move(replay.requests);
  }

  // What each rank reads per decode step (one rank: the whole model). Ranks on the CPU share one
  // memory, so the main bound counts all of theirs (a kv head replicated on several ranks is read
  // by each); ranks on GPUs each read their own, so it takes the largest.
  auto* split = dynamic_cast<TensorParallelModel*>(session.model.get());
  const DType kv_dtype = session.backend->activation_dtype();
  std::vector<ReadBytes> ranks;
  if (split) {
    for (int r = 0; r < split->world_size(); ++r) {
      const ShardLayout layout = shard_layout(c, {r, split->world_size()});
      // A rank's embedding shard: its vocab_rows ids and the zero row other ids read (weights.h).
      ranks.push_back(read_bytes(c, split->rank_model(r), layout.num_kv_heads, int64_t(layout.vocab_rows) + 1, kv_dtype));
    }
  } else {
    ranks.push_back(read_bytes(c, *session.model, c.num_kv_heads, c.vocab_size, kv_dtype));
  }
  const bool ranks_share_memory = session.backend->device() == Device::kCpu;
  ReadBytes whole;  // the main bound's bytes as one reader: the ranks' sum, or the largest rank's
  for (const ReadBytes& r : ranks) {
    whole.weight_bytes = ranks_share_memory ? whole.weight_bytes + r.weight_bytes : std::max(whole.weight_bytes, r.weight_bytes);
    whole.step_weight_bytes = ranks_share_memory ? whole.step_weight_bytes + r.step_weight_bytes
                                                 : std::max(whole.step_weight_bytes, r.step_weight_bytes);
    whole.embedding_row_bytes = ranks_share_memory ? whole.embedding_row_bytes + r.embedding_row_bytes
                                                   : std::max(whole.embedding_row_bytes, r.embedding_row_bytes);
    whole.kv_bytes_per_token = ranks_share_memory ? whole.kv_bytes_per_token + r.kv_bytes_per_token
                                                  : std::max(whole.kv_bytes_per_token, r.kv_bytes_per_token);
  }
  double weight_bytes = 0;  // the whole model's, all ranks' shards
  for (const ReadBytes& r : ranks) weight_bytes += r.weight_bytes;
  const std::string device = device_name(*session.backend);
  double bandwidth = 0;
  std::string bandwidth_probe;
  if (offline) {
    std::fprintf(stderr, "bench: measuring the streaming-read bandwidth...\n");
    std::tie(bandwidth, bandwidth_probe) = measure_read_bandwidth(*session.backend);
  }
  // The per-rank bound's all-reduce: a decode step's activation [rows, hidden] (rows padded as a
  // graph-replayed step pads them), timed on the ranks' own communicators unless given.
  const int64_t allreduce_rows = offline ? std::max<int64_t>(f.batch, session.model->graph_rows(f.batch)) : 0;
  const int64_t collectives_per_step = 2 * int64_t(c.num_layers) + 1;
  double allreduce_s = 0;
  std::string allreduce_source;
  if (split && offline) {
    if (f.allreduce_given) {
      allreduce_s = f.allreduce_us * 1e-6;
      allreduce_source = "given (--allreduce-us)";
    } else {
      std::fprintf(stderr, "bench: timing the ranks' all-reduce of [%lld, %d]...\n", static_cast<long long>(allreduce_rows),
                   c.hidden_size);
      constexpr int kCalls = 20, kRounds = 10;
      allreduce_s = split->time_all_reduce(allreduce_rows, kCalls, kRounds);
      allreduce_source = fmt::format("measured before the run: {} all_reduce_sum calls back to back on every rank, "
                                     "not graph-replayed, rank 0's wall time / calls, the fastest of {} rounds",
                                     kCalls, kRounds);
    }
  }
  // Warm-up (kernel selection, graph capture, first-touch allocations) on an engine of its own:
  // offline, the same batch and prompts with 4 output tokens (other ids: no prefix-cache hits).
  std::fprintf(stderr, "bench: warm-up...\n");
  run_workload(session, options,
               offline ? offline_workload(f.batch, f.input, f.shared_prefix, 4, vocab, f.seed + 1)
                       : offline_workload(1, 16, 0, 4, vocab, 1),
               0, false);
  std::fprintf(stderr, "bench: running %zu requests...\n", workload.size());
  const int64_t shared_kv_tokens =
      options.prefix_caching ? int64_t(f.shared_prefix) / options.block_size * options.block_size : 0;
  const double collectives_before = split ? split->seconds_in_collectives() : 0;
  const RunResult run = run_workload(session, options, workload, shared_kv_tokens, true);
  const double collective_s = split ? split->seconds_in_collectives() - collectives_before : 0;
  // Split: the N = 1 figure that efficiency compares with: the same workload unsplit, unless
  // given or declined.
  double reference_tps = 0;
  std::string baseline_source = "none (--no-baseline)";
  if (split && f.baseline_given) {
    reference_tps = f.baseline_tokens_per_s;
    baseline_source = "given (--baseline-tokens-per-s)";
  } else if (split && !f.no_baseline) {
    ModelFlags unsplit = f.model;
    unsplit.tensor_parallel = 1;
    Session reference(unsplit);
    std::fprintf(stderr, "bench: the same workload unsplit, for reference...\n");
    run_workload(reference, options,
                 offline ? offline_workload(f.batch, f.input, f.shared_prefix, 4, vocab, f.seed + 1)
                         : offline_workload(1, 16, 0, 4, vocab, 1),
                 0, false);
    const RunResult r = run_workload(reference, options, workload, shared_kv_tokens, false);
    int64_t tokens = 0;
    for (const RequestTiming& t : r.requests) tokens += t.generated;
    reference_tps = double(tokens) / r.wall_s;
    baseline_source = "measured: the same workload and flags unsplit, in this process after the split run";
  }

  int64_t prompt_tokens = 0, output_tokens = 0;
  std::vector<double> ttft_ms, tpot_ms, e2e_s;
  for (const RequestTiming& t : run.requests) {
    prompt_tokens += t.prompt_tokens;
    output_tokens += t.generated;
    ttft_ms.push_back(1e3 * (t.first_token_s - t.arrival_s));
    e2e_s.push_back(t.last_token_s - t.arrival_s);
    if (t.generated > 1) tpot_ms.push_back(1e3 * (t.last_token_s - t.first_token_s) / (t.generated - 1));
  }
  const Summary ttft = summarize(ttft_ms), tpot = summarize(tpot_ms), e2e = summarize(e2e_s);
  const double output_tps = double(output_tokens) / run.wall_s;
  const double total_tps = double(prompt_tokens + output_tokens) / run.wall_s;
  const double hit_rate = prompt_tokens > 0 ? double(run.stats.prefix_hit_tokens) / double(prompt_tokens) : 0;

  std::printf("pagoda bench throughput (%s): %s, %s backend on %s\n", offline ? "offline" : "replay",
              session.checkpoint.path().c_str(), session.backend->name().c_str(), device.c_str());
  std::printf("model: %s, %d layers, %d/%d heads x %d, weights %.2f GB (%s)\n", c.architecture.c_str(), c.num_layers,
              c.num_q_heads, c.num_kv_heads, c.head_dim, weight_bytes / 1e9, std::string(dtype_name(session.model->weight_dtype())).c_str());
  if (offline) {
    std::printf("workload: %d requests x %d input tokens (the first %d the same in all) x %d output tokens, all at "
                "t = 0\n",
                f.batch, f.input, f.shared_prefix, f.output);
  } else {
    const TraceScaling& s = f.scaling;
    auto cap = [](int32_t limit, int32_t capped) {
      return limit > 0 ? fmt::format("capped at {} tokens ({} requests)", limit, capped) : std::string("not capped");
    };
    std::printf("workload: %s, %zu of %d requests; arrival times x %g, lengths x %g (a hash id is %d tokens, not "
                "%d), outputs x %g; inputs %s, outputs %s\n",
                f.trace.c_str(), workload.size(), replay.requests_in_trace, s.time_scale, s.length_scale,
                replay.block_tokens, kTraceBlockTokens, s.output_factor(),
                cap(s.max_input, replay.inputs_capped).c_str(), cap(s.max_output, replay.outputs_capped).c_str());
  }
  std::printf("engine: max batch %d, %d tokens per step, %d KV blocks of %d tokens, prefix cache %s, attention %s%s\n",
              options.max_batch, options.max_step_tokens, run.kv_blocks, options.block_size,
              options.prefix_caching ? "on" : "off", f.model.attention.c_str(),
              f.model.enforce_eager ? ", no CUDA graphs" : "");
  std::printf("%-26s %12s\n", "requests", std::to_string(run.requests.size()).c_str());
  std::printf("%-26s %12.1f\n", "output tokens/s", output_tps);
  std::printf("%-26s %12.1f\n", "total tokens/s", total_tps);
  std::printf("%-26s %12.2f\n", "wall time (s)", run.wall_s);
  std::printf("%-26s %12s %12s %12s\n", "", "mean", "p50", "p99");
  auto row = [](const char* name, const Summary& s) {
    std::printf("%-26s %12.2f %12.2f %12.2f\n", name, s.mean, s.p50, s.p99);
  };
  row("TTFT (ms)", ttft);
  row("TPOT (ms)", tpot);
  row("end-to-end latency (s)", e2e);
  std::printf("%-26s %11.1f%% (%lld of %lld prompt tokens)\n", "prefix-cache hit rate", 100 * hit_rate,
              static_cast<long long>(run.stats.prefix_hit_tokens), static_cast<long long>(prompt_tokens));
  std::printf("%-26s %12lld\n", "steps", static_cast<long long>(run.stats.steps));
  std::printf("%-26s %12lld\n", "preemptions", static_cast<long long>(run.stats.preemptions));
  const double planning_us = run.stats.steps > 0 ? 1e6 * run.step_planning_s / double(run.stats.steps) : 0;
  std::printf("%-26s %12lld\n", "prefix-attention steps", static_cast<long long>(run.prefix_steps));
  std::printf("%-26s %12.1f (host: batch, attention plan, upload)\n", "step planning (us/step)", planning_us);
  std::printf("%-26s %12lld (%lld captured)\n", "steps replayed as graphs", static_cast<long long>(run.graphs.replays),
              static_cast<long long>(run.graphs.captures));
  json roofline_json = nullptr;
  if (offline) {
    const Roofline r = roofline(run.decode_steps, ranks, ranks_share_memory, bandwidth, 0);
    std::printf("roofline of the %lld decode-only steps (mean batch %.1f), read bandwidth %.1f GB/s measured now%s:\n",
                static_cast<long long>(r.steps), r.mean_batch, bandwidth / 1e9,
                !split                ? ""
                : ranks_share_memory ? ", every rank's bytes (the ranks share this memory)"
                                     : ", the largest rank's bytes (one device each), no collectives");
    if (r.steps > 0) {
      std::printf("  measured %.3f ms/step (median %.3f), bound %.3f ms/step (%.1f MB read per step): %.1f%% of "
                  "the roofline, %.1f GB/s achieved\n",
                  1e3 * r.measured_s / double(r.steps), 1e3 * r.median_step_s, 1e3 * r.bound_s / double(r.steps),
                  r.bytes / double(r.steps) / 1e6, 100 * r.bound_s / r.measured_s, r.bytes / r.measured_s / 1e9);
    } else {
      std::printf("  none (every step prefilled, or a preemption made later steps recompute)\n");
    }
    roofline_json = {
        {"decode_steps", r.steps},
        {"mean_batch", r.mean_batch},
        {"measured_s", r.measured_s},
        {"bound_s", r.bound_s},
        {"fraction_of_bound", r.measured_s > 0 ? r.bound_s / r.measured_s : 0},
        {"mean_step_ms", r.steps ? 1e3 * r.measured_s / double(r.steps) : 0},
        {"median_step_ms", 1e3 * r.median_step_s},
        {"bound_step_ms", r.steps ? 1e3 * r.bound_s / double(r.steps) : 0},
        {"bytes_read", r.bytes},
        {"step_weight_bytes", whole.step_weight_bytes},
        {"embedding_row_bytes", whole.embedding_row_bytes},
        {"kv_bytes_per_token", whole.kv_bytes_per_token},
        {"achieved_bytes_per_s", r.measured_s > 0 ? r.bytes / r.measured_s : 0},
        {"read_bandwidth_bytes_per_s", bandwidth},
        {"bandwidth_probe", bandwidth_probe},
        {"bound", "per decode-only step, (weight bytes, of an untied embedding table only the batch's rows, + "
                  "sum over running sequences of context x layers x 2 x kv_heads x head_dim x KV dtype size, the "
                  "shared prefix's whole blocks counted once) / streaming-read bandwidth; fraction = bound / measured; "
                  "split over ranks: every rank's bytes where they share one memory (CPU), else the largest rank's"},
    };
  }

  json tensor_parallel = nullptr;
  if (split)
    tensor_parallel = report_tensor_parallel(*split, ranks, run, output_tps, reference_tps, baseline_source, collective_s,
                                             offline, bandwidth,
                                             {allreduce_rows, allreduce_s, allreduce_source, collectives_per_step});

  if (!f.json_path.empty()) {
    json config = {
        {"mode", offline ? "offline" : "replay"},
        {"max_batch", options.max_batch},
        {"step_tokens", options.max_step_tokens},
        {"kv_blocks", run.kv_blocks},
        {"block_size", options.block_size},
        {"prefix_caching", options.prefix_caching},
        {"attention", f.model.attention},
        {"cuda_graphs", !f.model.enforce_eager},
        {"seed", f.seed},
        {"token_id_range", vocab},
    };
    if (offline) {
      config["batch"] = f.batch;
      config["input"] = f.input;
      config["output"] = f.output;
      config["shared_prefix"] = f.shared_prefix;
    } else {
      const TraceScaling& s = f.scaling;
      config["trace"] = f.trace;
      config["scaling"] = {{"time_scale", s.time_scale},        {"length_scale", s.length_scale},
                           {"output_scale", s.output_factor()},
                           {"block_tokens", replay.block_tokens}, {"max_requests", s.max_requests},
                           {"max_input", s.max_input},          {"max_output", s.max_output},
                           {"requests_in_trace", replay.requests_in_trace},
                           {"requests_replayed", workload.size()},
                           {"inputs_capped", replay.inputs_capped}, {"outputs_capped", replay.outputs_capped}};
    }
    const json j = {
        {"benchmark", "throughput"},
        {"command", command_line(f, options, offline)},
        {"commit", git_commit()},
        {"device", device},
        {"backend", session.backend->name()},
        {"model", session.checkpoint.path()},
        {"model_shape",
         {{"architecture", c.architecture}, {"layers", c.num_layers}, {"hidden", c.hidden_size},
          {"q_heads", c.num_q_heads}, {"kv_heads", c.num_kv_heads}, {"head_dim", c.head_dim},
          {"intermediate", c.intermediate_size}, {"vocab", c.vocab_size}}},
        {"weight_dtype", dtype_name(session.model->weight_dtype())},
        {"weight_bytes", weight_bytes},
        {"config", config},
        {"figures",
         {{"requests", run.requests.size()}, {"prompt_tokens", prompt_tokens}, {"output_tokens", output_tokens},
          {"wall_s", run.wall_s}, {"output_tok_s", output_tps}, {"total_tok_s", total_tps},
          {"ttft_ms", to_json(ttft)}, {"tpot_ms", to_json(tpot)}, {"e2e_s", to_json(e2e)},
          {"prefix_hit_tokens", run.stats.prefix_hit_tokens}, {"prefix_hit_rate", hit_rate},
          {"steps", run.stats.steps}, {"preemptions", run.stats.preemptions},
          {"prefix_attention_steps", run.prefix_steps}, {"step_planning_us_mean", planning_us},
          {"graph_captures", run.graphs.captures}, {"graph_replays", run.graphs.replays}}},
        {"roofline", roofline_json},
        {"tensor_parallel", tensor_parallel},
    };
    write_json_file(f.json_path, j);
    std::fprintf(stderr, "bench: wrote %s\n", f.json_path.c_str());
  }
}

}  // namespace pagoda::bench

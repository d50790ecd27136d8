#include "pagoda/bench/beam_search.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include <nlohmann/json.hpp>

#include "pagoda/bench/bench_report.h"
#include "pagoda/bench/host_support.h"

namespace pagoda::bench {
namespace {

struct BeamRun {
  double wall_s = 0;
  int64_t output_tokens = 0;  // every beam's tokens, or every sequence's
  int32_t peak_blocks = 0;    // KV blocks held by requests (cached-only blocks not counted)
  int64_t steps = 0;
  int64_t preemptions = 0;
  double step_planning_s = 0;  // host time making steps ready (Model::step_planning_seconds)
  int64_t prefix_steps = 0;    // steps whose decode rows attended prefix-aware
  Backend::GraphStats graphs;  // steps captured and replayed as CUDA graphs during the run
};

int32_t blocks_held(const Engine& e) { return e.num_kv_blocks() - e.num_free_blocks() - e.num_evictable_blocks(); }

BeamRun run(Session& session, const EngineOptions& options, const std::vector<ReplayRequest>& workload, int32_t width,
            bool beams) {
  Engine engine(*session.model, session.tokenizer, options);
  // Untimed: every prompt into the prefix cache, so that both runs start from cached prompts.
  for (const ReplayRequest& r : workload)
    engine.submit({.prompt = r.prompt, .params = {.temperature = 0.f, .max_tokens = 1}});
  while (engine.has_work()) engine.step();
  const EngineStats before = engine.stats();
  const double planning_before = session.model->step_planning_seconds();
  const int64_t prefix_before = session.model->prefix_steps();
  const Backend::GraphStats graphs_before = session.backend->graph_stats();

  BeamRun result;
  const auto start = Clock::now();
  for (const ReplayRequest& r : workload) {
    SamplingParams params{.temperature = 0.f, .max_tokens = r.max_tokens, .ignore_eos = true};
    if (beams) {
      params.beam_width = width;
      params.num_return = width;
      params.early_stopping = EarlyStopping::kNever;  // with no stop, every beam reaches max_tokens
      engine.submit({.prompt = r.prompt, .params = params});
    } else {
      // Sampled, each with its own seed (n = W choices of one prompt): greedy copies would be
      // identical and the prefix cache would merge their blocks, which no real workload sees.
      params.temperature = 1.f;
      for (int32_t w = 0; w < width; ++w) {
        params.seed = uint64_t(&r - workload.data()) * uint64_t(width) + uint64_t(w);
        engine.submit({.prompt = r.prompt, .params = params});
      }
    }
  }
  while (engine.has_work()) {
    engine.step();
    result.peak_blocks = std::max(result.peak_blocks, blocks_held(engine));
  }
  result.wall_s = seconds_since(start);
  result.output_tokens = engine.stats().generated_tokens - before.generated_tokens;
  result.steps = engine.stats().steps - before.steps;
  result.preemptions = engine.stats().preemptions - before.preemptions;
  result.step_planning_s = session.model->step_planning_seconds() - planning_before;
  result.prefix_steps = session.model->prefix_steps() - prefix_before;
  const Backend::GraphStats graphs = session.backend->graph_stats();
  result.graphs = {.captures = graphs.captures - graphs_before.captures,
                   .replays = graphs.replays - graphs_before.replays,
                   .invalidations = graphs.invalidations - graphs_before.invalidations};
  return result;
}

nlohmann::json to_json(const BeamRun& r) {
  return {{"wall_s", r.wall_s},
          {"output_tokens", r.output_tokens},
          {"output_tokens_per_s", double(r.output_tokens) / r.wall_s},
          {"ms_per_step", 1e3 * r.wall_s / double(std::max<int64_t>(r.steps, 1))},
          {"step_planning_us_mean", 1e6 * r.step_planning_s / double(std::max<int64_t>(r.steps, 1))},
          {"prefix_attention_steps", r.prefix_steps},
          {"graph_captures", r.graphs.captures},
          {"graph_replays", r.graphs.replays},
          {"graph_invalidations", r.graphs.invalidations},
          {"peak_kv_blocks", r.peak_blocks},
          {"steps", r.steps},
          {"preemptions", r.preemptions}};
}

}  // namespace

void run_beam_search_bench(Session& session, EngineOptions options, const std::vector<ReplayRequest>& workload,
                           int32_t width, const std::string& device, const std::string& command, const std::string& json_path) {
  const auto batch = int32_t(workload.size());
  options.max_batch = std::max(options.max_batch, batch * width);
  options.max_step_tokens = std::max(options.max_step_tokens, options.max_batch);
  // The KV bound of a beam search: its prompt's blocks once, then per beam its generated tokens'
  // blocks plus one (the copy of a partly filled block).
  int64_t bound = 0, independent_need = 0;
  for (const ReplayRequest& r : workload) {
    const int64_t prompt_blocks = (int64_t(r.prompt.size()) + options.block_size - 1) / options.block_size;
    const int64_t generated_blocks = (r.max_tokens + options.block_size - 1) / options.block_size;
    bound += prompt_blocks + width * generated_blocks + width;
    independent_need += prompt_blocks + width * (generated_blocks + 1);
  }
  if (options.num_kv_blocks == 0) options.num_kv_blocks = int32_t(std::max(bound, independent_need) + batch);

  std::fprintf(stderr, "bench: warm-up...\n");
  run(session, options, {workload.front()}, width, true);
  std::fprintf(stderr, "bench: %d beam searches of width %d...\n", batch, width);
  const BeamRun beam = run(session, options, workload, width, true);
  std::fprintf(stderr, "bench: %d x %d independent sequences...\n", batch, width);
  const BeamRun independent = run(session, options, workload, width, false);

  const double beam_tps = double(beam.output_tokens) / beam.wall_s;
  const double independent_tps = double(independent.output_tokens) / independent.wall_s;
  std::printf("beam search, %d requests x width %d: %lld tokens in %.3f s, %.1f tok/s, peak %d KV blocks "
              "(bound %lld)\n",
              batch, width, static_cast<long long>(beam.output_tokens), beam.wall_s, beam_tps, beam.peak_blocks,
              static_cast<long long>(bound));
  std::printf("independent, %d requests x %d sequences: %lld tokens in %.3f s, %.1f tok/s, peak %d KV blocks\n", batch,
              width, static_cast<long long>(independent.output_tokens), independent.wall_s, independent_tps,
              independent.peak_blocks);
  std::printf("beam / independent: throughput %.3f, KV blocks %.3f\n", beam_tps / independent_tps,
              double(beam.peak_blocks) / independent.peak_blocks);
  for (const auto& [label, r] : {std::pair<const char*, const BeamRun&>{"beam search", beam}, {"independent", independent}})
    std::printf("%s: %.2f ms/step, planning %.0f us/step, %lld prefix-aware steps, graphs %lld captured %lld replayed\n",
                label, 1e3 * r.wall_s / double(std::max<int64_t>(r.steps, 1)),
                1e6 * r.step_planning_s / double(std::max<int64_t>(r.steps, 1)), static_cast<long long>(r.prefix_steps),
                static_cast<long long>(r.graphs.captures), static_cast<long long>(r.graphs.replays));
  if (json_path.empty()) return;
  const nlohmann::json j = {
      {"command", command},
      {"device", device},
      {"model", session.checkpoint.path()},
      {"backend", session.backend->name()},
      {"workload",
       {{"requests", batch},
        {"input_tokens", workload.front().prompt.size()},
        {"output_tokens", workload.front().max_tokens},
        {"beam_width", width},
        {"block_size", options.block_size},
        {"kv_blocks", options.num_kv_blocks}}},
      {"beam_search", to_json(beam)},
      {"independent_sequences", to_json(independent)},
      {"kv_bound_blocks", bound},
      {"throughput_ratio", beam_tps / independent_tps},
      {"kv_blocks_ratio", double(beam.peak_blocks) / independent.peak_blocks},
      {"peak_over_bound", double(beam.peak_blocks) / double(bound)}};
  write_json_file(json_path, j);
  std::fprintf(stderr, "bench: wrote %s\n", json_path.c_str());
}

}  // namespace pagoda::bench

// pagoda bench generate: prefill speed, batch-1 decode speed and batch-N aggregate decode speed,
// each next to its bound: decode must read every weight byte (and its KV) once per step, so
// bytes per step / measured memory bandwidth is the fastest a step can be.
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/bench/bench_report.h"
#include "pagoda/bench/generate.h"
#include "pagoda/bench/host_support.h"
#include "pagoda/engine/session.h"
#include "pagoda/core/error.h"

namespace pagoda::bench {
namespace {

// Peak f32 FMA throughput with all threads (FLOP/s): ten independent AVX2 FMA chains per
// thread, enough to cover the FMA latency on every core.
double measure_fma_peak() {
  constexpr int kChains = 10;
  constexpr int64_t kIterations = 20'000'000;
  double best = 0;
  float sink = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const auto start = Clock::now();
    int threads = 1;
#pragma omp parallel reduction(+ : sink)
    {
#pragma omp single
      threads = omp_get_num_threads();
      __m256 acc[kChains];
      for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(float(c));
      const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
      for (int64_t i = 0; i < kIterations; ++i)
        for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
      for (int c = 0; c < kChains; ++c) sink += _mm256_cvtss_f32(acc[c]);
    }
    best = std::max(best, double(threads) * kIterations * kChains * 16 / seconds_since(start));
  }
  if (sink == 42) std::puts("");  // keeps the arithmetic
  return best;
}

std::vector<int32_t> synthetic_prompt(int32_t length, int32_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(length));
  for (auto& id : ids) id = int32_t(rng() % uint64_t(vocab));
  return ids;
}

struct DecodeRun {
  double prefill_seconds = 0;
  double decode_seconds = 0;  // steps in which every request decodes
  int64_t decode_tokens = 0;
};

// Runs `batch` requests of prompt_len synthetic tokens generating gen_len tokens each (greedy,
// past EOS), all prompts prefilled in the first step.
DecodeRun run_batch(Session& session, int32_t batch, int32_t prompt_len, int32_t gen_len, uint64_t seed) {
  EngineOptions options = session.engine_options;
  options.max_batch = batch;
  options.max_step_tokens = batch * prompt_len;
  Engine engine(*session.model, session.tokenizer, options);
  for (int32_t b = 0; b < batch; ++b) {
    SamplingParams params{.temperature = 0.f, .max_tokens = gen_len, .ignore_eos = true};
    engine.submit({.prompt = synthetic_prompt(prompt_len, session.model->config().vocab_size, seed + uint64_t(b)),
                   .params = params});
  }
  DecodeRun run;
  auto start = Clock::now();
  engine.step();  // every prompt, and the first token of each
  run.prefill_seconds = seconds_since(start);
  start = Clock::now();
  while (engine.has_work()) run.decode_tokens += int64_t(engine.step().size());
  run.decode_seconds = seconds_since(start);
  return run;
}

}  // namespace

void run_generate_bench(GenerateBenchOptions options) {
  if (options.prompt_tokens < 1 || options.gen_tokens < 2 || options.batch < 1 || options.batch > 256)
    fail(ErrorKind::kInvalidArgument, "--prompt-tokens >= 1, --gen-tokens >= 2 and --batch in [1, 256] please");
  // Its bounds are the host's bandwidth and FMA peak: the GPU is `bench throughput`'s.
  if (options.model.backend == "cuda")
    fail(ErrorKind::kInvalidArgument, "bench generate measures the CPU backend; on the GPU use bench throughput");
  options.model.backend = "cpu";
  Session session(options.model);
  const ModelConfig& c = session.model->config();
  if (int64_t(options.prompt_tokens) + options.gen_tokens > c.max_context)
    fail(ErrorKind::kInvalidArgument, "prompt + generated tokens exceed the context of {}", c.max_context);

  std::fprintf(stderr, "bench: measuring memory bandwidth and FMA peak...\n");
  const double bandwidth = measure_host_read_bandwidth();
  const double fma_peak = measure_fma_peak();
  std::fprintf(stderr, "bench: warm-up...\n");
  run_batch(session, 1, 16, 4, 1);
  std::fprintf(stderr, "bench: batch 1...\n");
  const DecodeRun single = run_batch(session, 1, options.prompt_tokens, options.gen_tokens, 7);
  std::fprintf(stderr, "bench: batch %d...\n", options.batch);
  const DecodeRun batched = run_batch(session, options.batch, options.prompt_tokens, options.gen_tokens, 11);

  // The bound of a step is the slower of two limits: the bytes it must read (every weight once,
  // plus each sequence's f32 KV at its mean length over the run) at the measured bandwidth, and
  // its matmul FLOPs (2 per weight per token) at the measured FMA peak.
  const double weight_bytes = double(session.model->weight_bytes());
  const double matmul_weights = double(c.num_layers) * double(c.hidden_size) *
                                    double(2 * c.q_dim() + 2 * c.kv_dim() + 3 * c.intermediate_size) +
                                double(c.vocab_size) * c.hidden_size;
  const double kv_bytes_per_token = double(c.num_layers) * 2 * c.kv_dim() * sizeof(float);
  const double avg_context = options.prompt_tokens + options.gen_tokens / 2.0;
  auto step_bound_seconds = [&](double tokens, double kv_tokens) {
    return std::max((weight_bytes + kv_tokens * kv_bytes_per_token) / bandwidth, 2 * matmul_weights * tokens / fma_peak);
  };
  auto decode_bound = [&](int batch) { return batch / step_bound_seconds(batch, batch * avg_context); };
  const double prefill_bound = options.prompt_tokens / step_bound_seconds(options.prompt_tokens, options.prompt_tokens);
  const double prefill_tps = options.prompt_tokens / single.prefill_seconds;
  const double single_tps = single.decode_tokens / single.decode_seconds;
  const double batched_tps = batched.decode_tokens / batched.decode_seconds;

  std::printf("pagoda bench generate: %s, %d threads, %s\n", cpu_name().c_str(), omp_get_max_threads(),
              session.checkpoint.path().c_str());
  std::printf("weights %.1f MB (%s); measured read bandwidth %.1f GB/s, f32 FMA peak %.1f GFLOP/s\n",
              weight_bytes / 1e6, std::string(dtype_name(session.model->weight_dtype())).c_str(), bandwidth / 1e9, fma_peak / 1e9);
  std::printf("%-26s %10s %12s %9s\n", "", "tok/s", "bound tok/s", "of bound");
  auto row = [](const std::string& name, double tps, double bound) {
    std::printf("%-26s %10.1f %12.1f %8.0f%%\n", name.c_str(), tps, bound, 100 * tps / bound);
  };
  row("prefill (" + std::to_string(options.prompt_tokens) + " tokens)", prefill_tps, prefill_bound);
  row("decode, batch 1", single_tps, decode_bound(1));
  row("decode, batch " + std::to_string(options.batch), batched_tps, decode_bound(options.batch));

  if (!options.json_path.empty()) {
    nlohmann::json j = {
        {"benchmark", "generate"},
        {"command", "pagoda bench generate --prompt-tokens " + std::to_string(options.prompt_tokens) +
                        " --gen-tokens " + std::to_string(options.gen_tokens) + " --batch " +
                        std::to_string(options.batch) + " --weight-dtype " + std::string(dtype_name(session.model->weight_dtype()))},
        {"commit", git_commit()},
        {"device", cpu_name()},
        {"threads", omp_get_max_threads()},
        {"model", session.checkpoint.path()},
        {"weight_dtype", dtype_name(session.model->weight_dtype())},
        {"weight_bytes", weight_bytes},
        {"read_bandwidth_bytes_per_s", bandwidth},
        {"fma_peak_flop_per_s", fma_peak},
        {"prompt_tokens", options.prompt_tokens},
        {"gen_tokens", options.gen_tokens},
        {"prefill_tok_s", prefill_tps},
        {"prefill_bound_tok_s", prefill_bound},
        {"decode_batch1_tok_s", single_tps},
        {"decode_batch1_bound_tok_s", decode_bound(1)},
        {"batch", options.batch},
        {"decode_batched_tok_s", batched_tps},
        {"decode_batched_bound_tok_s", decode_bound(options.batch)},
        {"bound", "per step, the larger of (weight bytes + KV bytes at mean context) / read bandwidth "
                  "and 2 x weights x tokens / FMA peak"},
    };
    write_json_file(options.json_path, j);
    std::fprintf(stderr, "bench: wrote %s\n", options.json_path.c_str());
  }
}

}  // namespace pagoda::bench

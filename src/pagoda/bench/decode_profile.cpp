// pagoda bench profile: where the time of a decode step goes.
//
// B sequences of --context prompt tokens are prefilled, then decode steps of all B run (greedy,
// one token each), in two ways:
// - as the engine runs them (padded to the CUDA graph sizes, replayed as graphs on the GPU), timed
//   as whole steps: device time by CUDA events around each step, and wall time on the host
//   (planning, upload, launch, sampling and the token download included);
// - profiled: the same padded steps run eagerly through ProfilingBackend, which brackets every op
//   with CUDA events (the wall clock on the CPU). An op's time is from its first kernel's start to
//   its last one's end; the time between one op's end and the next one's start is the GPU idling
//   (launch gaps: the host issuing slower than the GPU runs). The median of --profile-steps steps.
// Each op's bound is its own: the bytes it must move over the streaming-read bandwidth measured in
// the same run, or its FLOPs over the measured tensor-core peak (mma.sync f16, fp32 accumulate),
// whichever is longer; the CPU has no FLOP peak probe, so its ops are bounded by bytes only.
// Sum of ops + gaps (the eager step) against the graph-replayed step shows what graphs save and
// what remains between the ops.
#include "pagoda/bench/decode_profile.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/bench/bench_report.h"
#include "pagoda/bench/host_support.h"
#include "pagoda/bench/profiling_backend.h"
#include "pagoda/core/default_model.h"
#include "pagoda/core/error.h"
#include "pagoda/model/model.h"

#if PAGODA_HAVE_CUDA
#include "pagoda/bench/cuda_support.h"
#endif

namespace pagoda::bench {
namespace {

using nlohmann::json;
constexpr int32_t kBlockSize = 16;
constexpr int kWarmupSteps = 3;          // per batch: graph capture, GEMM selection
constexpr int64_t kPrefillRowsPerRun = 8192;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct OpSummary {
  std::string name;
  int calls = 0;
  double time_us = 0;  // per step, all calls
  double host_us = 0;  // per step, all calls
  double bytes = 0;
  double flops = 0;
  double bound_us = 0;
  std::string bound_kind;  // "bytes" or "FLOPs"
};

struct BatchProfile {
  int batch = 0;
  int padded_rows = 0;
  double mean_context = 0;  // KV tokens of a sequence at the profiled steps
  std::vector<OpSummary> ops;
  double gaps_us = 0;          // GPU idle between ops, per eager step
  double eager_step_us = 0;    // first op's start to last op's end
  double host_issue_us = 0;    // host time inside the op calls, per step
  double graph_step_us = 0;    // device time of a real (graph-replayed) step
  double graph_wall_us = 0;    // host wall time of a real step
  double planning_us = 0;      // host planning per real step (Model::step_planning_seconds)
  double ops_bound_us = 0;     // sum of the ops' bounds
  double bytes_bound_us = 0;   // every op's bytes over the bandwidth
};

DType weight_dtype_of(const std::string& name, const Checkpoint& checkpoint) {
  if (name == "f32") return DType::kF32;
  if (name == "f16") return DType::kF16;
  if (name == "bf16") return DType::kBF16;
  if (name == "auto")
    return checkpoint.get("model.embed_tokens.weight").type == GgmlType::kBF16 ? DType::kBF16 : DType::kF16;
  fail(ErrorKind::kInvalidArgument, "bench profile: --weight-dtype must be auto, f16, bf16 or f32, not '{}'", name);
}

std::string device_name_of(const Backend& backend) {
#if PAGODA_HAVE_CUDA
  if (backend.device() == Device::kCuda) return describe_current_device().name;
#endif
  (void)backend;
  return cpu_name();
}

std::string fmt_bytes(double b) {
  if (b >= 1e9) return fmt::format("{:.2f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.2f} MB", b / 1e6);
  return fmt::format("{:.1f} KB", b / 1e3);
}

// The markdown table of one batch (also printed).
std::string batch_table(const BatchProfile& p) {
  std::string t = fmt::format(
      "### batch {} (padded to {} rows), mean context {:.0f}\n\n"
      "| op | calls | ms/step | % of eager step | host us/call | bytes | GFLOP | bound | bound ms | of bound |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |\n",
      p.batch, p.padded_rows, p.mean_context);
  for (const OpSummary& o : p.ops) {
    t += fmt::format("| {} | {} | {:.3f} | {:.1f}% | {:.1f} | {} | {:.2f} | {} | {:.3f} | {:.1f}% |\n", o.name, o.calls,
                     o.time_us / 1e3, 100 * o.time_us / p.eager_step_us, o.host_us / o.calls, fmt_bytes(o.bytes),
                     o.flops / 1e9, o.bound_kind, o.bound_us / 1e3, o.time_us > 0 ? 100 * o.bound_us / o.time_us : 0);
  }
  t += fmt::format("| gaps between ops (device idle) | | {:.3f} | {:.1f}% | | | | | | |\n", p.gaps_us / 1e3,
                   100 * p.gaps_us / p.eager_step_us);
  t += fmt::format("| **eager step**: ops + gaps | | **{:.3f}** | 100% | {:.1f} (all calls) | | | sum of op bounds | {:.3f} | {:.1f}% |\n",
                   p.eager_step_us / 1e3, p.host_issue_us, p.ops_bound_us / 1e3, 100 * p.ops_bound_us / p.eager_step_us);
  t += fmt::format("| **real step** (graph-replayed on a GPU), device time | | **{:.3f}** | {:.1f}% | | | | sum of op bounds | {:.3f} | {:.1f}% |\n",
                   p.graph_step_us / 1e3, 100 * p.graph_step_us / p.eager_step_us, p.ops_bound_us / 1e3,
                   100 * p.ops_bound_us / p.graph_step_us);
  t += fmt::format("| real step, host wall time | | {:.3f} | | planning {:.1f} | | | all bytes / bandwidth | {:.3f} | {:.1f}% |\n\n",
                   p.graph_wall_us / 1e3, p.planning_us, p.bytes_bound_us / 1e3, 100 * p.bytes_bound_us / p.graph_wall_us);
  return t;
}

json batch_json(const BatchProfile& p) {
  json ops = json::array();
  for (const OpSummary& o : p.ops)
    ops.push_back({{"op", o.name}, {"calls", o.calls}, {"time_us", o.time_us}, {"host_us", o.host_us},
                   {"bytes", o.bytes}, {"flops", o.flops}, {"bound_us", o.bound_us}, {"bound", o.bound_kind},
                   {"fraction_of_bound", o.time_us > 0 ? o.bound_us / o.time_us : 0}});
  return {{"batch", p.batch},
          {"padded_rows", p.padded_rows},
          {"mean_context", p.mean_context},
          {"ops", ops},
          {"gaps_us", p.gaps_us},
          {"eager_step_us", p.eager_step_us},
          {"host_issue_us", p.host_issue_us},
          {"graph_step_us", p.graph_step_us},
          {"graph_wall_us", p.graph_wall_us},
          {"planning_us", p.planning_us},
          {"ops_bound_us", p.ops_bound_us},
          {"bytes_bound_us", p.bytes_bound_us}};
}

}  // namespace

void run_profile_bench(const ProfileBenchOptions& f) {
  if (f.batches.empty()) fail(ErrorKind::kInvalidArgument, "bench profile: --batches needs at least one batch size");
  for (int b : f.batches)
    if (b < 1 || b > 4096) fail(ErrorKind::kInvalidArgument, "bench profile: --batches must be in [1, 4096], not {}", b);
  if (f.context < 1 || f.steps < 1 || f.steps > 10000 || f.profile_steps < 1 || f.profile_steps > 1000)
    fail(ErrorKind::kInvalidArgument, "bench profile: --context >= 1, --steps in [1, 10000], --profile-steps in [1, 1000]");
  if (f.model.threads < 0 || f.model.threads > 1024) fail(ErrorKind::kInvalidArgument, "--threads must be in [0, 1024]");
  if (f.model.threads > 0) omp_set_num_threads(f.model.threads);

  const Checkpoint checkpoint = Checkpoint::open(f.model.path.empty() ? default_model_path() : f.model.path);
  const ModelConfig& c = checkpoint.config();
  const int steps_per_batch = kWarmupSteps + f.steps + f.profile_steps;
  const int growth = int(f.batches.size()) * steps_per_batch;
  if (int64_t(f.context) + growth + 1 > c.max_context)
    fail(ErrorKind::kInvalidArgument, "bench profile: --context {} + {} decode steps exceed the model's context of {}",
         f.context, growth, c.max_context);
  const DType dtype = weight_dtype_of(f.model.weight_dtype, checkpoint);
  std::unique_ptr<Backend> inner = make_backend(f.model.backend, dtype, !f.model.enforce_eager);
  const std::string device = device_name_of(*inner);

  std::fprintf(stderr, "bench: measuring the streaming-read bandwidth...\n");
  double bandwidth = 0, peak_flops = 0;
  std::string probes;
#if PAGODA_HAVE_CUDA
  if (inner->device() == Device::kCuda) {
    bandwidth = measure_stream_read_bandwidth();
    peak_flops = measure_mma_peak_flops();
    probes = "measure_stream_read_bandwidth, measure_mma_peak_flops (mma.sync f16, fp32 accumulate)";
  }
#endif
  if (bandwidth == 0) {
    bandwidth = measure_host_read_bandwidth();
    probes = "measure_host_read_bandwidth (no FLOP peak: ops bounded by bytes)";
  }

  const size_t max_ops = size_t(16 * c.num_layers + 16);
  const size_t clock_marks = std::max(2 * max_ops, size_t(2 * f.steps)) + 2;
  ProfilingBackend backend(*inner, c, make_backend_clock(*inner, clock_marks), max_ops);
  Model model(checkpoint, backend, LoadOptions{.weight_dtype = dtype, .attention = LoadOptions::Attention::kPaged});

  const int max_batch = *std::max_element(f.batches.begin(), f.batches.end());
  const int blocks_per_seq = (f.context + growth + 1 + kBlockSize - 1) / kBlockSize;
  model.allocate_kv_cache(max_batch * blocks_per_seq, kBlockSize);
  const int seqs_per_run = std::max<int>(1, int(kPrefillRowsPerRun / f.context));
  model.reserve(std::max<int64_t>(int64_t(std::min(seqs_per_run, max_batch)) * f.context, max_batch), max_batch);

  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(max_batch));
  for (int s = 0; s < max_batch; ++s)
    for (int b = 0; b < blocks_per_seq; ++b) tables[size_t(s)].push_back(s * blocks_per_seq + b);
  std::mt19937 rng(0);
  std::uniform_int_distribution<int32_t> token_id(0, c.vocab_size - 1);
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(max_batch));
  for (auto& p : prompts)
    for (int i = 0; i < f.context; ++i) p.push_back(token_id(rng));

  std::fprintf(stderr, "bench: prefilling %d sequences of %d tokens...\n", max_batch, f.context);
  for (int first = 0; first < max_batch; first += seqs_per_run) {
    std::vector<SequenceChunk> chunks;
    for (int s = first; s < std::min(max_batch, first + seqs_per_run); ++s)
      chunks.push_back({.tokens = prompts[size_t(s)], .start_pos = 0, .block_ids = tables[size_t(s)], .want_logits = true});
    model.run(chunks);
  }
  std::vector<int32_t> length(static_cast<size_t>(max_batch), f.context), token(static_cast<size_t>(max_batch));
  for (int s = 0; s < max_batch; ++s) token[size_t(s)] = token_id(rng);

  // One decode step of the first `batch` sequences, sampled greedily (on the backend when it can).
  const auto decode_step = [&](int batch) {
    std::vector<SequenceChunk> chunks(static_cast<size_t>(batch));
    for (int s = 0; s < batch; ++s)
      chunks[size_t(s)] = {.tokens = std::span<const int32_t>(&token[size_t(s)], 1), .start_pos = length[size_t(s)],
                           .block_ids = tables[size_t(s)], .want_logits = true};
    model.run(chunks);
    std::vector<int32_t> next;
    if (backend.can_sample()) {
      next = model.sample(std::vector<SamplingRow>(size_t(batch)), c.vocab_size);
    } else {
      backend.host_op("sampling (host argmax)", double(batch) * c.vocab_size * 4, [&] {
        const std::span<const float> logits = model.download_logits();
        for (int s = 0; s < batch; ++s) {
          const float* row = logits.data() + size_t(s) * size_t(c.vocab_size);
          next.push_back(int32_t(std::max_element(row, row + c.vocab_size) - row));
        }
      });
    }
    for (int s = 0; s < batch; ++s) {
      ++length[size_t(s)];
      token[size_t(s)] = next[size_t(s)];
    }
  };

  std::vector<BatchProfile> profiles;
  for (const int batch : f.batches) {
    std::fprintf(stderr, "bench: batch %d...\n", batch);
    BatchProfile p;
    p.batch = batch;
    p.padded_rows = std::max(batch, backend.graph_rows(batch));
    for (int i = 0; i < kWarmupSteps; ++i) decode_step(batch);

    // Real steps: graphs replayed, each bracketed by two device timestamps and the host clock.
    const double planning_before = model.step_planning_seconds();
    std::vector<double> wall_us;
    for (int i = 0; i < f.steps; ++i) {
      const auto start = std::chrono::steady_clock::now();
      backend.clock().mark(size_t(2 * i));
      decode_step(batch);
      backend.clock().mark(size_t(2 * i + 1));
      wall_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    }
    const std::vector<double> marks = backend.clock().read(size_t(2 * f.steps));
    std::vector<double> device_us;
    for (int i = 0; i < f.steps; ++i) device_us.push_back(marks[size_t(2 * i + 1)] - marks[size_t(2 * i)]);
    p.graph_step_us = median(device_us);
    p.graph_wall_us = median(wall_us);
    p.planning_us = 1e6 * (model.step_planning_seconds() - planning_before) / f.steps;

    for (int s = 0; s < batch; ++s) p.mean_context += double(length[size_t(s)]) / batch;
    // Profiled steps: per op name, the per-step sums; then their medians.
    std::map<std::string, std::vector<double>> time_of, host_of;
    std::map<std::string, OpSummary> first_seen;
    std::vector<std::string> order;
    std::vector<double> gaps, spans, issue;
    for (int i = 0; i < f.profile_steps; ++i) {
      backend.set_profiling(true);
      decode_step(batch);
      const std::vector<double> ts = backend.op_timestamps();
      const std::vector<OpRecord> ops = backend.ops();
      backend.set_profiling(false);
      std::map<std::string, double> t, h;
      double gap = 0, host = 0;
      for (size_t k = 0; k < ops.size(); ++k) {
        t[ops[k].name] += ts[2 * k + 1] - ts[2 * k];
        h[ops[k].name] += ops[k].host_us;
        host += ops[k].host_us;
        if (k > 0) gap += std::max(0.0, ts[2 * k] - ts[2 * k - 1]);
        if (i == 0) {
          auto [it, added] = first_seen.try_emplace(ops[k].name, OpSummary{.name = ops[k].name});
          if (added) order.push_back(ops[k].name);
          ++it->second.calls;
          it->second.bytes += ops[k].bytes;
          it->second.flops += ops[k].flops;
        }
      }
      for (auto& [name, v] : t) time_of[name].push_back(v);
      for (auto& [name, v] : h) host_of[name].push_back(v);
      gaps.push_back(gap);
      spans.push_back(ts.empty() ? 0 : ts.back());
      issue.push_back(host);
    }
    p.gaps_us = median(gaps);
    p.eager_step_us = median(spans);
    p.host_issue_us = median(issue);
    for (const std::string& name : order) {
      OpSummary o = first_seen[name];
      o.time_us = median(time_of[name]);
      o.host_us = median(host_of[name]);
      const double bytes_us = 1e6 * o.bytes / bandwidth;
      const double flops_us = peak_flops > 0 ? 1e6 * o.flops / peak_flops : 0;
      o.bound_us = std::max(bytes_us, flops_us);
      o.bound_kind = flops_us > bytes_us ? "FLOPs" : "bytes";
      p.ops_bound_us += o.bound_us;
      p.bytes_bound_us += bytes_us;
      p.ops.push_back(o);
    }
    std::sort(p.ops.begin(), p.ops.end(), [](const OpSummary& a, const OpSummary& b) { return a.time_us > b.time_us; });
    profiles.push_back(std::move(p));
  }

  const std::string command = fmt::format(
      "pagoda bench profile -m {} --backend {} --weight-dtype {} --batches {} --context {} --steps {} --profile-steps {}{}",
      checkpoint.path(), f.model.backend, f.model.weight_dtype, fmt::join(f.batches, ","), f.context, f.steps,
      f.profile_steps, f.model.enforce_eager ? " --enforce-eager" : "");
  std::string md = fmt::format(
      "## Decode step profile: {}\n\n`{}` (commit {})\n\n"
      "{} backend on {}; {} {} layers, hidden {}, {}/{} heads x {}, ffn {}, vocab {}, weights {}. "
      "Read bandwidth {:.1f} GB/s{}, measured in the same run ({}). Times are medians; an op's bound is its bytes / "
      "bandwidth or its FLOPs / peak, whichever is longer; \"of bound\" = bound / time.\n\n",
      c.architecture, command, git_commit(), backend.name(), device, checkpoint.path(), c.num_layers, c.hidden_size,
      c.num_q_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.vocab_size, dtype_name(dtype),
      bandwidth / 1e9, peak_flops > 0 ? fmt::format(", tensor-core peak {:.0f} TFLOP/s", peak_flops / 1e12) : "",
      probes);
  for (const BatchProfile& p : profiles) md += batch_table(p);
  std::fputs(md.c_str(), stdout);

  if (!f.markdown_path.empty()) {
    FILE* out = std::fopen(f.markdown_path.c_str(), "w");
    if (!out || std::fputs(md.c_str(), out) < 0 || std::fclose(out) != 0)
      fail(ErrorKind::kInternal, "cannot write '{}'", f.markdown_path);
  }
  if (!f.json_path.empty()) {
    json batches = json::array();
    for (const BatchProfile& p : profiles) batches.push_back(batch_json(p));
    write_json_file(f.json_path,
                    {{"benchmark", "decode_profile"},
                     {"command", command},
                     {"commit", git_commit()},
                     {"device", device},
                     {"backend", backend.name()},
                     {"model", checkpoint.path()},
                     {"model_shape",
                      {{"architecture", c.architecture}, {"layers", c.num_layers}, {"hidden", c.hidden_size},
                       {"q_heads", c.num_q_heads}, {"kv_heads", c.num_kv_heads}, {"head_dim", c.head_dim},
                       {"intermediate", c.intermediate_size}, {"vocab", c.vocab_size}}},
                     {"weight_dtype", dtype_name(dtype)},
                     {"read_bandwidth_bytes_per_s", bandwidth},
                     {"peak_flops", peak_flops},
                     {"probes", probes},
                     {"bound", "per op: max(bytes / read bandwidth, FLOPs / tensor-core peak) (bytes only on the CPU); "
                               "fraction_of_bound = bound_us / time_us"},
                     {"batches", batches}});
    std::fprintf(stderr, "bench: wrote %s\n", f.json_path.c_str());
  }
}

}  // namespace pagoda::bench

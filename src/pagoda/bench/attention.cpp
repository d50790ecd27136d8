// pagoda bench attention: GPU decode attention (backend/cuda/decode_attention.h) over a sweep of
// batch x context x head shapes, every figure next to its bound. Decode attention must read each
// sequence's K and V once (plus q and out), so unique bytes / the device's streaming-read
// bandwidth, measured in the same run, is the fastest a step can be; "frac" is how close a kernel
// comes. Each config runs the production (group-tiled) kernel and the per-head decode kernel as
// the baseline (the latter only up to batch x context = 64 x 8192 unless --baseline-all), each
// with and without the L2 prefetch, so the prefetch claim of "Accelerating LLM Inference
// Throughput via Asynchronous KV Cache Prefetching" (arXiv:2504.06319) is measured on both.
//
// Pages are scattered as in a real paged cache (block ids are a random permutation of the pool),
// inputs are random, L2 is flushed before every timed run, and the median of --runs is reported.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/attention/plan.h"
#include "pagoda/bench/attention.h"
#include "pagoda/core/error.h"

#if PAGODA_HAVE_CUDA
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <type_traits>

#include "pagoda/attention/decode_batch.h"
#include "pagoda/bench/cuda_support.h"
#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/decode_attention.h"
#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/bench/bench_report.h"
#include "pagoda/bench/head_spec.h"
#include "pagoda/bench/per_head_decode.h"
#include "pagoda/core/paged_kv.h"
#endif

namespace pagoda::bench {
namespace {

#if PAGODA_HAVE_CUDA

// The baseline kernels take one CTA per (sequence, query head) and are slow at large sizes: by
// default they run only up to this many KV tokens per step (--baseline-all lifts it).
constexpr int64_t kBaselineMaxTokens = int64_t(64) * 8192;
constexpr uint64_t kSeed = 20240531;

// The kernel a variant times: the backend's group-tiled kernel or the per-head decode kernel.
enum class DecodeKernel : uint8_t { kGroupTiled, kPerHead };

cuda::DecodeLauncher launcher(DecodeKernel kernel) {
  return kernel == DecodeKernel::kGroupTiled ? cuda::launch_decode_tiled : launch_per_head_decode;
}

struct Variant {
  std::string name;
  DecodeKernel kernel;
  bool prefetch;     // L2 prefetch of upcoming blocks
  bool evict_first;  // KV loads marked evict_first
};

struct Config {
  int32_t batch;
  int32_t context;
  HeadSpec heads;
  std::string name;  // what --filter matches, e.g. "b64-c8192-h32/8"
};

struct Timing {
  double median_us, min_us, max_us, gbps, frac;
};

struct VariantResult {
  std::optional<Timing> timing;
  std::string skipped;  // why there is no timing
};

struct ConfigResult {
  Config config;
  std::string skipped;  // the whole config did not run, and why
  int64_t kv_bytes = 0;
  int64_t bytes = 0;  // kv_bytes + q + out
  int64_t pool_bytes = 0;
  size_t num_items = 0;
  bool split = false;
  int32_t kv_tokens_per_item = 0;
  int32_t num_partials = 0;
  std::vector<VariantResult> variants;  // in the order of the variants run
};

std::string join(const auto& values) {
  std::string s;
  for (const auto& v : values) {
    if (!s.empty()) s += ',';
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>) {
      s += v;
    } else {
      s += std::to_string(v);
    }
  }
  return s;
}

Variant parse_variant(const std::string& name) {
  // tiled: the engine's default (DecodeOptions{}): evict_first hints, no L2 prefetch, which this
  // kernel does not gain from (docs/experiments/decode-attention.md). baseline: the per-head
  // kernel as the paper starts from it, neither. *_prefetch: the paper's technique, both.
  if (name == "tiled") return {name, DecodeKernel::kGroupTiled, false, true};
  if (name == "tiled_prefetch") return {name, DecodeKernel::kGroupTiled, true, true};
  if (name == "baseline") return {name, DecodeKernel::kPerHead, false, false};
  if (name == "baseline_prefetch") return {name, DecodeKernel::kPerHead, true, true};
  fail(ErrorKind::kInvalidArgument,
       "--variants: unknown variant '{}' (tiled, tiled_prefetch, baseline, baseline_prefetch)", name);
}

DType parse_dtype(const std::string& name) {
  if (name == "fp16" || name == "f16") return DType::kF16;
  if (name == "bf16") return DType::kBF16;
  fail(ErrorKind::kInvalidArgument, "--dtype: '{}' is not fp16 or bf16", name);
}

KvLayout parse_layout(const std::string& name) {
  if (name == "hnd") return KvLayout::kHnd;
  if (name == "nhd") return KvLayout::kNhd;
  fail(ErrorKind::kInvalidArgument, "--layout: '{}' is not hnd or nhd", name);
}

void check_positive_list(const std::vector<int>& values, const char* flag) {
  if (values.empty()) fail(ErrorKind::kInvalidArgument, "{}: give at least one value", flag);
  for (int v : values)
    if (v < 1) fail(ErrorKind::kInvalidArgument, "{}: {} is not a positive number", flag, v);
}

attention::AttentionShape shape_of(const AttentionBenchOptions& flags, HeadSpec heads) {
  return {.num_q_heads = heads.q_heads,
          .num_kv_heads = heads.kv_heads,
          .head_dim = flags.head_dim,
          .block_size = flags.block_size,
          .softmax_scale = 1.f / std::sqrt(float(flags.head_dim))};
}

// A config's view of the sweep's pool: K at k, V at v.
PagedKv pool_view(const AttentionBenchOptions& flags, DType dtype, KvLayout layout, HeadSpec heads,
                  int32_t num_blocks, void* k, void* v) {
  return make_paged_kv(k, v, dtype, layout, num_blocks, flags.block_size, heads.kv_heads, flags.head_dim,
                       Device::kCuda);
}

int32_t blocks_per_sequence(int32_t context, int32_t block_size) { return (context + block_size - 1) / block_size; }

// The command that runs `flags` again.
std::string command_line(const AttentionBenchOptions& flags, bool max_kv_given) {
  std::string s = fmt::format(
      "pagoda bench attention --batches {} --contexts {} --heads {} --head-dim {} --block-size {} --dtype {} "
      "--layout {} --runs {} --warmup {} --variants {} --prefetch-distance {} --min-split-tokens {}",
      join(flags.batches), join(flags.contexts), join(flags.heads), flags.head_dim, flags.block_size, flags.dtype,
      flags.layout, flags.runs, flags.warmup, join(flags.variants), flags.prefetch_distance, flags.min_split_tokens);
  if (!flags.out.empty()) s += " --out " + flags.out;
  if (!flags.filter.empty()) s += " --filter '" + flags.filter + "'";
  if (max_kv_given) s += fmt::format(" --max-kv-gb {}", flags.max_kv_gb);
  if (flags.baseline_all) s += " --baseline-all";
  return s;
}

// The command that reruns one config alone.
std::string reproduce_command(AttentionBenchOptions flags, const Config& c) {
  flags.batches = {c.batch};
  flags.contexts = {c.context};
  flags.heads = {fmt::format("{}/{}", c.heads.q_heads, c.heads.kv_heads)};
  flags.out.clear();
  flags.filter.clear();
  return command_line(flags, /*max_kv_given=*/false);
}

Timing summarize(std::vector<double> us, int64_t bytes, double bandwidth) {
  std::sort(us.begin(), us.end());
  const size_t n = us.size();
  const double median = n % 2 ? us[n / 2] : (us[n / 2 - 1] + us[n / 2]) / 2;
  const double gbps = double(bytes) / (median * 1e3);
  return {.median_us = median, .min_us = us.front(), .max_us = us.back(), .gbps = gbps, .frac = gbps * 1e9 / bandwidth};
}

// time without prefetch / time with it, where both ran: > 1 means the prefetch helps.
std::optional<double> prefetch_speedup(const ConfigResult& r, const std::vector<Variant>& variants,
                                       DecodeKernel kernel) {
  const Timing* on = nullptr;
  const Timing* off = nullptr;
  for (size_t i = 0; i < variants.size(); ++i) {
    if (variants[i].kernel != kernel || !r.variants[i].timing) continue;
    (variants[i].prefetch ? on : off) = &*r.variants[i].timing;
  }
  if (!on || !off) return std::nullopt;
  return off->median_us / on->median_us;
}

nlohmann::json config_json(const ConfigResult& r, const std::vector<Variant>& variants,
                           const AttentionBenchOptions& flags) {
  const Config& c = r.config;
  nlohmann::json j = {
      {"name", c.name},
      {"batch", c.batch},
      {"context", c.context},
      {"q_heads", c.heads.q_heads},
      {"kv_heads", c.heads.kv_heads},
      {"head_dim", flags.head_dim},
      {"block_size", flags.block_size},
      {"dtype", flags.dtype},
      {"layout", flags.layout},
      {"kv_bytes", r.kv_bytes},
      {"bytes", r.bytes},
      {"command", reproduce_command(flags, c)},
  };
  if (!r.skipped.empty()) {
    j["skipped"] = r.skipped;
    return j;
  }
  j["num_items"] = r.num_items;
  j["split"] = r.split;
  j["kv_tokens_per_item"] = r.kv_tokens_per_item;
  j["num_partials"] = r.num_partials;
  nlohmann::json by_variant = nlohmann::json::object();
  for (size_t i = 0; i < variants.size() && i < r.variants.size(); ++i) {
    const VariantResult& v = r.variants[i];
    if (v.timing) {
      by_variant[variants[i].name] = {{"median_us", v.timing->median_us}, {"min_us", v.timing->min_us},
                                      {"max_us", v.timing->max_us},       {"gbps", v.timing->gbps},
                                      {"frac", v.timing->frac}};
    } else {
      by_variant[variants[i].name] = {{"skipped", v.skipped}};
    }
  }
  j["variants"] = by_variant;
  nlohmann::json speedup = nlohmann::json::object();
  for (auto [name, kernel] : {std::pair{"tiled", DecodeKernel::kGroupTiled},
                              std::pair{"baseline", DecodeKernel::kPerHead}}) {
    const auto s = prefetch_speedup(r, variants, kernel);
    speedup[name] = s ? nlohmann::json(*s) : nlohmann::json(nullptr);
  }
  j["prefetch_speedup"] = speedup;
  return j;
}

// The table printed at the end: per config the production kernel's median and fraction of the
// bound, and the prefetch on/off ratio of both kernels ("-" where a variant did not run).
void print_table(const std::vector<ConfigResult>& results, const std::vector<Variant>& variants) {
  auto find = [&](const ConfigResult& r, const char* name) -> const Timing* {
    for (size_t i = 0; i < variants.size() && i < r.variants.size(); ++i)
      if (variants[i].name == name && r.variants[i].timing) return &*r.variants[i].timing;
    return nullptr;
  };
  auto cell = [](std::optional<double> v, const char* format) {
    if (!v) return std::string("-");
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, format, *v);
    return std::string(buffer);
  };
  std::printf("%6s %8s %6s %10s %11s %6s %9s %11s %9s\n", "batch", "context", "heads", "KV MB", "tiled us", "frac",
              "pf ratio", "base us", "base pf");
  for (const ConfigResult& r : results) {
    const Config& c = r.config;
    const std::string heads = std::to_string(c.heads.q_heads) + "/" + std::to_string(c.heads.kv_heads);
    if (!r.skipped.empty()) {
      std::printf("%6d %8d %6s %10.1f  skipped: %s\n", c.batch, c.context, heads.c_str(), r.kv_bytes / 1e6,
                  r.skipped.c_str());
      continue;
    }
    const Timing* tiled = find(r, "tiled");
    const Timing* base = find(r, "baseline");
    std::printf("%6d %8d %6s %10.1f %11s %6s %9s %11s %9s\n", c.batch, c.context, heads.c_str(), r.kv_bytes / 1e6,
                cell(tiled ? std::optional(tiled->median_us) : std::nullopt, "%.1f").c_str(),
                cell(tiled ? std::optional(tiled->frac) : std::nullopt, "%.2f").c_str(),
                cell(prefetch_speedup(r, variants, DecodeKernel::kGroupTiled), "%.2fx").c_str(),
                cell(base ? std::optional(base->median_us) : std::nullopt, "%.1f").c_str(),
                cell(prefetch_speedup(r, variants, DecodeKernel::kPerHead), "%.2fx").c_str());
  }
  std::printf("frac: achieved GB/s (unique K/V + q + out bytes / median) over the measured streaming-read "
              "bandwidth; pf ratio: median without L2 prefetch / with it (> 1: prefetch helps; for the baseline,\n"
              "'with' also adds evict_first hints)\n");
}

void run_sweep(AttentionBenchOptions flags, bool max_kv_given) {
  // Flags first, before touching the device.
  check_positive_list(flags.batches, "--batches");
  check_positive_list(flags.contexts, "--contexts");
  if (flags.heads.empty()) fail(ErrorKind::kInvalidArgument, "--heads: give at least one q_heads/kv_heads");
  std::vector<HeadSpec> head_specs;
  for (const std::string& spec : flags.heads) head_specs.push_back(parse_heads(spec));
  if (flags.head_dim < 1) fail(ErrorKind::kInvalidArgument, "--head-dim: {} is not a positive number", flags.head_dim);
  if (flags.block_size < 1)
    fail(ErrorKind::kInvalidArgument, "--block-size: {} is not a positive number", flags.block_size);
  const DType dtype = parse_dtype(flags.dtype);
  const KvLayout layout = parse_layout(flags.layout);
  if (flags.runs < 1) fail(ErrorKind::kInvalidArgument, "--runs: at least 1 please (20 or more for a median)");
  if (flags.warmup < 0) fail(ErrorKind::kInvalidArgument, "--warmup: {} is negative", flags.warmup);
  if (flags.prefetch_distance < 0)
    fail(ErrorKind::kInvalidArgument, "--prefetch-distance: {} is negative (0: the tuned default)",
         flags.prefetch_distance);
  if (flags.min_split_tokens < 1)
    fail(ErrorKind::kInvalidArgument, "--min-split-tokens: {} is not a positive token count", flags.min_split_tokens);
  if (flags.max_kv_gb < 0 || !std::isfinite(flags.max_kv_gb))
    fail(ErrorKind::kInvalidArgument, "--max-kv-gb: {} is not a size in GB", flags.max_kv_gb);
  if (flags.variants.empty()) fail(ErrorKind::kInvalidArgument, "--variants: give at least one");
  std::vector<Variant> variants;
  for (const std::string& name : flags.variants) {
    Variant v = parse_variant(name);
    if (std::none_of(variants.begin(), variants.end(), [&](const Variant& w) { return w.name == v.name; }))
      variants.push_back(std::move(v));
  }
  for (int64_t context : flags.contexts)
    for (int64_t batch : flags.batches)
      if (batch * blocks_per_sequence(int32_t(context), flags.block_size) > INT32_MAX)
        fail(ErrorKind::kInvalidArgument, "--batches {} x --contexts {}: more KV blocks than an int32 block id holds",
             batch, context);

  // head_dim, block size, dtype and layout hold for the whole sweep: ask the kernels once, with
  // the plainest heads, and reject the flags if they cannot run at all.
  if (const char* why = cuda::decode_shape_unsupported_reason(shape_of(flags, {1, 1}), dtype))
    fail(ErrorKind::kInvalidArgument, "--head-dim {} --block-size {} --dtype {} --layout {}: {}", flags.head_dim,
         flags.block_size, flags.dtype, flags.layout, why);
  if (!cuda::device_available()) fail(ErrorKind::kUnsupported, "bench attention: no CUDA device");

  std::vector<Config> configs;
  for (HeadSpec h : head_specs)
    for (int batch : flags.batches)
      for (int context : flags.contexts) {
        std::string name = fmt::format("b{}-c{}-h{}/{}", batch, context, h.q_heads, h.kv_heads);
        if (flags.filter.empty() || name.find(flags.filter) != std::string::npos)
          configs.push_back({batch, context, h, std::move(name)});
      }
  if (configs.empty()) fail(ErrorKind::kInvalidArgument, "--filter '{}' matches no config", flags.filter);

  DeviceSummary device = describe_current_device();
  if (flags.out.empty()) flags.out = "bench/results/" + device_slug(device.name) + "/attention.json";
  std::fprintf(stderr, "bench attention: %s, %d SMs, L2 %.1f MB, %.1f of %.1f GB free\n", device.name.c_str(),
               device.sm_count, device.l2_bytes / 1e6, device.free_bytes / 1e9, device.total_bytes / 1e9);
  std::fprintf(stderr, "bench attention: measuring streaming-read bandwidth...\n");
  // Measured before and after the sweep; the bound is the better of the two, so that no figure
  // is flattered by a probe that ran while the clocks were low.
  const double bandwidth_before = measure_stream_read_bandwidth();
  double bandwidth_after = 0;
  double bandwidth = bandwidth_before;
  std::fprintf(stderr, "bench attention: streaming read %.1f GB/s\n", bandwidth / 1e9);

  L2Flusher flusher;
  device = describe_current_device();  // free memory now, with the flush buffer held
  const double cap_bytes = max_kv_given ? flags.max_kv_gb * 1e9 : 0.7 * double(device.free_bytes);
  if (!max_kv_given) flags.max_kv_gb = cap_bytes / 1e9;

  const int64_t elem = int64_t(dtype_size(dtype));
  std::vector<ConfigResult> results;
  results.reserve(configs.size());
  int64_t pool_needed = 0;
  for (const Config& c : configs) {
    ConfigResult r{.config = c};
    const int32_t num_blocks = c.batch * blocks_per_sequence(c.context, flags.block_size);
    r.kv_bytes = int64_t(c.batch) * c.context * c.heads.kv_heads * flags.head_dim * elem * 2;
    r.bytes = r.kv_bytes + 2 * int64_t(c.batch) * c.heads.q_heads * flags.head_dim * elem;
    r.pool_bytes = int64_t(num_blocks) * flags.block_size * c.heads.kv_heads * flags.head_dim * elem * 2;
    if (const char* why = cuda::decode_shape_unsupported_reason(shape_of(flags, c.heads), dtype)) {
      r.skipped = fmt::format("unsupported: {}", why);
    } else if (double(r.pool_bytes) > cap_bytes) {
      r.skipped = fmt::format("KV pool of {:.1f} GB exceeds the {:.1f} GB cap (--max-kv-gb)", r.pool_bytes / 1e9,
                              cap_bytes / 1e9);
    } else {
      pool_needed = std::max(pool_needed, r.pool_bytes);
    }
    results.push_back(std::move(r));
  }

  // One pool for the whole sweep, random once; each config views a prefix of it as its own pool
  // of exactly the blocks it needs (K in the first half of the prefix, V in the second).
  cuda::DeviceArray<uint8_t> pool;
  if (pool_needed > 0) {
    std::fprintf(stderr, "bench attention: filling a %.1f GB KV pool...\n", pool_needed / 1e9);
    pool.resize(size_t(pool_needed));
    fill_uniform(pool.data(), size_t(pool_needed / elem), dtype, kSeed);
    cuda::check_cuda(cudaDeviceSynchronize(), "fill_uniform");
  }

  const std::string commit = git_commit();
  auto write_results = [&](const std::string& incomplete) {
    nlohmann::json j = {
        {"benchmark", "attention"},
        {"device", device.name},
        {"compute_capability", std::to_string(device.cc_major) + "." + std::to_string(device.cc_minor)},
        {"sm_count", device.sm_count},
        {"l2_bytes", device.l2_bytes},
        {"memory_bytes", device.total_bytes},
        {"stream_read_gbps", bandwidth / 1e9},
        {"stream_read_gbps_before_after", {bandwidth_before / 1e9, bandwidth_after / 1e9}},
        {"bound", "unique bytes (every K and V element of the batch once, q, out) / stream_read_gbps, the "
                  "better of the probes before and after the sweep; frac = achieved GB/s / stream_read_gbps"},
        {"timing", fmt::format("CUDA events, {} warm-up runs, median of {} runs, L2 flushed ({} MB read) "
                               "before each run, behind a 200 us GPU sleep so launches never wait on the host",
                               flags.warmup, flags.runs, flusher.bytes() / 1000000)},
        {"commit", commit},
        {"command", command_line(flags, max_kv_given)},
        {"options",
         {{"batches", flags.batches},
          {"contexts", flags.contexts},
          {"heads", flags.heads},
          {"head_dim", flags.head_dim},
          {"block_size", flags.block_size},
          {"dtype", flags.dtype},
          {"layout", flags.layout},
          {"runs", flags.runs},
          {"warmup", flags.warmup},
          {"variants", flags.variants},
          {"prefetch_distance", flags.prefetch_distance},
          {"min_split_tokens", flags.min_split_tokens},
          {"filter", flags.filter},
          {"baseline_all", flags.baseline_all},
          {"max_kv_gb", flags.max_kv_gb},
          {"max_kv_gb_from", max_kv_given ? "flag" : "70% of free device memory"}}},
    };
    nlohmann::json list = nlohmann::json::array();
    for (const ConfigResult& r : results)
      if (!r.skipped.empty() || !r.variants.empty()) list.push_back(config_json(r, variants, flags));
    j["configs"] = list;
    if (!incomplete.empty()) j["incomplete"] = incomplete;
    write_json_file(flags.out, j);
    std::fprintf(stderr, "bench attention: wrote %s\n", flags.out.c_str());
  };

  cuda::DecodeWorkspace workspace;
  cuda::DeviceArray<uint16_t> q, out;
  EventTimings timings(flags.runs);
  const cudaStream_t stream = nullptr;
  try {
    for (size_t k = 0; k < results.size(); ++k) {
      ConfigResult& r = results[k];
      const Config& c = r.config;
      if (!r.skipped.empty()) {
        std::fprintf(stderr, "[%zu/%zu] %s: skipped (%s)\n", k + 1, results.size(), c.name.c_str(), r.skipped.c_str());
        continue;
      }
      // The batch: every sequence `context` tokens long, its blocks drawn from a random
      // permutation of the pool (fixed seed), so consecutive pages of a sequence are far apart.
      const int32_t per_seq = blocks_per_sequence(c.context, flags.block_size);
      const int32_t num_blocks = c.batch * per_seq;
      std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), std::mt19937_64(kSeed + k));
      attention::DecodeBatch batch;
      for (int32_t s = 0; s < c.batch; ++s)
        batch.add_sequence(std::span(ids).subspan(size_t(s) * size_t(per_seq), size_t(per_seq)), c.context);

      const attention::AttentionShape shape = shape_of(flags, c.heads);
      const int64_t pool_half = r.pool_bytes / 2;
      const PagedKv kv = pool_view(flags, dtype, layout, c.heads, num_blocks, pool.data(), pool.data() + pool_half);
      const attention::DecodePlan plan =
          attention::plan_decode(batch, shape, cuda::decode_device_info(shape, dtype),
                                 attention::PlanOptions{.min_kv_tokens_per_item = flags.min_split_tokens});
      r.num_items = plan.items.size();
      r.split = !plan.merges.empty();
      r.kv_tokens_per_item = plan.kv_tokens_per_item;
      r.num_partials = plan.num_partials;
      workspace.upload(plan, batch, shape, stream);
      const size_t q_elements = size_t(c.batch) * size_t(c.heads.q_heads) * size_t(flags.head_dim);
      q.resize(q_elements);
      out.resize(q_elements);
      fill_uniform(q.data(), q_elements, dtype, kSeed ^ (k + 1), stream);

      std::string line = fmt::format("[{}/{}] {}: KV {:.1f} MB, {} items{}", k + 1, results.size(), c.name,
                                     r.kv_bytes / 1e6, r.num_items,
                                     r.split ? fmt::format(" (split, {} tokens each)", r.kv_tokens_per_item) : "");
      for (const Variant& variant : variants) {
        VariantResult& vr = r.variants.emplace_back();
        if (variant.kernel == DecodeKernel::kPerHead && !flags.baseline_all &&
            int64_t(c.batch) * c.context > kBaselineMaxTokens) {
          vr.skipped = fmt::format("batch x context > {} (the baseline is slow there; --baseline-all runs it)",
                                   kBaselineMaxTokens);
          continue;
        }
        const cuda::DecodeOptions options{.launch = launcher(variant.kernel),
                                          .l2_prefetch = variant.prefetch,
                                          .evict_first = variant.evict_first,
                                          .prefetch_distance = flags.prefetch_distance};
        // Unsupported configs were skipped above, so any error here is real and ends the sweep.
        for (int w = 0; w < flags.warmup; ++w)
          cuda::decode_attention(workspace, shape, kv, q.data(), out.data(), nullptr, options, stream);
        // Everything is queued before the first wait; the 200 µs GPU sleep and the flush keep the
        // GPU busy while the host queues the run, so launch overhead stays outside the events.
        for (int run = 0; run < flags.runs; ++run) {
          gpu_sleep(200, stream);
          flusher.flush(stream);
          timings.start(run, stream);
          cuda::decode_attention(workspace, shape, kv, q.data(), out.data(), nullptr, options, stream);
          timings.stop(run, stream);
        }
        cuda::check_cuda(cudaGetLastError(), "decode_attention");
        vr.timing = summarize(timings.elapsed_us(), r.bytes, bandwidth);
        line += fmt::format(", {} {:.1f} us ({:.0f}%)", variant.name, vr.timing->median_us, 100 * vr.timing->frac);
      }
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  } catch (const std::exception& e) {
    // Keep what was measured: a sweep that dies at config 40 of 96 still reports 39.
    std::fprintf(stderr, "bench attention: stopped by an error; writing the configs done so far\n");
    try {
      write_results(e.what());
    } catch (const std::exception& write_error) {
      std::fprintf(stderr, "bench attention: %s\n", write_error.what());
    }
    throw;
  }

  bandwidth_after = measure_stream_read_bandwidth();
  std::fprintf(stderr, "bench attention: streaming read after the sweep %.1f GB/s\n", bandwidth_after / 1e9);
  if (bandwidth_after > bandwidth) {
    bandwidth = bandwidth_after;
    for (ConfigResult& r : results) {
      for (VariantResult& v : r.variants) {
        if (v.timing) v.timing->frac = v.timing->gbps * 1e9 / bandwidth;
      }
    }
  }
  std::printf("pagoda bench attention: %s (%d SMs, L2 %.0f MB), %s %s, head_dim %d, block %d; streaming read "
              "%.1f GB/s (the bound)\n",
              device.name.c_str(), device.sm_count, device.l2_bytes / 1e6, flags.dtype.c_str(), flags.layout.c_str(),
              flags.head_dim, flags.block_size, bandwidth / 1e9);
  print_table(results, variants);
  write_results("");
}

#endif  // PAGODA_HAVE_CUDA

}  // namespace

void run_attention_bench(const AttentionBenchOptions& options) {
  if (options.kv_cache_dtypes != std::vector<std::string>{"f16"}) return run_attention_kv_dtype_bench(options);
#if PAGODA_HAVE_CUDA
  run_sweep(options, options.max_kv_given);
#else
  (void)options;
  fail(ErrorKind::kUnsupported,
       "bench attention: this pagoda was built without CUDA (configure with nvcc on the PATH or -DPAGODA_CUDA=ON)");
#endif
}

}  // namespace pagoda::bench

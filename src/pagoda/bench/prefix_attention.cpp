// pagoda bench prefix-attention: prefix-aware decode attention (attention/prefix_plan.h,
// backend/cuda/prefix_attention.h) on synthetic prefix-tree batches (bench/workloads/README.md
// notation), every figure next to its bound, with the paged decode kernel (the group-tiled
// kernel of backend/cuda/decode_attention.h) on the same batch in the same run.
//
// The bound of a batch is max(unique KV bytes / streaming-read bandwidth, attention FLOPs /
// mma.sync peak), both measured by this binary in this run: unique KV is what a perfect kernel
// reads (every shared block once), and heavy GQA groups over long shared prefixes can make the
// tensor cores the limit instead. "frac" is unique KV bytes / time / bandwidth (PAT's measure,
// bench/workloads/pat_reference.md); "of bound" is the bound / time. The planner's own cost is timed on the host:
// planning from scratch, reusing an unchanged plan, updating it after every sequence grew, and
// (with the CUDA backend built) the kernel's work items and their schedule over the workers, which
// the backend makes from a plan at every step.
// Each head shape's launch floor (both kernels on one sequence of one block) is timed alike and
// recorded with every batch: the fixed cost of a launch here, a large share of a small batch.
// --plan-only prints the planning figures without a GPU.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/attention/decode_batch.h"
#include "pagoda/attention/plan.h"
#include "pagoda/attention/prefix_plan.h"
#include "pagoda/bench/tree_batch.h"
#include "pagoda/backend/cuda/kernels/prefix_params.h"
#include "pagoda/bench/bench_report.h"
#include "pagoda/bench/head_spec.h"
#include "pagoda/bench/prefix_attention.h"
#include "pagoda/core/error.h"
#include "pagoda/core/half.h"

#if PAGODA_HAVE_CUDA
#include "pagoda/bench/cuda_support.h"
#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/decode_attention.h"
#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/backend/cuda/prefix_attention.h"
#endif

namespace pagoda::bench {
namespace {

constexpr uint64_t kSeed = 20261123;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// Median host time of fn() over `runs` calls, in microseconds, after 2 ms of untimed calls: the
// engine plans every step, so the planner runs warm (caches, clock); a first call after the GPU
// runs is not what a step costs.
template <typename Fn>
double host_us(int runs, Fn&& fn) {
  const auto warm_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
  while (std::chrono::steady_clock::now() < warm_until) fn();
  std::vector<double> us;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  return median(us);
}

// One decode step later: every sequence one token longer, a fresh block where its last one is full.
attention::DecodeBatch grown(const attention::DecodeBatch& batch, int32_t block_size, int32_t first_free_block) {
  attention::DecodeBatch next;
  std::vector<int32_t> table;
  for (int32_t s = 0; s < batch.num_seqs(); ++s) {
    const auto blocks = batch.blocks_of(s);
    table.assign(blocks.begin(), blocks.end());
    const int32_t length = batch.kv_lengths[size_t(s)];
    if (length % block_size == 0) table.push_back(first_free_block++);
    next.add_sequence(table, length + 1);
  }
  return next;
}

// Everything about one (tree, heads) config that needs no GPU.
struct PlanFigures {
  PrefixTreeSpec spec;
  attention::DecodeBatch batch;
  attention::AttentionShape shape;
  attention::PrefixPlan plan;
  int64_t num_blocks = 0;
  int64_t unique_bytes = 0;
  double flops = 0;
  attention::PlanTraffic traffic, unpacked;
  double plan_us = 0, reuse_us = 0, grow_us = 0;
  double schedule_us = -1;  // -1: no CUDA backend built
};

PlanFigures plan_figures(const std::string& tree, HeadSpec heads, const PrefixBenchOptions& flags,
                         const attention::PrefixPlanOptions& options, const attention::DeviceInfo& device,
                         int32_t element_bytes) {
  PlanFigures f;
  f.spec = parse_prefix_tree(tree);
  f.num_blocks = tree_num_blocks(f.spec, flags.block_size);
  f.batch = make_tree_batch(f.spec, flags.block_size, kSeed);
  f.shape = {.num_q_heads = heads.q_heads,
             .num_kv_heads = heads.kv_heads,
             .head_dim = flags.head_dim,
             .block_size = flags.block_size,
             .softmax_scale = 1.f / std::sqrt(float(flags.head_dim))};
  f.plan = attention::plan_prefix(f.batch, f.shape, device, options);
  const int64_t token_bytes = 2 * int64_t(heads.kv_heads) * flags.head_dim * element_bytes;
  f.unique_bytes = attention::unique_kv_tokens(f.batch, flags.block_size) * token_bytes;
  for (int32_t length : f.batch.kv_lengths) f.flops += 4.0 * length * heads.q_heads * flags.head_dim;
  f.traffic = attention::plan_traffic(f.plan, f.shape, options);
  attention::PrefixPlanOptions unpacked = options;
  unpacked.pack = false;
  unpacked.split = false;
  f.unpacked = attention::plan_traffic(attention::plan_prefix(f.batch, f.shape, device, unpacked), f.shape, unpacked);
  f.plan_us = host_us(51, [&] { attention::plan_prefix(f.batch, f.shape, device, options); });
  attention::PrefixPlanner planner(f.shape, device, options);
  planner.plan(f.batch);
  f.reuse_us = host_us(51, [&] { planner.plan(f.batch); });
  const attention::DecodeBatch next = grown(f.batch, flags.block_size, int32_t(f.num_blocks));
  std::vector<double> grow;
  for (int i = 0; i < 51; ++i) {
    planner.plan(f.batch);  // from scratch (the batch differs from `next`)
    const auto start = std::chrono::steady_clock::now();
    planner.plan(next);
    grow.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    if (planner.last_update() != attention::PrefixPlanner::Update::kGrown)
      fail(ErrorKind::kInternal, "bench prefix-attention: a grown batch was replanned from scratch");
  }
  f.grow_us = median(grow);
#if PAGODA_HAVE_CUDA
  f.schedule_us = host_us(51, [&] {
    const cuda::KernelUnits kernel = cuda::kernel_units(f.plan, f.batch.block_ids, flags.block_size, cuda::kPrefixOneTileRows);
    cuda::prefix_schedule(kernel.units, heads.kv_heads, device.num_workers);
  });
#endif
  return f;
}

nlohmann::json plan_json(const PlanFigures& f) {
  std::vector<int> rows_by_tile(4, 0);  // units of M = 16, 32, 64, 128
  for (const attention::PrefixUnit& u : f.plan.units) rows_by_tile[size_t(std::min(3, std::countr_zero(uint32_t(u.m_tile)) - 4))]++;
  return {{"units", f.plan.units.size()},
          {"items", f.plan.num_items()},
          {"partial_slots", f.plan.num_partials()},
          {"merges", f.plan.merges.size()},
          {"split_tokens", f.plan.split_tokens},
          {"units_by_m_tile", {{"16", rows_by_tile[0]}, {"32", rows_by_tile[1]}, {"64", rows_by_tile[2]}, {"128", rows_by_tile[3]}}},
          {"kv_bytes", f.traffic.kv},
          {"bytes", f.traffic.total()},
          {"partial_bytes", f.traffic.partial},
          {"unpacked_kv_bytes", f.unpacked.kv},
          {"unpacked_bytes", f.unpacked.total()},
          {"plan_us", f.plan_us},
          {"reuse_us", f.reuse_us},
          {"grow_us", f.grow_us},
          {"schedule_us", f.schedule_us}};
}

void run_plan_only(const PrefixBenchOptions& flags, const std::vector<HeadSpec>& heads) {
  nlohmann::json configs = nlohmann::json::array();
  std::printf("%-42s %6s %7s %10s %10s %10s %9s %9s %9s %9s\n", "tree", "heads", "units", "unique MB", "plan MB",
              "unpacked", "plan us", "reuse us", "grow us", "sched us");
  for (const std::string& tree : flags.trees) {
    for (HeadSpec h : heads) {
      // The GPU kernel's options at these heads (prefix_plan_options): f16 partial states, and
      // the tails it reads.
      const attention::PrefixPlanOptions options{
          .partial_o_bytes_per_element = 2,
          .max_tail_tokens = cuda::prefix_max_tail_tokens(h.q_heads / h.kv_heads, flags.block_size)};
      const PlanFigures f = plan_figures(tree, h, flags, options, {.num_workers = flags.workers}, 2);
      std::printf("%-42s %3d/%-2d %7zu %10.1f %10.1f %10.1f %9.1f %9.2f %9.1f %9.1f\n", tree.c_str(), h.q_heads,
                  h.kv_heads, f.plan.units.size(), f.unique_bytes / 1e6, f.traffic.total() / 1e6,
                  f.unpacked.total() / 1e6, f.plan_us, f.reuse_us, f.grow_us, f.schedule_us);
      configs.push_back({{"tree", tree}, {"q_heads", h.q_heads}, {"kv_heads", h.kv_heads},
                         {"queries", f.batch.num_seqs()}, {"unique_kv_bytes", f.unique_bytes},
                         {"plan", plan_json(f)}});
    }
  }
  if (!flags.out.empty()) {
    write_json_file(flags.out, {{"benchmark", "prefix_attention_plan"}, {"workers", flags.workers},
                                {"commit", git_commit()}, {"configs", configs}});
  }
}

#if PAGODA_HAVE_CUDA

struct KernelTiming {
  double median_us, min_us, max_us;  // on the GPU, between CUDA events
  double host_us;  // median host time of the call that enqueues the launches: a decode step pays it per layer
};

void run_gpu_bench(PrefixBenchOptions flags, const std::vector<HeadSpec>& heads) {
  const DType dtype = flags.dtype == "bf16" ? DType::kBF16 : DType::kF16;
  const int32_t element_bytes = 2;
  if (!cuda::device_available()) fail(ErrorKind::kUnsupported, "bench prefix-attention: no CUDA device (--plan-only runs without one)");
  DeviceSummary device = describe_current_device();
  if (flags.out.empty()) flags.out = "bench/results/" + device_slug(device.name) + "/prefix_attention.json";
  std::fprintf(stderr, "bench prefix-attention: %s, %d SMs; measuring streaming-read bandwidth and the mma.sync peak...\n",
               device.name.c_str(), device.sm_count);
  const double bandwidth_before = measure_stream_read_bandwidth();
  const double mma_peak = measure_mma_peak_flops();
  std::fprintf(stderr, "bench prefix-attention: streaming read %.1f GB/s, mma.sync f16 %.1f TFLOP/s\n",
               bandwidth_before / 1e9, mma_peak / 1e12);

  // Plans first (host only), then one pool for the largest config.
  struct Config {
    HeadSpec heads;
    PlanFigures figures;
    cuda::PrefixTiles tiles;
  };
  std::vector<Config> configs;
  int64_t pool_bytes = 0;
  auto add_config = [&](const std::string& tree, HeadSpec h) {
    const attention::AttentionShape shape{.num_q_heads = h.q_heads, .num_kv_heads = h.kv_heads,
                                          .head_dim = flags.head_dim, .block_size = flags.block_size};
    cuda::PrefixTiles tiles = cuda::prefix_tiles(shape, dtype);
    PlanFigures f = plan_figures(tree, h, flags, cuda::prefix_plan_options(tiles), cuda::prefix_device_info(tiles),
                                 element_bytes);
    pool_bytes = std::max(pool_bytes, f.num_blocks * flags.block_size * h.kv_heads * flags.head_dim * element_bytes * 2);
    configs.push_back({h, std::move(f), std::move(tiles)});
  };
  for (const std::string& tree : flags.trees) {
    for (HeadSpec h : heads) add_config(tree, h);
  }
  const size_t num_batches = configs.size();
  // The launch floor of each head shape: one sequence of one block, timed like the batches. It is
  // what any launch costs here (the launch, and a start from cold caches after the L2 flush), and
  // it is a large part of the smallest batches' time; the report puts the batches next to it.
  // They follow the batches, in the order of `heads`, as each tree's configurations do.
  const std::string floor_tree = fmt::format("1_{}", flags.block_size);
  for (HeadSpec h : heads) add_config(floor_tree, h);
  L2Flusher flusher;
  std::fprintf(stderr, "bench prefix-attention: filling a %.1f GB KV pool...\n", pool_bytes / 1e9);
  cuda::DeviceArray<uint8_t> pool{size_t(pool_bytes)};
  fill_uniform(pool.data(), size_t(pool_bytes) / element_bytes, dtype, kSeed);
  cuda::DeviceArray<uint16_t> q, out_prefix, out_decode;
  EventTimings timings(flags.runs);
  auto time_kernel = [&](auto&& launch) {
    for (int w = 0; w < flags.warmup; ++w) launch();
    std::vector<double> host_us(size_t(flags.runs));
    for (int run = 0; run < flags.runs; ++run) {
      gpu_sleep(200);
      flusher.flush();
      timings.start(run);
      const auto enqueue = std::chrono::steady_clock::now();
      launch();
      host_us[size_t(run)] =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - enqueue).count();
      timings.stop(run);
    }
    cuda::check_cuda(cudaGetLastError(), "bench prefix-attention launch");
    std::vector<double> us = timings.elapsed_us();
    return KernelTiming{median(us), *std::min_element(us.begin(), us.end()), *std::max_element(us.begin(), us.end()),
                        median(host_us)};
  };

  struct Result {
    KernelTiming prefix, decode;
    double max_abs_diff;
    int32_t ctas;  // the prefix kernel's persistent grid
  };
  std::vector<Result> results;
  for (size_t k = 0; k < configs.size(); ++k) {
    Config& c = configs[k];
    const PlanFigures& f = c.figures;
    const int64_t half = f.num_blocks * flags.block_size * c.heads.kv_heads * flags.head_dim * element_bytes;
    const PagedKv kv = make_paged_kv(pool.data(), pool.data() + half, dtype, KvLayout::kHnd, int32_t(f.num_blocks),
                                     flags.block_size, c.heads.kv_heads, flags.head_dim, Device::kCuda);
    const size_t q_elements = size_t(f.batch.num_seqs()) * size_t(c.heads.q_heads) * size_t(flags.head_dim);
    q.resize(q_elements);
    out_prefix.resize(q_elements);
    out_decode.resize(q_elements);
    fill_uniform(q.data(), q_elements, dtype, kSeed + k);
    cuda::PrefixWorkspace prefix_ws;
    prefix_ws.upload(f.plan, f.batch, f.shape, c.tiles);
    const attention::DecodePlan decode_plan =
        attention::plan_decode(f.batch, f.shape, cuda::decode_device_info(f.shape, dtype));
    cuda::DecodeWorkspace decode_ws;
    decode_ws.upload(decode_plan, f.batch, f.shape);
    const cuda::KvTensorMaps maps = cuda::kv_tensor_maps(kv);
    Result r{.ctas = prefix_ws.ctas};
    r.prefix =
        time_kernel([&] { cuda::prefix_attention(prefix_ws, f.shape, kv, maps, q.data(), out_prefix.data(), nullptr); });
    r.decode = time_kernel([&] { cuda::decode_attention(decode_ws, f.shape, kv, q.data(), out_decode.data(), nullptr); });
    // The two kernels must agree: a guard against timing a wrong result.
    const std::vector<uint16_t> a = out_prefix.download(), b = out_decode.download();
    r.max_abs_diff = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const float x = dtype == DType::kF16 ? f16_to_f32(a[i]) : bf16_to_f32(a[i]);
      const float y = dtype == DType::kF16 ? f16_to_f32(b[i]) : bf16_to_f32(b[i]);
      r.max_abs_diff = std::max(r.max_abs_diff, std::isfinite(x) ? double(std::abs(x - y)) : INFINITY);
    }
    std::fprintf(stderr, "[%zu/%zu] %s %d/%d: prefix %.1f us, decode %.1f us (unique KV %.1f MB, |diff| %.1e)\n",
                 k + 1, configs.size(), f.spec.text.c_str(), c.heads.q_heads, c.heads.kv_heads, r.prefix.median_us,
                 r.decode.median_us, f.unique_bytes / 1e6, r.max_abs_diff);
    results.push_back(r);
  }
  const double bandwidth_after = measure_stream_read_bandwidth();
  const double bandwidth = std::max(bandwidth_before, bandwidth_after);

  auto floor_of = [&](size_t head_index) -> const Result& { return results[num_batches + head_index]; };
  nlohmann::json list = nlohmann::json::array();
  std::printf("pagoda bench prefix-attention: %s, %s, head_dim %d, block %d; streaming read %.1f GB/s, mma.sync "
              "%.1f TFLOP/s\n",
              device.name.c_str(), flags.dtype.c_str(), flags.head_dim, flags.block_size, bandwidth / 1e9,
              mma_peak / 1e12);
  std::printf("%-42s %6s %9s %9s %9s %9s %6s %7s %9s %6s\n", "tree", "heads", "unique MB", "read MB", "bound us",
              "prefix us", "frac", "of bnd", "decode us", "frac");
  for (size_t k = 0; k < num_batches; ++k) {
    const Config& c = configs[k];
    const PlanFigures& f = c.figures;
    const Result& r = results[k];
    const Result& floor = floor_of(k % heads.size());
    const double memory_us = f.unique_bytes / bandwidth * 1e6;
    const double compute_us = f.flops / mma_peak * 1e6;
    const double bound_us = std::max(memory_us, compute_us);
    auto frac = [&](const KernelTiming& t) { return f.unique_bytes / (t.median_us * 1e-6) / bandwidth; };
    auto timing_json = [&](const KernelTiming& t) {
      return nlohmann::json{{"median_us", t.median_us}, {"min_us", t.min_us}, {"max_us", t.max_us}, {"host_us", t.host_us},
                            {"frac", frac(t)}, {"of_bound", bound_us / t.median_us}};
    };
    std::printf("%-42s %3d/%-2d %9.1f %9.1f %8.1f%c %9.1f %6.2f %7.2f %9.1f %6.2f\n", f.spec.text.c_str(),
                c.heads.q_heads, c.heads.kv_heads, f.unique_bytes / 1e6, f.traffic.kv / 1e6, bound_us,
                compute_us > memory_us ? 'c' : 'm', r.prefix.median_us, frac(r.prefix), bound_us / r.prefix.median_us,
                r.decode.median_us, frac(r.decode));
    list.push_back({{"tree", f.spec.text},
                    {"q_heads", c.heads.q_heads},
                    {"kv_heads", c.heads.kv_heads},
                    {"queries", f.batch.num_seqs()},
                    {"unique_kv_bytes", f.unique_bytes},
                    {"flops", f.flops},
                    {"bound", {{"memory_us", memory_us}, {"compute_us", compute_us}, {"bound_us", bound_us},
                               {"which", compute_us > memory_us ? "compute" : "memory"}}},
                    {"plan", plan_json(f)},
                    {"tiles", {{"m_tiles", c.tiles.m_tiles}, {"kv_tile_tokens", c.tiles.kv_tile_tokens},
                               {"stages", c.tiles.stages}, {"ctas_per_sm", c.tiles.ctas_per_sm},
                               {"workers", c.tiles.workers}, {"bytes_in_flight", c.tiles.bytes_in_flight},
                               {"latency_bandwidth_bytes", c.tiles.latency_bandwidth_bytes},
                               {"rejected", c.tiles.rejected}}},
                    {"prefix", timing_json(r.prefix)},
                    {"ctas", r.ctas},
                    {"decode", timing_json(r.decode)},
                    {"floor", {{"prefix_us", floor.prefix.median_us}, {"decode_us", floor.decode.median_us}}},
                    {"max_abs_diff_prefix_vs_decode", r.max_abs_diff}});
  }
  for (size_t j = 0; j < heads.size(); ++j) {
    const HeadSpec h = heads[j];
    const Result& floor = floor_of(j);
    std::printf("launch floor %d/%d (one sequence of %s): prefix %.1f us, decode %.1f us\n", h.q_heads, h.kv_heads,
                floor_tree.c_str(), floor.prefix.median_us, floor.decode.median_us);
  }
  std::printf("frac: unique KV bytes / median time / streaming-read bandwidth; of bnd: max(unique bytes / bandwidth, "
              "FLOPs / mma.sync peak) / time (bound us: m memory, c compute); decode: the paged decode kernel on "
              "the same batch\n");
  write_json_file(flags.out,
                  {{"benchmark", "prefix_attention"},
                   {"device", device.name},
                   {"sm_count", device.sm_count},
                   {"l2_bytes", device.l2_bytes},
                   {"stream_read_gbps", bandwidth / 1e9},
                   {"stream_read_gbps_before_after", {bandwidth_before / 1e9, bandwidth_after / 1e9}},
                   {"mma_peak_tflops", mma_peak / 1e12},
                   {"bound", "max(unique KV bytes / stream_read_gbps, attention FLOPs (4 x kv length x q heads x "
                             "head_dim per query) / mma_peak_tflops); frac = unique KV bytes / time / stream_read_gbps"},
                   {"floor", fmt::format("per config: the median time of both kernels on the batch {} (one "
                                         "sequence of one block) with the same heads, timed alike",
                                         floor_tree)},
                   {"timing", fmt::format("CUDA events, {} warm-up runs, median of {} runs, L2 flushed before each run "
                                          "behind a 200 us GPU sleep; plan times: host, median of 51 after 2 ms of warm-up",
                                          flags.warmup, flags.runs)},
                   {"dtype", flags.dtype},
                   {"head_dim", flags.head_dim},
                   {"block_size", flags.block_size},
                   {"commit", git_commit()},
                   {"configs", list}});
  std::fprintf(stderr, "bench prefix-attention: wrote %s\n", flags.out.c_str());
}

#endif  // PAGODA_HAVE_CUDA

}  // namespace

void run_prefix_attention_bench(PrefixBenchOptions options) {
  options.trees = expand_benchmark_trees(options.trees);
  if (options.trees.empty()) fail(ErrorKind::kInvalidArgument, "--tree: give at least one batch");
  for (const std::string& tree : options.trees) {  // errors before any work
    if (tree.find('_') == std::string::npos) {  // a misspelt set name reads better as one
      fail(ErrorKind::kInvalidArgument, "--tree: '{}' is neither COUNTS_LENGTHS (e.g. 1,4,16_128,256,1024) nor "
           "`listed` or `pat`", tree);
    }
    parse_prefix_tree(tree);
  }
  if (options.list_trees) {
    std::string joined;
    for (const std::string& tree : options.trees) joined += (joined.empty() ? "" : ";") + tree;
    std::printf("%s\n", joined.c_str());
    return;
  }
  std::vector<HeadSpec> heads;
  for (const std::string& spec : options.heads) heads.push_back(parse_heads(spec));
  if (heads.empty()) fail(ErrorKind::kInvalidArgument, "--heads: give at least one q_heads/kv_heads");
  if (options.head_dim != 64 && options.head_dim != 128)
    fail(ErrorKind::kInvalidArgument, "--head-dim: {} (the prefix kernel has 64 and 128)", options.head_dim);
  if (options.block_size != 16 && options.block_size != 32 && options.block_size != 64)
    fail(ErrorKind::kInvalidArgument, "--block-size: {} (16, 32 or 64)", options.block_size);
  if (options.dtype != "fp16" && options.dtype != "bf16")
    fail(ErrorKind::kInvalidArgument, "--dtype: '{}' is not fp16 or bf16", options.dtype);
  if (options.runs < 1 || options.warmup < 0 || options.workers < 1)
    fail(ErrorKind::kInvalidArgument, "--runs and --workers must be at least 1, --warmup at least 0");
  for (HeadSpec h : heads) {
    if (h.q_heads / h.kv_heads > 8)
      fail(ErrorKind::kInvalidArgument, "--heads {}/{}: GQA groups of 1 to 8 query heads", h.q_heads, h.kv_heads);
  }
  if (options.plan_only) return run_plan_only(options, heads);
#if PAGODA_HAVE_CUDA
  run_gpu_bench(options, heads);
#else
  fail(ErrorKind::kUnsupported,
       "bench prefix-attention: this pagoda was built without CUDA (--plan-only runs without it)");
#endif
}

}  // namespace pagoda::bench

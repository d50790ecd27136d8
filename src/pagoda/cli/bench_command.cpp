// pagoda bench generate|attention|prefix-attention|quant-matmul|throughput|allreduce: each subcommand's flags; the
// benchmarks themselves are the bench layer's (src/pagoda/bench/).
#include <memory>

#include "pagoda/bench/allreduce.h"
#include "pagoda/bench/attention.h"
#include "pagoda/bench/decode_profile.h"
#include "pagoda/bench/generate.h"
#include "pagoda/bench/kv_transfer.h"
#include "pagoda/bench/prefix_attention.h"
#include "pagoda/bench/quant_matmul.h"
#include "pagoda/bench/throughput.h"
#include "pagoda/cli/commands.h"
#include "pagoda/cli/flags.h"

namespace pagoda::cli {
namespace {

void register_bench_attention(CLI::App& bench_cmd) {
  auto flags = std::make_shared<bench::AttentionBenchOptions>();
  CLI::App* cmd = bench_cmd.add_subcommand(
      "attention", "GPU decode attention over batch x context x heads, against the streaming-read bound");
  cmd->add_option("--batches", flags->batches, "sequences per step, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--contexts", flags->contexts, "KV tokens per sequence, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--heads", flags->heads, "head shapes as q_heads/kv_heads, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--head-dim", flags->head_dim, "head dimension")->capture_default_str();
  cmd->add_option("--block-size", flags->block_size, "tokens per KV block")->capture_default_str();
  cmd->add_option("--dtype", flags->dtype, "KV, q and out type: fp16 or bf16")->capture_default_str();
  cmd->add_option("--layout", flags->layout, "KV pool layout: hnd or nhd")->capture_default_str();
  cmd->add_option("--runs", flags->runs, "timed runs per variant (the median is reported)")->capture_default_str();
  cmd->add_option("--warmup", flags->warmup, "untimed runs per variant first")->capture_default_str();
  cmd->add_option("--variants", flags->variants,
                  "kernels to time: tiled, tiled_prefetch, baseline, baseline_prefetch (comma-separated)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--min-split-tokens", flags->min_split_tokens,
                  "shortest KV piece the planner's split-KV may cut (PlanOptions::min_kv_tokens_per_item)")
      ->capture_default_str();
  cmd->add_option("--prefetch-distance", flags->prefetch_distance,
                  "L2 prefetch distance: 64-token tiles ahead (tiled) or per-warp blocks ahead (baseline); 0: each "
                  "kernel's default")
      ->capture_default_str();
  cmd->add_option("--kv-cache-dtype", flags->kv_cache_dtypes,
                  "KV dtypes to compare, f16 first (e.g. f16,fp8,int2; needs --block-size 64): each one's time, "
                  "fraction of its own bound and speedup over f16, to bench/results/<device>/kv-quantization.json")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--out", flags->out, "JSON results (default bench/results/<device>/attention.json)");
  cmd->add_option("--filter", flags->filter, "run only configs whose name (e.g. b64-c8192-h32/8) contains this");
  CLI::Option* max_kv = cmd->add_option("--max-kv-gb", flags->max_kv_gb,
                                        "largest KV pool to allocate, in GB (default 70% of free device memory)");
  cmd->add_flag("--baseline-all", flags->baseline_all,
                "run the baseline kernel at every size (default: batch x context <= 64 x 8192)");
  cmd->callback([flags, max_kv] {
    flags->max_kv_given = max_kv->count() > 0;
    bench::run_attention_bench(*flags);
  });
}

void register_bench_prefix_attention(CLI::App& bench_cmd) {
  auto flags = std::make_shared<bench::PrefixBenchOptions>();
  CLI::App* cmd = bench_cmd.add_subcommand(
      "prefix-attention", "prefix-aware decode attention on prefix-tree batches, against its bound and the decode kernel");
  cmd->add_option("--tree", flags->trees,
                  "prefix-tree batches COUNTS_LENGTHS, ';'-separated or repeated; `listed`: the eight of "
                  "bench/workloads/README.md, `pat`: the PAT artifact's twenty")
      ->delimiter(';')
      ->capture_default_str();
  cmd->add_flag("--list-trees", flags->list_trees, "print the batches --tree names, ';'-separated, and exit");
  cmd->add_option("--heads", flags->heads, "head shapes as q_heads/kv_heads, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--head-dim", flags->head_dim, "head dimension (64 or 128)")->capture_default_str();
  cmd->add_option("--block-size", flags->block_size, "tokens per KV block (16, 32 or 64)")->capture_default_str();
  cmd->add_option("--dtype", flags->dtype, "KV, q and out type: fp16 or bf16")->capture_default_str();
  cmd->add_option("--runs", flags->runs, "timed runs per kernel (the median is reported)")->capture_default_str();
  cmd->add_option("--warmup", flags->warmup, "untimed runs per kernel first")->capture_default_str();
  cmd->add_flag("--plan-only", flags->plan_only, "plan and time the planner only (no GPU needed)");
  cmd->add_option("--workers", flags->workers, "--plan-only: workers of the device planned for")->capture_default_str();
  cmd->add_option("--out", flags->out, "JSON results (default bench/results/<device>/prefix_attention.json)");
  cmd->callback([flags] {
    bench::run_prefix_attention_bench(*flags);
  });
}

void register_bench_allreduce(CLI::App& bench_cmd) {
  auto flags = std::make_shared<bench::AllReduceBenchOptions>();
  CLI::App* cmd = bench_cmd.add_subcommand(
      "allreduce", "GPU all-reduce at decode sizes, NCCL against the one-shot kernel, one rank per GPU");
  cmd->add_option("--sizes", flags->sizes, "message sizes in bytes (K, M suffixes), comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--ranks", flags->ranks, "ranks, one per GPU (default: every GPU present)");
  cmd->add_option("--dtype", flags->dtype, "element type: f32, f16 or bf16")->capture_default_str();
  cmd->add_option("--calls", flags->calls, "all-reduces per captured graph")->capture_default_str();
  cmd->add_option("--runs", flags->runs, "timed replays (the median is reported)")->capture_default_str();
  cmd->add_option("--warmup", flags->warmup, "untimed replays first")->capture_default_str();
  cmd->add_option("--link-gb-s", flags->link_gb_s, "NVLink GB/s per direction per GPU, for the bound")
      ->capture_default_str();
  cmd->add_option("--out", flags->out, "JSON results (default bench/results/<device>/allreduce.json; a .md beside it)");
  cmd->callback([flags] { bench::run_allreduce_bench(*flags); });
}

void register_bench_throughput(CLI::App& bench_cmd) {
  auto flags = std::make_shared<bench::ThroughputBenchOptions>();
  CLI::App* cmd = bench_cmd.add_subcommand(
      "throughput", "the engine on an offline batch or a replayed trace: tokens/s, TTFT, TPOT, prefix hits, roofline");
  add_model_flags(*cmd, flags->model);
  cmd->add_option("--batch", flags->batch, "offline: requests, all submitted at t = 0 (default --max-batch: this)");
  cmd->add_option("--input", flags->input, "offline: synthetic prompt tokens per request");
  cmd->add_option("--output", flags->output, "offline: tokens generated per request (past end-of-sequence)");
  cmd->add_option("--shared-prefix", flags->shared_prefix,
                  "offline: the first N prompt tokens are the same in every request (default 0)");
  cmd->add_option("--trace", flags->trace, "replay this Mooncake-format trace (JSON lines)");
  cmd->add_option("--time-scale", flags->scaling.time_scale, "replay: multiply arrival times (default 1; 0: all at once)");
  cmd->add_option("--length-scale", flags->scaling.length_scale,
                  "replay: multiply input and output lengths and the 512-token block (default 1)");
  cmd->add_option("--output-scale", flags->scaling.output_scale,
                  "replay: multiply output lengths by this instead of --length-scale (default: as --length-scale)");
  cmd->add_option("--max-requests", flags->scaling.max_requests, "replay: only the first N requests (default all)");
  cmd->add_option("--max-input", flags->scaling.max_input, "replay: cap on scaled input tokens (default none)");
  cmd->add_option("--max-output", flags->scaling.max_output, "replay: cap on scaled output tokens (default none)");
  cmd->add_option("--seed", flags->seed, "seed of the synthetic token ids (default 0)");
  cmd->add_flag("--no-prefix-cache", flags->no_prefix_cache, "do not reuse the KV of cached prompt prefixes");
  cmd->add_option("--json", flags->json_path, "write the results as JSON to this file");
  cmd->add_option("--beam-width", flags->beam_width,
                  "offline: each request a beam search of W beams, against W independent sequences per request");
  cmd->add_option("--baseline-tokens-per-s", flags->baseline_tokens_per_s,
                  "--tensor-parallel N: the N = 1 output tokens/s to compare with (default: run the workload unsplit)");
  cmd->add_flag("--no-baseline", flags->no_baseline, "--tensor-parallel N: no N = 1 run, no efficiency");
  cmd->add_option("--allreduce-us", flags->allreduce_us,
                  "--tensor-parallel N: us per all-reduce of a decode step for the per-rank bound (default: timed)");
  cmd->callback([flags, cmd] {
    flags->baseline_given = cmd->count("--baseline-tokens-per-s") > 0;
    flags->allreduce_given = cmd->count("--allreduce-us") > 0;
    flags->offline = cmd->count("--batch") + cmd->count("--input") + cmd->count("--output") > 0;
    flags->max_batch_given = cmd->count("--max-batch") > 0;
    flags->kv_memory_given = cmd->count("--kv-memory-mb") > 0;
    bench::run_throughput_bench(*flags);
  });
}

void register_bench_quant_matmul(CLI::App& bench_cmd) {
  auto flags = std::make_shared<bench::QuantMatmulBenchOptions>();
  CLI::App* cmd = bench_cmd.add_subcommand(
      "quant-matmul", "GPU matmul on GGUF quantized weights per type, shape and batch, against its bytes bound and f16");
  cmd->add_option("--types", flags->types, "weight types, comma-separated")->delimiter(',')->capture_default_str();
  cmd->add_option("--shapes", flags->shapes, "weights as MxK, comma-separated")->delimiter(',')->capture_default_str();
  cmd->add_option("--batches", flags->batches, "activation rows, comma-separated")->delimiter(',')->capture_default_str();
  cmd->add_option("--runs", flags->runs, "timed runs per variant (the median is reported)")->capture_default_str();
  cmd->add_option("--out", flags->out, "JSON results (default bench/results/<device>/quantized-weights.json)");
  cmd->callback([flags] { bench::run_quant_matmul_bench(*flags); });
}

void register_bench_kv_transfer(CLI::App& bench_cmd) {
  auto flags = std::make_shared<bench::KvTransferBenchOptions>();
  CLI::App* cmd = bench_cmd.add_subcommand(
      "kv-transfer", "one prompt's KV over the disaggregated host path (TCP loopback) against its prefill, sent after "
                     "it and layer by layer during it");
  add_model_flags(*cmd, flags->model);
  cmd->add_option("--prompt-tokens", flags->prompt_tokens, "prompt length (default 1024)");
  cmd->add_option("--runs", flags->runs, "timed runs of each way, after a warm-up (default 3; the median is reported)");
  cmd->add_option("--json", flags->json_path, "write the results as JSON to this file");
  cmd->callback([flags] { bench::run_kv_transfer_bench(*flags); });
}

void register_bench_profile(CLI::App& bench_cmd) {
  auto flags = std::make_shared<bench::ProfileBenchOptions>();
  CLI::App* cmd = bench_cmd.add_subcommand(
      "profile", "a decode step op by op: time, bytes, FLOPs, fraction of each op's bound, gaps, graph-replayed step");
  add_model_flags(*cmd, flags->model);
  cmd->add_option("--batches", flags->batches, "decode batch sizes, comma-separated")->delimiter(',')->capture_default_str();
  cmd->add_option("--context", flags->context, "prompt tokens of every sequence")->capture_default_str();
  cmd->add_option("--steps", flags->steps, "graph-replayed steps timed per batch")->capture_default_str();
  cmd->add_option("--profile-steps", flags->profile_steps, "steps profiled op by op per batch")->capture_default_str();
  cmd->add_option("--json", flags->json_path, "write the results as JSON to this file");
  cmd->add_option("--markdown", flags->markdown_path, "write the tables as markdown to this file");
  cmd->callback([flags] { bench::run_profile_bench(*flags); });
}

}  // namespace

void register_bench(CLI::App& app) {
  auto flags = std::make_shared<bench::GenerateBenchOptions>();
  CLI::App* bench_cmd = app.add_subcommand("bench", "benchmarks");
  bench_cmd->require_subcommand(1);
  CLI::App* cmd = bench_cmd->add_subcommand("generate", "the CPU backend's prefill and decode speed against its bounds");
  add_model_flags(*cmd, flags->model);
  cmd->add_option("--prompt-tokens", flags->prompt_tokens, "prompt length (default 128)");
  cmd->add_option("--gen-tokens", flags->gen_tokens, "tokens generated per request (default 64)");
  cmd->add_option("--batch", flags->batch, "requests decoded together in the batched run (default 8)");
  cmd->add_option("--json", flags->json_path, "write the results as JSON to this file");
  cmd->callback([flags] {
    bench::run_generate_bench(*flags);
  });
  register_bench_attention(*bench_cmd);
  register_bench_prefix_attention(*bench_cmd);
  register_bench_quant_matmul(*bench_cmd);
  register_bench_throughput(*bench_cmd);
  register_bench_allreduce(*bench_cmd);
  register_bench_kv_transfer(*bench_cmd);
  register_bench_profile(*bench_cmd);
}

}  // namespace pagoda::cli

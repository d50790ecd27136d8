// pagoda bench throughput end to end on the CPU backend with a tiny make-model checkpoint: the
// offline and replay workloads run, count exactly the tokens and steps they should, account the
// KV bytes of the roofline exactly, see the prefix sharing the trace describes, and write JSON
// with the fields the results need.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "pagoda_process.h"

namespace pagoda {
namespace {

namespace fs = std::filesystem;
using testing::expect_pagoda_error;
using testing::fresh_temp_dir;
using testing::run_pagoda;

class BenchThroughput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fresh_temp_dir("bench_throughput"));
    const auto r = run_pagoda("make-model --arch tiny --seed 1 --out " + (*dir_ / "model").string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // Lengths x 0.25 make 128-token blocks: inputs 256, 256 and 250 tokens, outputs 4, 2 and 1.
    // Request 0 is prefilled before requests 1 and 2 arrive; 1 shares block 1 with it, 2 shares
    // blocks 1 and 2 (of which 15 whole KV blocks of 16 tokens fit its 250 tokens).
    std::ofstream(*dir_ / "trace.jsonl")
        << R"({"timestamp": 0, "input_length": 1024, "output_length": 16, "hash_ids": [1, 2]})" "\n"
        << R"({"timestamp": 100, "input_length": 1024, "output_length": 8, "hash_ids": [1, 3]})" "\n"
        << R"({"timestamp": 100, "input_length": 1000, "output_length": 4, "hash_ids": [1, 2]})" "\n";
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }

  static std::string model() { return " -m " + (*dir_ / "model").string() + " --backend cpu --threads 2"; }
  static std::string trace() { return (*dir_ / "trace.jsonl").string(); }
  static std::string json_path(const std::string& name) { return (*dir_ / name).string(); }
  static nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(std::ifstream(path)); }

  static fs::path* dir_;
};

fs::path* BenchThroughput::dir_ = nullptr;

void expect_common_fields(const nlohmann::json& j) {
  EXPECT_EQ(j["benchmark"], "throughput");
  EXPECT_FALSE(j["commit"].get<std::string>().empty());
  EXPECT_FALSE(j["device"].get<std::string>().empty());
  EXPECT_EQ(j["backend"], "cpu");
  EXPECT_EQ(j["model_shape"]["layers"], 2);
  EXPECT_GT(j["weight_bytes"].get<double>(), 0);
  const auto& f = j["figures"];
  for (const char* latency : {"ttft_ms", "tpot_ms", "e2e_s"}) {
    EXPECT_GT(f[latency]["mean"].get<double>(), 0) << latency;
    EXPECT_LE(f[latency]["p50"].get<double>(), f[latency]["p99"].get<double>()) << latency;
  }
  EXPECT_NEAR(f["output_tok_s"].get<double>(), f["output_tokens"].get<double>() / f["wall_s"].get<double>(), 1e-6);
  EXPECT_NEAR(f["total_tok_s"].get<double>(),
              (f["output_tokens"].get<double>() + f["prompt_tokens"].get<double>()) / f["wall_s"].get<double>(), 1e-6);
  // No request outlasts the run.
  EXPECT_LE(f["e2e_s"]["p99"].get<double>(), f["wall_s"].get<double>());
}

TEST_F(BenchThroughput, OfflineCountsTokensStepsAndRooflineBytes) {
  const std::string json = json_path("offline.json");
  const auto r = run_pagoda("bench throughput" + model() + " --batch 3 --input 20 --output 6 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* text : {"output tokens/s", "TTFT (ms)", "TPOT (ms)", "prefix-cache hit rate",
                           "roofline of the 5 decode-only steps"})
    EXPECT_NE(r.output.find(text), std::string::npos) << text << "\n" << r.output;

  const nlohmann::json j = read_json(json);
  expect_common_fields(j);
  EXPECT_NE(j["command"].get<std::string>().find("--batch 3 --input 20 --output 6"), std::string::npos);
  EXPECT_EQ(j["config"]["mode"], "offline");
  EXPECT_EQ(j["config"]["max_batch"], 3);  // --max-batch follows --batch unless given
  const auto& f = j["figures"];
  EXPECT_EQ(f["requests"], 3);
  EXPECT_EQ(f["prompt_tokens"], 60);
  EXPECT_EQ(f["output_tokens"], 18);
  EXPECT_EQ(f["steps"], 6);  // one prefill step (with each first token), five decode steps
  EXPECT_EQ(f["preemptions"], 0);
  EXPECT_EQ(f["prefix_hit_tokens"], 0);  // distinct random prompts share no block
  EXPECT_EQ(f["prefix_attention_steps"], 0);  // --attention auto: no step shares a block
  // Host planning is part of each step's wall time.
  EXPECT_GT(f["step_planning_us_mean"].get<double>(), 0);
  EXPECT_LT(f["step_planning_us_mean"].get<double>() * 6, 1e6 * f["wall_s"].get<double>());

  const auto& roof = j["roofline"];
  EXPECT_EQ(roof["decode_steps"], 5);
  EXPECT_EQ(roof["mean_batch"], 3);
  // KV read per token: 2 layers x (K, V) x 2 KV heads x 16 dims x 4 bytes (f32 on the CPU).
  EXPECT_EQ(roof["kv_bytes_per_token"], 512);
  // Decode step k (1..5) attends over 20 + k tokens in each of 3 sequences.
  const double kv_bytes = 3 * 512 * (21 + 22 + 23 + 24 + 25);
  // Of the untied embedding table (320 x 64, f16 unless the CPU backend widened it), a step reads
  // only its 3 tokens' rows.
  const double row_bytes = roof["embedding_row_bytes"].get<double>();
  EXPECT_TRUE(row_bytes == 64 * 2 || row_bytes == 64 * 4) << row_bytes;
  EXPECT_DOUBLE_EQ(roof["step_weight_bytes"].get<double>(), j["weight_bytes"].get<double>() - 320 * row_bytes);
  EXPECT_DOUBLE_EQ(roof["bytes_read"].get<double>(),
                   5 * (roof["step_weight_bytes"].get<double>() + 3 * row_bytes) + kv_bytes);
  const double bandwidth = roof["read_bandwidth_bytes_per_s"].get<double>();
  EXPECT_GT(bandwidth, 1e8);
  EXPECT_NEAR(roof["bound_s"].get<double>(), roof["bytes_read"].get<double>() / bandwidth, 1e-12);
  EXPECT_NEAR(roof["fraction_of_bound"].get<double>(),
              roof["bound_s"].get<double>() / roof["measured_s"].get<double>(), 1e-9);
}

// --attention prefix attends prefix-aware in every step that decodes (here all but the first).
TEST_F(BenchThroughput, PrefixAttentionCountsItsSteps) {
  const std::string json = json_path("prefix.json");
  const auto r =
      run_pagoda("bench throughput" + model() + " --batch 3 --input 20 --output 6 --attention prefix --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = read_json(json);
  const auto& f = j["figures"];
  EXPECT_EQ(f["steps"], 6);
  EXPECT_EQ(f["prefix_attention_steps"], 5);
}

// --shared-prefix: the prompts' first 48 tokens are the same, so after the one prefill step the
// prefix cache gives all three sequences its 3 blocks, which the roofline counts once and
// --attention auto reads once (the steps' sequences share blocks).
TEST_F(BenchThroughput, SharedPrefixIsReadOnceAndCountedOnce) {
  const std::string json = json_path("shared.json");
  const auto r =
      run_pagoda("bench throughput" + model() + " --batch 3 --input 50 --shared-prefix 48 --output 4 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("3 requests x 50 input tokens (the first 48 the same in all) x 4 output tokens"),
            std::string::npos)
      << r.output;
  const nlohmann::json j = read_json(json);
  EXPECT_NE(j["command"].get<std::string>().find("--shared-prefix 48 --attention auto"), std::string::npos)
      << j["command"];
  EXPECT_EQ(j["config"]["shared_prefix"], 48);
  EXPECT_EQ(j["config"]["attention"], "auto");
  EXPECT_EQ(j["config"]["cuda_graphs"], true);
  const auto& f = j["figures"];
  EXPECT_EQ(f["graph_replays"], 0);  // the CPU backend has no graphs
  EXPECT_EQ(f["graph_captures"], 0);
  EXPECT_EQ(f["steps"], 4);
  EXPECT_EQ(f["prefix_attention_steps"], 3);
  const auto& roof = j["roofline"];
  EXPECT_EQ(roof["decode_steps"], 3);
  // Decode step k (1..3) attends over 50 + k tokens in each of 3 sequences, 48 of them shared.
  const double kv_bytes = 512 * (3 * (51 + 52 + 53) - 3 * 2 * 48);
  const double row_bytes = roof["embedding_row_bytes"].get<double>();
  EXPECT_DOUBLE_EQ(roof["bytes_read"].get<double>(),
                   3 * (roof["step_weight_bytes"].get<double>() + 3 * row_bytes) + kv_bytes);

  // The same prompts without the prefix cache: no block is shared, every step reads them all.
  const auto off = run_pagoda("bench throughput" + model() +
                              " --batch 3 --input 50 --shared-prefix 48 --output 4 --no-prefix-cache --json " + json);
  ASSERT_EQ(off.exit_code, 0) << off.output;
  const nlohmann::json k = read_json(json);
  EXPECT_EQ(k["figures"]["prefix_attention_steps"], 0);
  EXPECT_DOUBLE_EQ(k["roofline"]["bytes_read"].get<double>(),
                   3 * (roof["step_weight_bytes"].get<double>() + 3 * row_bytes) + 512 * 3 * (51 + 52 + 53));
}

TEST_F(BenchThroughput, ReplaySharesPrefixesAndReportsTheScaling) {
  const std::string json = json_path("replay.json");
  const auto r = run_pagoda("bench throughput" + model() + " --trace " + trace() + " --length-scale 0.25 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("lengths x 0.25 (a hash id is 128 tokens, not 512)"), std::string::npos) << r.output;

  const nlohmann::json j = read_json(json);
  expect_common_fields(j);
  EXPECT_EQ(j["config"]["mode"], "replay");
  EXPECT_EQ(j["config"]["scaling"]["block_tokens"], 128);
  EXPECT_EQ(j["config"]["scaling"]["length_scale"], 0.25);
  EXPECT_EQ(j["config"]["scaling"]["requests_replayed"], 3);
  EXPECT_TRUE(j["roofline"].is_null());
  const auto& f = j["figures"];
  EXPECT_EQ(f["requests"], 3);
  EXPECT_EQ(f["prompt_tokens"], 256 + 256 + 250);
  EXPECT_EQ(f["output_tokens"], 4 + 2 + 1);
  // Whole 16-token blocks of the longest cached prefix: 8 for request 1, 15 for request 2.
  EXPECT_EQ(f["prefix_hit_tokens"], 128 + 240);
  EXPECT_DOUBLE_EQ(f["prefix_hit_rate"].get<double>(), 368.0 / 762.0);

  const auto off = run_pagoda("bench throughput" + model() + " --trace " + trace() +
                              " --length-scale 0.25 --no-prefix-cache --json " + json);
  ASSERT_EQ(off.exit_code, 0) << off.output;
  const nlohmann::json k = read_json(json);
  EXPECT_EQ(k["config"]["prefix_caching"], false);
  EXPECT_EQ(k["figures"]["prefix_hit_tokens"], 0);
  EXPECT_EQ(k["figures"]["output_tokens"], 7);
}

// --tensor-parallel 2 on the CPU: tiny's 2 kv heads and 320 vocabulary rows split evenly, so each
// rank holds one kv head and 160 ids (plus the zero row other ids read). The main roofline counts
// both ranks' bytes (they share this memory); the per-rank bound takes the largest rank's plus
// 2 x 2 layers + 1 = 5 all-reduces per step at the given latency.
TEST_F(BenchThroughput, TensorParallelReportsThePerRankBound) {
  const std::string json = json_path("tp.json");
  const auto r = run_pagoda("bench throughput" + model() +
                            " --batch 3 --input 20 --output 6 --tensor-parallel 2 --baseline-tokens-per-s 1000 "
                            "--allreduce-us 50 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* text : {"tensor parallel: 2 ranks", "N = 1: 1000.0 output tokens/s (given (--baseline-tokens-per-s))",
                           "5 all-reduces of [3, hidden] x 50.0 us", "of the per-rank roofline"})
    EXPECT_NE(r.output.find(text), std::string::npos) << text << "\n" << r.output;
  const nlohmann::json j = read_json(json);
  expect_common_fields(j);
  EXPECT_NE(j["command"].get<std::string>().find("--tensor-parallel 2 --baseline-tokens-per-s 1000 --allreduce-us 50"),
            std::string::npos)
      << j["command"];
  const auto& tp = j["tensor_parallel"];
  EXPECT_EQ(tp["ranks"], 2);
  EXPECT_EQ(tp["baseline"], "given (--baseline-tokens-per-s)");
  EXPECT_EQ(tp["unsplit_output_tok_s"], 1000.0);
  const double tps = j["figures"]["output_tok_s"].get<double>();
  EXPECT_NEAR(tp["speedup"].get<double>(), tps / 1000, 1e-12);
  EXPECT_NEAR(tp["per_rank_efficiency"].get<double>(), tps / 2000, 1e-12);
  EXPECT_GT(tp["rank0_collective_s"].get<double>(), 0);  // the CPU communicator times its waits

  ASSERT_EQ(tp["rank_bytes"].size(), 2u);
  double weight_bytes = 0;
  for (const auto& rank : tp["rank_bytes"]) {
    EXPECT_EQ(rank["kv_heads"], 1);
    EXPECT_EQ(rank["kv_bytes_per_token"], 256);  // 2 layers x (K, V) x 1 kv head x 16 dims x 4 bytes
    const double row = rank["embedding_row_bytes"].get<double>();
    EXPECT_TRUE(row == 64 * 2 || row == 64 * 4) << row;
    EXPECT_DOUBLE_EQ(rank["step_weight_bytes"].get<double>(), rank["weight_bytes"].get<double>() - 161 * row);
    weight_bytes += rank["weight_bytes"].get<double>();
  }
  EXPECT_DOUBLE_EQ(j["weight_bytes"].get<double>(), weight_bytes);
  const auto& rank0 = tp["rank_bytes"][0];
  const double row = rank0["embedding_row_bytes"].get<double>();
  // Decode step k (1..5) attends over 20 + k tokens in each of 3 sequences.
  const double rank_bytes = 5 * (rank0["step_weight_bytes"].get<double>() + 3 * row) + 3 * 256 * (21 + 22 + 23 + 24 + 25);

  const auto& roof = j["roofline"];  // both ranks' bytes: they share this memory
  EXPECT_EQ(roof["decode_steps"], 5);
  EXPECT_EQ(roof["kv_bytes_per_token"], 512);
  EXPECT_DOUBLE_EQ(roof["bytes_read"].get<double>(), 2 * rank_bytes);

  const auto& per_rank = tp["per_rank_roofline"];
  EXPECT_EQ(per_rank["decode_steps"], 5);
  EXPECT_EQ(per_rank["all_reduces_per_step"], 5);
  EXPECT_EQ(per_rank["all_reduce_rows"], 3);
  EXPECT_DOUBLE_EQ(per_rank["all_reduce_us"].get<double>(), 50);
  EXPECT_EQ(per_rank["all_reduce_source"], "given (--allreduce-us)");
  EXPECT_DOUBLE_EQ(per_rank["largest_rank_bytes_read"].get<double>(), rank_bytes);
  const double bandwidth = per_rank["read_bandwidth_bytes_per_s"].get<double>();
  EXPECT_EQ(bandwidth, roof["read_bandwidth_bytes_per_s"].get<double>());
  EXPECT_NEAR(per_rank["all_reduce_bound_s"].get<double>(), 5 * 5 * 50e-6, 1e-15);
  EXPECT_NEAR(per_rank["bound_s"].get<double>(), rank_bytes / bandwidth + 5 * 5 * 50e-6, 1e-12);
  EXPECT_DOUBLE_EQ(per_rank["measured_s"].get<double>(), roof["measured_s"].get<double>());
  EXPECT_NEAR(per_rank["fraction_of_bound"].get<double>(),
              per_rank["bound_s"].get<double>() / per_rank["measured_s"].get<double>(), 1e-9);

  // No N = 1 figure: no efficiency; the all-reduce timed on the ranks' communicators.
  const auto none = run_pagoda("bench throughput" + model() +
                               " --batch 3 --input 20 --output 6 --tensor-parallel 2 --no-baseline --json " + json);
  ASSERT_EQ(none.exit_code, 0) << none.output;
  const nlohmann::json k = read_json(json);
  EXPECT_EQ(k["tensor_parallel"]["baseline"], "none (--no-baseline)");
  EXPECT_TRUE(k["tensor_parallel"]["speedup"].is_null());
  EXPECT_TRUE(k["tensor_parallel"]["per_rank_efficiency"].is_null());
  EXPECT_GT(k["tensor_parallel"]["per_rank_roofline"]["all_reduce_us"].get<double>(), 0);
  EXPECT_EQ(k["tensor_parallel"]["per_rank_roofline"]["all_reduce_source"].get<std::string>().rfind("measured", 0), 0u);

  // By default the same workload runs unsplit for the N = 1 figure.
  const auto measured = run_pagoda("bench throughput" + model() +
                                   " --batch 3 --input 20 --output 6 --tensor-parallel 2 --json " + json);
  ASSERT_EQ(measured.exit_code, 0) << measured.output;
  const nlohmann::json m = read_json(json);
  EXPECT_EQ(m["tensor_parallel"]["baseline"].get<std::string>().rfind("measured", 0), 0u);
  EXPECT_GT(m["tensor_parallel"]["unsplit_output_tok_s"].get<double>(), 0);
}

TEST_F(BenchThroughput, BadFlags) {
  expect_pagoda_error("bench throughput" + model(), "needs either --batch/--input/--output (offline) or --trace");
  expect_pagoda_error("bench throughput" + model() + " --batch 2 --input 4 --output 4 --trace " + trace(),
                      "needs either");
  expect_pagoda_error("bench throughput" + model() + " --batch 0 --input 4 --output 2", "--batch in [1, 4096]");
  expect_pagoda_error("bench throughput" + model() + " --batch 1 --input 4 --output 2 --no-baseline",
                      "are for --tensor-parallel N > 1");
  expect_pagoda_error("bench throughput" + model() + " --batch 1 --input 4 --output 2 --tensor-parallel 2 --no-baseline "
                      "--baseline-tokens-per-s 5", "one or the other");
  expect_pagoda_error("bench throughput" + model() + " --batch 1 --input 4 --output 2 --tensor-parallel 2 "
                      "--baseline-tokens-per-s 0", "--baseline-tokens-per-s must be in (0, 1e9), not 0");
  expect_pagoda_error("bench throughput" + model() + " --trace " + trace() + " --tensor-parallel 2 --allreduce-us 5",
                      "--allreduce-us is for offline runs");
  expect_pagoda_error("bench throughput" + model() + " --batch 1 --input 4000 --output 200",
                      "exceed the model's context of 4096");
  expect_pagoda_error("bench throughput" + model() + " --batch 1 --input 4 --shared-prefix 5 --output 2",
                      "--shared-prefix is for offline runs, in [0, --input], not 5");
  expect_pagoda_error("bench throughput" + model() + " --batch 1 --input 4 --shared-prefix -1 --output 2",
                      "--shared-prefix");
  expect_pagoda_error("bench throughput" + model() + " --trace " + trace() + " --shared-prefix 4", "--shared-prefix");
  expect_pagoda_error("bench throughput" + model() + " --trace /nonexistent.jsonl", "cannot open the trace");
  expect_pagoda_error("bench throughput" + model() + " --trace " + trace() + " --length-scale 0", "--length-scale");
  expect_pagoda_error("bench throughput" + model() + " --trace " + trace() + " --length-scale 4",
                      "more than the model's context");
  const std::string bad = json_path("bad.jsonl");
  std::ofstream(bad) << R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]})" "\n"
                     << R"({"timestamp": 0, "input_length": 10})" "\n";
  expect_pagoda_error("bench throughput" + model() + " --trace " + bad, "bad.jsonl:2: \"output_length\"");
}

}  // namespace
}  // namespace pagoda

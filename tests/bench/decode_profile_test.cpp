// pagoda bench profile and the ProfilingBackend under it, on the CPU backend with make-model's tiny
// Llama: the ops of a decode step in the forward pass's order, each GEMM named, bytes and FLOPs
// worked out by hand from the tiny shape, and a profile whose ops and gaps add up to its step.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../cli/pagoda_process.h"
#include "pagoda/backend/cpu/cpu_backend.h"
#include "pagoda/bench/profiling_backend.h"
#include "pagoda/model/checkpoint.h"
#include "pagoda/model/model.h"

namespace pagoda {
namespace {

namespace fs = std::filesystem;
using testing::expect_pagoda_error;
using testing::fresh_temp_dir;
using testing::run_pagoda;

// tiny: hidden 64, 4 q heads and 2 kv heads of 16, ffn 128, vocab 320, 2 layers.
constexpr double kHidden = 64, kQkv = 64 + 2 * 32, kFfn = 128, kVocab = 320, kKvDim = 32;

fs::path tiny_model(const std::string& name) {
  const fs::path dir = fresh_temp_dir(name) / "tiny";
  const auto r = run_pagoda("make-model --arch tiny --out " + dir.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return dir;
}

TEST(ProfilingBackend, RecordsEveryOpOfADecodeStepWithItsBytes) {
  const Checkpoint checkpoint = Checkpoint::open(tiny_model("profiling_backend").string());
  CpuBackend cpu;
  bench::ProfilingBackend backend(cpu, checkpoint.config(), bench::make_host_clock(1024), 400);
  Model model(checkpoint, backend, LoadOptions{.weight_dtype = DType::kF16, .show_progress = false});
  model.allocate_kv_cache(4, 16);
  const std::vector<int32_t> blocks = {0, 1};
  const std::vector<int32_t> prompt = {10, 20, 30, 40, 50, 60, 70, 80};
  const SequenceChunk prefill{.tokens = prompt, .start_pos = 0, .block_ids = blocks, .want_logits = true};
  model.run({&prefill, 1});
  EXPECT_TRUE(backend.ops().empty()) << "not profiling: nothing recorded";

  backend.set_profiling(true);
  const int32_t next = 5;
  const SequenceChunk decode{.tokens = {&next, 1}, .start_pos = 8, .block_ids = blocks, .want_logits = true};
  model.run({&decode, 1});
  const std::vector<bench::OpRecord> ops = backend.ops();
  std::vector<std::string> names;
  for (const auto& op : ops) names.push_back(op.name);
  std::vector<std::string> expected = {"step upload", "embedding", "rms_norm"};
  for (int l = 0; l < 2; ++l) {
    for (const char* n : {"gemm qkv", "rope + kv append", "attention", "gemm o_proj", "add + rms_norm", "gemm gate_up",
                          "silu * up", "gemm down"})
      expected.push_back(n);
    expected.push_back(l == 0 ? "add + rms_norm" : "add");
  }
  expected.push_back("final rms_norm");
  expected.push_back("gemm lm_head");
  EXPECT_EQ(names, expected);

  std::map<std::string, bench::OpRecord> first;
  for (const auto& op : ops) first.try_emplace(op.name, op);
  // One row; f16 weights, f32 activations and KV on the CPU.
  EXPECT_EQ(first["gemm qkv"].bytes, kQkv * kHidden * 2 + kHidden * 4 + kQkv * 4);
  EXPECT_EQ(first["gemm qkv"].flops, 2 * kQkv * kHidden);
  EXPECT_EQ(first["gemm gate_up"].bytes, 2 * kFfn * kHidden * 2 + kHidden * 4 + 2 * kFfn * 4);
  EXPECT_EQ(first["gemm down"].flops, 2 * kHidden * kFfn);
  EXPECT_EQ(first["gemm lm_head"].bytes, kVocab * kHidden * 2 + kHidden * 4 + kVocab * 4);
  // K and V of 9 positions, the query and the output.
  EXPECT_EQ(first["attention"].bytes, 9 * 2 * kKvDim * 4 + 2 * kHidden * 4);
  EXPECT_EQ(first["attention"].flops, 4 * 9 * kHidden);

  const std::vector<double> ts = backend.op_timestamps();
  ASSERT_EQ(ts.size(), 2 * ops.size());
  EXPECT_EQ(ts[0], 0);
  for (size_t i = 1; i < ts.size(); ++i) EXPECT_GE(ts[i], ts[i - 1]) << i;
  EXPECT_GT(ts.back(), 0);
  backend.set_profiling(false);
  EXPECT_TRUE(backend.ops().empty());
}

TEST(BenchProfile, OpsAndGapsAddUpToTheStep) {
  const fs::path dir = tiny_model("bench_profile");
  const fs::path json_path = dir.parent_path() / "profile.json", md_path = dir.parent_path() / "profile.md";
  const auto r = run_pagoda("bench profile -m " + dir.string() + " --backend cpu -t 2 --batches 1,8 --context 32 " +
                            "--steps 3 --profile-steps 2 --json " + json_path.string() + " --markdown " + md_path.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("| gemm lm_head |"), std::string::npos) << r.output;
  std::ifstream in(json_path);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["benchmark"], "decode_profile");
  ASSERT_EQ(j["batches"].size(), 2u);
  for (const auto& b : j["batches"]) {
    const double batch = b["batch"].get<double>();
    EXPECT_EQ(b["padded_rows"], b["batch"]) << "the CPU backend pads nothing";
    double sum = b["gaps_us"].get<double>(), bound = 0;
    std::map<std::string, nlohmann::json> by_name;
    for (const auto& op : b["ops"]) {
      sum += op["time_us"].get<double>();
      bound += op["bound_us"].get<double>();
      by_name[op["op"]] = op;
    }
    // Medians of sums are not sums of medians: equal within the spread of two steps.
    EXPECT_NEAR(sum, b["eager_step_us"].get<double>(), 0.25 * b["eager_step_us"].get<double>()) << batch;
    EXPECT_NEAR(bound, b["ops_bound_us"].get<double>(), 1e-6 * bound);
    EXPECT_EQ(by_name["gemm qkv"]["calls"], 2);
    EXPECT_EQ(by_name["gemm lm_head"]["bytes"].get<double>(),
              kVocab * kHidden * 2 + batch * kHidden * 4 + batch * kVocab * 4);
    EXPECT_EQ(by_name["sampling (host argmax)"]["calls"], 1);
    EXPECT_GT(b["graph_step_us"].get<double>(), 0);
    EXPECT_GT(b["mean_context"].get<double>(), 32);
  }
  EXPECT_TRUE(fs::exists(md_path));
}

TEST(BenchProfile, BadFlags) {
  expect_pagoda_error("bench profile --backend cpu --batches 0", "--batches must be in [1, 4096]");
  expect_pagoda_error("bench profile --backend cpu --context 0", "--context >= 1");
}

}  // namespace
}  // namespace pagoda

// SmolLM2 (Q4_1 GGUF, Q8_0 embedding) on the GPU with its weights kept in the file's blocks
// (quant_matmul.h), against two references: transformers' greedy continuations of the golden
// prompts (made on the same file dequantized to f32, as the CPU's f32 path computes it) and the
// CPU backend's own quantized path (int8 activations).
//
// The GPU path multiplies the exact dequantized weights by f16 activations; the CPU's quantized
// path rounds activations to 8 bits, the f32 path to nothing: three slightly different sets of
// logits. A greedy continuation may part from another only where the two tokens nearly tie, so
// the test takes 32 greedy tokens per prompt and, at the first token that differs from a
// reference (if any), requires that the f32 logits of the two tokens lie within kNearTie of the
// logit range (the bound quantized_greedy_test.cpp uses, for the same reason).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "gpu_test.h"
#include "../model/model_runner.h"
#include "pagoda/backend/cpu/cpu_backend.h"
#include "pagoda/backend/cuda/cuda_backend.h"
#include "pagoda/core/default_model.h"
#include "pagoda/kv/block_pool.h"
#include "pagoda/kv/block_table.h"
#include "pagoda/model/model.h"

namespace pagoda {
namespace {

const std::string kFixtures = std::string(PAGODA_SOURCE_DIR) + "/tests/model/fixtures/";
constexpr int32_t kNumBlocks = 64, kBlockSize = 16;
constexpr size_t kTokens = 32;
constexpr double kNearTie = 5e-3;


using GpuQuantizedModel = cuda::GpuTest;

TEST_F(GpuQuantizedModel, SmolLM2GreedyMatchesTheCpuPathsOrPartsAtANearTie) {
  std::ifstream in(kFixtures + "smollm2_golden.json");
  ASSERT_TRUE(in);
  const nlohmann::json golden = nlohmann::json::parse(in);
  const Checkpoint checkpoint = Checkpoint::open(default_model_path());
  CudaBackend gpu_backend(DType::kF16);
  CpuBackend cpu_quantized_backend, f32_backend;
  Model gpu(checkpoint, gpu_backend, LoadOptions{.keep_quantized = true, .show_progress = false});
  ASSERT_EQ(gpu.weight_dtype(), DType::kQ8_0);  // the tied embedding stays in its file type
  Model cpu(checkpoint, cpu_quantized_backend, LoadOptions{.keep_quantized = true, .show_progress = false});
  Model f32(checkpoint, f32_backend, LoadOptions{.weight_dtype = DType::kF32, .show_progress = false});
  for (Model* m : {&gpu, &cpu, &f32}) m->allocate_kv_cache(kNumBlocks, kBlockSize);

  // Where got first parts from want: the f32 logits there must nearly tie between the two tokens.
  auto check_parting = [&](const std::string& name, const char* reference, const std::vector<int32_t>& prompt,
                           const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
    size_t same = 0;
    while (same < kTokens && got[same] == want[same]) ++same;
    std::printf("  %-12s %zu of %zu greedy tokens equal %s\n", name.c_str(), same, kTokens, reference);
    if (same == kTokens) return;
    std::vector<int32_t> prefix = prompt;
    prefix.insert(prefix.end(), want.begin(), want.begin() + std::ptrdiff_t(same));
    const std::vector<float> logits = testing::run_chunks(f32, prefix, prefix.size(), kNumBlocks, kBlockSize).back();
    const auto [lo, hi] = std::minmax_element(logits.begin(), logits.end());
    const double gap = std::abs(double(logits[size_t(want[same])]) - logits[size_t(got[same])]) / double(*hi - *lo);
    std::printf("  %-12s parts from %s at token %zu: f32 logits of the two tokens %.2e of the range apart\n",
                name.c_str(), reference, same, gap);
    EXPECT_LE(gap, kNearTie) << name << " against " << reference << ", token " << same;
  };

  int prompts = 0;
  for (const auto& p : golden.at("prompts")) {
    const std::string name = p.at("name").get<std::string>();
    const auto prompt = p.at("token_ids").get<std::vector<int32_t>>();
    const auto transformers = p.at("greedy_ids").get<std::vector<int32_t>>();
    ASSERT_GE(transformers.size(), kTokens) << name;
    const std::vector<int32_t> got = testing::greedy(gpu, prompt, kTokens, kNumBlocks, kBlockSize);
    check_parting(name, "transformers' (f32)", prompt, got, transformers);
    check_parting(name, "the CPU's quantized path", prompt, got, testing::greedy(cpu, prompt, kTokens, kNumBlocks, kBlockSize));
    ++prompts;
  }
  EXPECT_GE(prompts, 4);
}

}  // namespace
}  // namespace pagoda

// SmolLM2 (Q4_1 GGUF, Q8_0 embedding) with its weights kept in the file's blocks and multiplied
// by the quantized kernels (int8 activations), against the f32 path: transformers' greedy
// continuations of the golden prompts (tests/model/fixtures, made by transformers on the same
// file dequantized to f32) and pagoda's own f32 weights.
//
// 8-bit activations move each logit a little; a greedy continuation may then part from the f32
// one only where the f32 path's top two tokens nearly tie. So the test takes 32 greedy tokens
// per prompt and, at the first token that differs (if any), requires that the f32 logits of the
// two tokens there lie within kNearTie of the logit range of each other.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "model_runner.h"
#include "pagoda/backend/cpu/cpu_backend.h"
#include "pagoda/core/default_model.h"
#include "pagoda/kv/block_pool.h"
#include "pagoda/kv/block_table.h"
#include "pagoda/model/model.h"

namespace pagoda {
namespace {

const std::string kFixtures = std::string(PAGODA_SOURCE_DIR) + "/tests/model/fixtures/";
constexpr int32_t kNumBlocks = 64, kBlockSize = 16;
constexpr size_t kTokens = 32;
// A near tie: the two tokens' f32 logits differ by at most this share of the logit range (the f16
// path's golden tests allow logits 2e-3 of the range from transformers'; a tie that close can
// fall either way under any change of arithmetic).
constexpr double kNearTie = 5e-3;


TEST(QuantizedModel, GreedyMatchesF32PathOrPartsAtANearTie) {
  std::ifstream in(kFixtures + "smollm2_golden.json");
  ASSERT_TRUE(in);
  const nlohmann::json golden = nlohmann::json::parse(in);
  const Checkpoint checkpoint = Checkpoint::open(default_model_path());
  CpuBackend quantized_backend, f32_backend;
  Model quantized(checkpoint, quantized_backend, LoadOptions{.keep_quantized = true, .show_progress = false});
  ASSERT_EQ(quantized.weight_dtype(), DType::kQ8_0);  // the tied embedding stays in its file type
  quantized.allocate_kv_cache(kNumBlocks, kBlockSize);
  std::unique_ptr<Model> f32;  // loaded where a continuation parts
  int prompts = 0;
  for (const auto& p : golden.at("prompts")) {
    const std::string name = p.at("name").get<std::string>();
    const auto prompt = p.at("token_ids").get<std::vector<int32_t>>();
    const auto want = p.at("greedy_ids").get<std::vector<int32_t>>();
    ASSERT_GE(want.size(), kTokens) << name;
    const std::vector<int32_t> got = testing::greedy(quantized, prompt, kTokens, kNumBlocks, kBlockSize);
    size_t same = 0;
    while (same < kTokens && got[same] == want[same]) ++same;
    std::printf("  %-12s %zu of %zu greedy tokens equal the f32 path's\n", name.c_str(), same, kTokens);
    ++prompts;
    if (same == kTokens) continue;
    // Parted at `same`: the f32 logits there, after the common prefix.
    std::vector<int32_t> prefix = prompt;
    prefix.insert(prefix.end(), want.begin(), want.begin() + std::ptrdiff_t(same));
    if (!f32) {
      f32 = std::make_unique<Model>(checkpoint, f32_backend, LoadOptions{.weight_dtype = DType::kF32, .show_progress = false});
      f32->allocate_kv_cache(kNumBlocks, kBlockSize);
    }
    const std::vector<float> logits =
        testing::run_chunks(*f32, prefix, prefix.size(), kNumBlocks, kBlockSize).back();
    const std::vector<float> quantized_logits =
        testing::run_chunks(quantized, prefix, prefix.size(), kNumBlocks, kBlockSize).back();
    ASSERT_EQ(testing::argmax(logits), want[same]) << name;  // the f32 model agrees with transformers there
    const auto [lo, hi] = std::minmax_element(logits.begin(), logits.end());
    const double gap = (double(logits[size_t(want[same])]) - logits[size_t(got[same])]) / double(*hi - *lo);
    std::printf("  %-12s parts at token %zu: f32 logits of the two tokens %.2e of the range apart; the 8-bit "
                "path's logits there differ from f32 by up to %.2e of the range\n",
                name.c_str(), same, gap, testing::relative_max_diff(quantized_logits, logits));
    EXPECT_LE(gap, kNearTie) << name << " token " << same;
  }
  EXPECT_GE(prompts, 4);
}


// The engine promises the same text however requests are batched, so a prompt's logits must not
// depend on which other prompts share its step: prefilled alone and prefilled beside two others,
// its last row's logits are equal bit for bit.
TEST(QuantizedModel, LogitsDoNotDependOnTheBatch) {
  const Checkpoint checkpoint = Checkpoint::open(default_model_path());
  CpuBackend backend;
  Model model(checkpoint, backend, LoadOptions{.keep_quantized = true, .show_progress = false});
  model.allocate_kv_cache(kNumBlocks, kBlockSize);
  const std::vector<std::vector<int32_t>> prompts = {
      {504, 1296, 3615, 7665, 359}, {20608, 2029, 253, 655}, {1137, 14734, 23, 80, 2067, 1047, 28, 216}};
  std::vector<std::vector<float>> alone;
  for (const auto& p : prompts) alone.push_back(testing::run_chunks(model, p, p.size(), kNumBlocks, kBlockSize).back());

  kv::BlockPool pool(kNumBlocks, kBlockSize);
  std::vector<kv::BlockTable> tables(prompts.size());
  std::vector<SequenceChunk> chunks;
  for (size_t i = 0; i < prompts.size(); ++i) {
    kv::append_tokens(tables[i], int32_t(prompts[i].size()), pool);
    chunks.push_back({.tokens = prompts[i], .start_pos = 0, .block_ids = tables[i].block_ids, .want_logits = true});
  }
  const std::span<const float> together = model.forward(chunks);
  const size_t vocab = alone[0].size();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::span<const float> row = together.subspan(i * vocab, vocab);
    EXPECT_EQ(testing::relative_max_diff(row, alone[i]), 0.0) << "prompt " << i;
  }
}

}  // namespace
}  // namespace pagoda

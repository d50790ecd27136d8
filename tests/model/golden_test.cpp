// Golden test: pagoda's forward pass on SmolLM2-135M-Instruct (Q4_1 GGUF) against Hugging Face
// transformers loading the same file (fixtures from tools/make_model_fixtures.py). Both
// dequantize Q4_1 exactly; pagoda then stores weights as f16 (the default) and sums in another
// order, so logits agree to a small fraction of their range and greedy continuations agree
// token for token.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "model_runner.h"
#include "pagoda/backend/cpu/cpu_backend.h"
#include "pagoda/core/default_model.h"
#include "pagoda/model/model.h"

namespace pagoda {
namespace {

const std::string kFixtures = std::string(PAGODA_SOURCE_DIR) + "/tests/model/fixtures/";

struct GoldenPrompt {
  std::string name;
  std::vector<int32_t> ids;
  std::vector<int32_t> greedy;
  std::vector<float> last_logits;
};

class GoldenModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::ifstream in(kFixtures + "smollm2_golden.json");
    ASSERT_TRUE(in) << "missing tests/model/fixtures/smollm2_golden.json";
    const nlohmann::json j = nlohmann::json::parse(in);
    for (const auto& p : j.at("prompts")) {
      prompts_.push_back({p.at("name").get<std::string>(), p.at("token_ids").get<std::vector<int32_t>>(),
                          p.at("greedy_ids").get<std::vector<int32_t>>(),
                          testing::read_f32(kFixtures + p.at("last_logits").at("file").get<std::string>())});
    }
    checkpoint_ = std::make_unique<Checkpoint>(Checkpoint::open(default_model_path()));
    backend_ = std::make_unique<CpuBackend>();
    model_ = std::make_unique<Model>(*checkpoint_, *backend_, LoadOptions{.show_progress = false});
    model_->allocate_kv_cache(kNumBlocks, kBlockSize);
  }
  static void TearDownTestSuite() {
    model_.reset();
    backend_.reset();
    checkpoint_.reset();
  }

  static std::vector<std::vector<float>> run_chunks(const std::vector<int32_t>& ids, size_t chunk) {
    return testing::run_chunks(*model_, ids, chunk, kNumBlocks, kBlockSize);
  }

  static constexpr int32_t kNumBlocks = 64, kBlockSize = 16;
  static inline std::vector<GoldenPrompt> prompts_;
  static inline std::unique_ptr<Checkpoint> checkpoint_;
  static inline std::unique_ptr<CpuBackend> backend_;
  static inline std::unique_ptr<Model> model_;
};

TEST_F(GoldenModel, ConfigMatchesTransformers) {
  const ModelConfig& c = model_->config();
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.num_layers, 30);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_q_heads, 9);
  EXPECT_EQ(c.num_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_TRUE(c.tie_word_embeddings);
}

TEST_F(GoldenModel, LastPositionLogitsMatch) {
  ASSERT_GE(prompts_.size(), 3u);
  for (const GoldenPrompt& p : prompts_) {
    const auto logits = run_chunks(p.ids, p.ids.size()).back();
    ASSERT_EQ(logits.size(), p.last_logits.size()) << p.name;
    const double rel = testing::relative_max_diff(logits, p.last_logits);
    std::printf("  %-12s %3zu tokens: max |diff| = %.2e of the logit range\n", p.name.c_str(), p.ids.size(), rel);
    EXPECT_LE(rel, 2e-3) << p.name;
    EXPECT_EQ(std::max_element(logits.begin(), logits.end()) - logits.begin(),
              std::max_element(p.last_logits.begin(), p.last_logits.end()) - p.last_logits.begin())
        << p.name;
  }
}

// Token-by-token decode and chunked prefill read the KV cache the prefill wrote: the logits at
// every position must match transformers' full-sequence forward.
TEST_F(GoldenModel, EveryPositionMatchesWhenDecodingTokenByToken) {
  const GoldenPrompt& p = prompts_.front();
  const std::vector<float> all = testing::read_f32(kFixtures + "smollm2_" + p.name + "_all_logits.f32");
  const size_t vocab = p.last_logits.size();
  ASSERT_EQ(all.size(), p.ids.size() * vocab);
  for (size_t chunk : {size_t(1), size_t(3)}) {
    const auto steps = run_chunks(p.ids, chunk);
    for (size_t s = 0; s < steps.size(); ++s) {
      const size_t pos = std::min((s + 1) * chunk, p.ids.size()) - 1;
      EXPECT_LE(testing::relative_max_diff(steps[s], std::span(all).subspan(pos * vocab, vocab)), 2e-3)
          << "chunk " << chunk << " position " << pos;
    }
  }
}

}  // namespace
}  // namespace pagoda

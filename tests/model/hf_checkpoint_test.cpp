// Golden test for the Hugging Face path: tiny random Llama / Llama 3.1 (scaled RoPE) / Qwen2
// checkpoints written by transformers' save_pretrained (config.json + model.safetensors in f32,
// bf16 and f16), loaded by pagoda and compared with transformers' float32 logits at every prompt
// position and its greedy continuation (fixtures from tools/make_hf_fixtures.py).
//
// pagoda loads the weights as f32 (LoadOptions::weight_dtype), exactly the values transformers
// computed with, and keeps an f32 KV cache, so the only differences are summation order: the
// tolerance is 1e-4 of the logit range (observed figures are printed). Greedy steps were picked
// by the script to have top1-top2 margins >= 20x that tolerance, so equal continuations are a
// fair requirement.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model_runner.h"
#include "pagoda/backend/cpu/cpu_backend.h"
#include "pagoda/kv/block_pool.h"
#include "pagoda/kv/block_table.h"
#include "pagoda/model/model.h"

namespace pagoda {
namespace {

namespace fs = std::filesystem;

const std::string kFixtures = std::string(PAGODA_SOURCE_DIR) + "/tests/model/fixtures/hf/";
constexpr double kRelTol = 1e-4;  // of the logit range
constexpr int32_t kNumBlocks = 64, kBlockSize = 16;

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("missing fixture " + path);
  return nlohmann::json::parse(in);
}

int32_t argmax(std::span<const float> v) { return int32_t(std::max_element(v.begin(), v.end()) - v.begin()); }

// One fixture model, loaded with f32 weights and a KV cache.
struct Loaded {
  explicit Loaded(const std::string& folder)
      : checkpoint(Checkpoint::open(folder)),
        model(checkpoint, backend, LoadOptions{.weight_dtype = DType::kF32, .show_progress = false}) {
    model.allocate_kv_cache(kNumBlocks, kBlockSize);
  }

  std::vector<std::vector<float>> run_chunks(const std::vector<int32_t>& ids, size_t chunk) {
    return testing::run_chunks(model, ids, chunk, kNumBlocks, kBlockSize);
  }

  Checkpoint checkpoint;
  CpuBackend backend;
  Model model;
};

struct Golden {
  explicit Golden(const std::string& name)
      : folder(kFixtures + name),
        json(read_json(folder + "/golden.json")),
        ids(json.at("prompt_ids").get<std::vector<int32_t>>()),
        greedy(json.at("greedy_ids").get<std::vector<int32_t>>()),
        logits(testing::read_f32(folder + "/" + json.at("logits_file").get<std::string>())),
        vocab(json.at("logits_shape").at(1).get<size_t>()) {}

  std::span<const float> at(size_t pos) const { return std::span(logits).subspan(pos * vocab, vocab); }

  std::string folder;
  nlohmann::json json;
  std::vector<int32_t> ids, greedy;
  std::vector<float> logits;  // [ids.size(), vocab]
  size_t vocab;
};

class HfCheckpoint : public ::testing::TestWithParam<std::string> {};

// Every value the forward pass depends on, against what transformers built from the same
// config.json (rope settings come from "rope_parameters" in transformers 5, from top-level
// "rope_theta" / "rope_scaling" before).
TEST_P(HfCheckpoint, ConfigMatchesConfigJson) {
  const Golden g(GetParam());
  const nlohmann::json& e = g.json.at("expected_config");
  const ModelConfig c = Checkpoint::open(g.folder).config();
  EXPECT_EQ(c.architecture, e.at("architecture").get<std::string>());
  EXPECT_EQ(c.vocab_size, e.at("vocab_size").get<int>());
  EXPECT_EQ(c.hidden_size, e.at("hidden_size").get<int>());
  EXPECT_EQ(c.intermediate_size, e.at("intermediate_size").get<int>());
  EXPECT_EQ(c.num_layers, e.at("num_layers").get<int>());
  EXPECT_EQ(c.num_q_heads, e.at("num_q_heads").get<int>());
  EXPECT_EQ(c.num_kv_heads, e.at("num_kv_heads").get<int>());
  EXPECT_EQ(c.head_dim, e.at("head_dim").get<int>());
  EXPECT_EQ(c.max_context, e.at("max_context").get<int>());
  EXPECT_FLOAT_EQ(c.rms_norm_eps, e.at("rms_norm_eps").get<float>());
  EXPECT_FLOAT_EQ(c.rope_theta, e.at("rope_theta").get<float>());
  EXPECT_EQ(c.rope_scaling.enabled, e.at("rope_llama3").get<bool>());
  if (c.rope_scaling.enabled) {
    EXPECT_FLOAT_EQ(c.rope_scaling.factor, e.at("rope_factor").get<float>());
    EXPECT_FLOAT_EQ(c.rope_scaling.low_freq_factor, e.at("rope_low_freq_factor").get<float>());
    EXPECT_FLOAT_EQ(c.rope_scaling.high_freq_factor, e.at("rope_high_freq_factor").get<float>());
    EXPECT_EQ(c.rope_scaling.original_max_position, e.at("rope_original_max_position").get<int>());
  }
  EXPECT_EQ(c.tie_word_embeddings, e.at("tie_word_embeddings").get<bool>());
  EXPECT_EQ(c.qkv_bias, e.at("qkv_bias").get<bool>());
}

// Decoding one token per step reads every earlier position back from the paged KV cache; a
// prefill of each prefix in one chunk does not. Both must give transformers' logits at every
// position. Chunks of 7 straddle the 16-token block boundary mid-chunk.
TEST_P(HfCheckpoint, EveryPositionMatchesTransformers) {
  const Golden g(GetParam());
  ASSERT_EQ(g.logits.size(), g.ids.size() * g.vocab);
  Loaded m(g.folder);

  double worst_decode = 0, worst_prefill = 0, worst_chunked = 0;
  const auto decode = m.run_chunks(g.ids, 1);
  for (size_t pos = 0; pos < g.ids.size(); ++pos) {
    const double rel = testing::relative_max_diff(decode[pos], g.at(pos));
    worst_decode = std::max(worst_decode, rel);
    EXPECT_LE(rel, kRelTol) << "token by token, position " << pos;
  }
  for (size_t pos = 0; pos < g.ids.size(); ++pos) {
    const std::vector<int32_t> prefix(g.ids.begin(), g.ids.begin() + ptrdiff_t(pos + 1));
    const double rel = testing::relative_max_diff(m.run_chunks(prefix, prefix.size()).back(), g.at(pos));
    worst_prefill = std::max(worst_prefill, rel);
    EXPECT_LE(rel, kRelTol) << "one chunk, position " << pos;
  }
  const auto chunked = m.run_chunks(g.ids, 7);
  for (size_t s = 0; s < chunked.size(); ++s) {
    const size_t pos = std::min((s + 1) * 7, g.ids.size()) - 1;
    const double rel = testing::relative_max_diff(chunked[s], g.at(pos));
    worst_chunked = std::max(worst_chunked, rel);
    EXPECT_LE(rel, kRelTol) << "chunks of 7, position " << pos;
  }
  std::printf("  %-14s max |diff| / logit range: token by token %.1e, one chunk %.1e, chunks of 7 %.1e\n",
              GetParam().c_str(), worst_decode, worst_prefill, worst_chunked);
}

// Prefill the prompt, then decode the argmax one token at a time through the KV cache, growing
// the block table as transformers' full-recompute loop grows its input.
TEST_P(HfCheckpoint, GreedyContinuationMatchesTransformers) {
  const Golden g(GetParam());
  Loaded m(g.folder);
  kv::BlockPool pool(kNumBlocks, kBlockSize);
  kv::BlockTable table;
  std::vector<int32_t> seq = g.ids, generated;
  int32_t done = 0;  // tokens of seq already in the KV cache
  while (generated.size() < g.greedy.size()) {
    const int32_t n = int32_t(seq.size()) - done;
    kv::append_tokens(table, n, pool);
    const SequenceChunk c{.tokens = std::span(seq).subspan(size_t(done), size_t(n)),
                          .start_pos = done,
                          .block_ids = table.block_ids,
                          .want_logits = true};
    generated.push_back(argmax(m.model.forward({&c, 1})));
    done = int32_t(seq.size());
    seq.push_back(generated.back());
  }
  EXPECT_EQ(generated, g.greedy);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfCheckpoint, ::testing::Values("llama", "llama3_scaled", "qwen2"),
                         [](const auto& info) { return info.param; });

// config.json as transformers 4 wrote it (top-level "rope_theta" and "rope_scaling", no
// "rope_parameters") must give the same model: most checkpoints on the Hub are in that form.
TEST(HfCheckpointLegacyConfig, Transformers4RopeKeysGiveTheSameModel) {
  const Golden g("llama3_scaled");
  const fs::path dir = fs::temp_directory_path() / ("pagoda_hf_legacy_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(g.folder + "/model.safetensors", dir / "model.safetensors");
  nlohmann::json config = read_json(g.folder + "/config.json");
  ASSERT_TRUE(config.contains("rope_parameters")) << "fixture no longer in the transformers 5 form";
  nlohmann::json rope = config["rope_parameters"];
  config["rope_theta"] = rope["rope_theta"];
  rope.erase("rope_theta");
  config["rope_scaling"] = rope;
  config.erase("rope_parameters");
  std::ofstream(dir / "config.json") << config.dump(2);

  const ModelConfig legacy = Checkpoint::open(dir.string()).config();
  const ModelConfig current = Checkpoint::open(g.folder).config();
  EXPECT_FLOAT_EQ(legacy.rope_theta, current.rope_theta);
  EXPECT_EQ(legacy.rope_scaling.enabled, current.rope_scaling.enabled);
  EXPECT_FLOAT_EQ(legacy.rope_scaling.factor, current.rope_scaling.factor);
  EXPECT_EQ(legacy.rope_scaling.original_max_position, current.rope_scaling.original_max_position);
  {
    Loaded m(dir.string());
    const double rel = testing::relative_max_diff(m.run_chunks(g.ids, g.ids.size()).back(), g.at(g.ids.size() - 1));
    EXPECT_LE(rel, kRelTol);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pagoda

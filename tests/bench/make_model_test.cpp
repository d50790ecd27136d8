// pagoda make-model: the presets have the published shapes, and the checkpoint it writes is one
// that pagoda loads and runs, with the weight distribution, determinism, layer count, dtype and
// sharding it promises. The expected shapes are written out here from the models' published
// config.json files, not read from the presets under test.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../model/model_runner.h"
#include "pagoda/backend/cpu/cpu_backend.h"
#include "pagoda/bench/model_presets.h"
#include "pagoda/bench/model_writer.h"
#include "pagoda/core/half.h"
#include "pagoda/format/safetensors.h"
#include "pagoda/model/checkpoint.h"
#include "pagoda/model/model.h"
#include "pagoda/model/shard.h"
#include "pagoda/tokenizer/tokenizer.h"
#include "../cli/pagoda_process.h"

namespace pagoda {
namespace {

namespace fs = std::filesystem;
using testing::expect_pagoda_error;
using testing::fresh_temp_dir;
using testing::run_pagoda;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

nlohmann::json read_json(const fs::path& path) { return nlohmann::json::parse(read_file(path)); }

fs::path make_model(const std::string& name, const std::string& args) {
  const fs::path dir = fresh_temp_dir(name) / "model";
  const auto r = run_pagoda("make-model " + args + " --out " + dir.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return dir;
}

// Loads the folder with f32 weights on the CPU backend and runs a prompt through it: every logit
// finite, and the logits neither constant across the vocabulary nor across positions.
void expect_runs(const fs::path& dir) {
  const Checkpoint checkpoint = Checkpoint::open(dir.string());
  CpuBackend backend;
  Model model(checkpoint, backend, LoadOptions{.weight_dtype = DType::kF32, .show_progress = false});
  model.allocate_kv_cache(16, 16);
  const Tokenizer tokenizer = Tokenizer::from_json_file((dir / "tokenizer.json").string());
  const std::vector<int32_t> ids = tokenizer.encode("a random model of a real shape", false);
  ASSERT_GT(ids.size(), 4u);
  const auto logits = testing::run_chunks(model, ids, 1, 16, 16);
  for (size_t position = 0; position < logits.size(); ++position) {
    const auto& row = logits[position];
    ASSERT_EQ(row.size(), size_t(checkpoint.config().vocab_size));
    for (float v : row) ASSERT_TRUE(std::isfinite(v)) << "position " << position;
    const auto [lo, hi] = std::minmax_element(row.begin(), row.end());
    EXPECT_GT(*hi - *lo, 1e-3f) << "position " << position;
  }
  EXPECT_NE(logits.front(), logits.back());
}

struct ExpectedShape {
  const char* name;
  const char* model_type;
  int hidden, layers, q_heads, kv_heads, intermediate, vocab, context;
  float rope_theta;
  bool qkv_bias;
};

TEST(MakeModel, PresetsHaveThePublishedShapes) {
  const ExpectedShape expected[] = {
      {"llama2-7b", "llama", 4096, 32, 32, 32, 11008, 32000, 4096, 1e4f, false},
      {"llama3-8b", "llama", 4096, 32, 32, 8, 14336, 128256, 8192, 5e5f, false},
      {"llama2-70b", "llama", 8192, 80, 64, 8, 28672, 32000, 4096, 1e4f, false},
      {"llama3-70b", "llama", 8192, 80, 64, 8, 28672, 128256, 8192, 5e5f, false},
      {"qwen2.5-7b", "qwen2", 3584, 28, 28, 4, 18944, 152064, 32768, 1e6f, true},
      {"qwen2.5-14b", "qwen2", 5120, 48, 40, 8, 13824, 152064, 32768, 1e6f, true},
  };
  for (const ExpectedShape& e : expected) {
    SCOPED_TRACE(e.name);
    // What pagoda reads back from the config.json make-model writes.
    const nlohmann::json json = bench::hf_config_json(bench::model_preset(e.name), DType::kF16, bench::kWrittenEosId);
    const ModelConfig c = ModelConfig::from_hf_json(json, e.name);
    EXPECT_EQ(c.architecture, e.model_type);
    EXPECT_EQ(c.hidden_size, e.hidden);
    EXPECT_EQ(c.num_layers, e.layers);
    EXPECT_EQ(c.num_q_heads, e.q_heads);
    EXPECT_EQ(c.num_kv_heads, e.kv_heads);
    EXPECT_EQ(c.head_dim, 128);
    EXPECT_EQ(c.intermediate_size, e.intermediate);
    EXPECT_EQ(c.vocab_size, e.vocab);
    EXPECT_EQ(c.max_context, e.context);
    EXPECT_EQ(c.rope_theta, e.rope_theta);
    EXPECT_EQ(c.qkv_bias, e.qkv_bias);
    EXPECT_FALSE(c.tie_word_embeddings);
    EXPECT_FALSE(c.rope_scaling.enabled);
    // What transformers reads: the class, the dtype, the untied head.
    EXPECT_EQ(json["architectures"][0], std::string(e.qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM"));
    EXPECT_EQ(json["torch_dtype"], "float16");
    EXPECT_EQ(json["tie_word_embeddings"], false);
  }
  EXPECT_EQ(bench::hf_config_json(bench::model_preset("tiny"), DType::kBF16, 0)["torch_dtype"], "bfloat16");
  EXPECT_THROW(bench::model_preset("gpt2"), Error);
}

// The 70B shapes are for tensor parallelism on 2 to 8 GPUs: 64 q heads, 8 kv heads and a SwiGLU
// width of 112 blocks of 256 split evenly, each rank whole GQA groups of 8 q heads, so every GPU
// reads the same bytes and none is the step's straggler.
TEST(MakeModel, SeventyBillionShapesSplitEvenlyOverEightRanks) {
  for (const char* name : {"llama2-70b", "llama3-70b"}) {
    const ModelConfig c = bench::model_preset(name);
    for (int n : {2, 4, 8}) {
      SCOPED_TRACE(fmt::format("{} over {} ranks", name, n));
      check_tensor_parallel(c, n);
      for (int r = 0; r < n; ++r) {
        const ShardLayout s = shard_layout(c, {r, n});
        EXPECT_EQ(s.num_q_heads, 64 / n);
        EXPECT_EQ(s.q_head_begin, r * 64 / n);
        EXPECT_EQ(s.num_kv_heads, 8 / n);
        EXPECT_EQ(s.ffn_size, 28672 / n);
        EXPECT_EQ(s.ffn_size % 256, 0);
        EXPECT_EQ(s.vocab_rows, c.vocab_size / n);  // 32000 and 128256 divide by 8
        EXPECT_EQ(s.vocab_stored, s.vocab_rows);
      }
    }
  }
}

TEST(MakeModel, TinyCheckpointLoadsAndRuns) {
  const fs::path dir = make_model("tiny", "--arch tiny --seed 3");
  const nlohmann::json config = read_json(dir / "config.json");
  EXPECT_EQ(config["model_type"], "llama");
  EXPECT_EQ(config["hidden_size"], 64);
  EXPECT_EQ(config["num_hidden_layers"], 2);
  EXPECT_EQ(config["num_attention_heads"], 4);
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["torch_dtype"], "float16");
  EXPECT_EQ(config["rms_norm_eps"], 1e-5);
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));

  const Tokenizer tokenizer = Tokenizer::from_json_file((dir / "tokenizer.json").string());
  EXPECT_EQ(tokenizer.vocab_size(), bench::kWrittenTokenizerSize);
  EXPECT_EQ(tokenizer.eos_id(), bench::kWrittenEosId);
  EXPECT_EQ(tokenizer.encode("ab", false), (std::vector<int32_t>{'a', 'b'}));
  EXPECT_EQ(tokenizer.encode("a b", false), (std::vector<int32_t>{'a', 256 + 'b' - 'a'}));  // " b" merged
  expect_runs(dir);
}

// Norm weights are exactly 1; every other tensor is uniform with std kWeightStd: within its range,
// mean and std within 6 standard errors (the smallest tensor has 1024 values).
TEST(MakeModel, WeightsHaveTheStatedDistribution) {
  const fs::path dir = make_model("distribution", "--arch tiny-qwen2 --seed 11");
  const SafetensorsFile file = SafetensorsFile::open((dir / "model.safetensors").string());
  const double range = std::sqrt(3.0) * bench::kWeightStd;
  int biases = 0;
  for (const SafetensorsTensor& t : file.tensors()) {
    SCOPED_TRACE(t.name);
    ASSERT_EQ(t.dtype, DType::kF16);
    const auto* bits = reinterpret_cast<const uint16_t*>(t.data);
    const int64_t n = t.numel();
    if (t.name.ends_with("norm.weight")) {
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(f16_to_f32(bits[i]), 1.f);
      continue;
    }
    biases += t.name.ends_with(".bias");
    double sum = 0, sum_sq = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double v = f16_to_f32(bits[i]);
      ASSERT_LE(std::fabs(v), range * (1 + 1e-3));
      sum += v;
      sum_sq += v * v;
    }
    const double mean = sum / double(n), std = std::sqrt(sum_sq / double(n) - mean * mean);
    EXPECT_NEAR(mean, 0, 6 * bench::kWeightStd / std::sqrt(double(n)));
    // The variance of a uniform's sample variance is 0.8 sigma^4 / n: std's standard error is
    // about 0.45 sigma / sqrt(n).
    EXPECT_NEAR(std, bench::kWeightStd, 6 * 0.45 * bench::kWeightStd / std::sqrt(double(n)));
  }
  EXPECT_EQ(biases, 2 * 3);  // q, k, v in each of 2 layers
  const SafetensorsTensor* bias = file.find("model.layers.1.self_attn.k_proj.bias");
  ASSERT_NE(bias, nullptr);
  EXPECT_EQ(bias->shape, (std::vector<int64_t>{32}));  // 2 KV heads x 16
  expect_runs(dir);
}

TEST(MakeModel, SameSeedSameBytes) {
  const fs::path a = make_model("seed_a", "--arch tiny --seed 5");
  const fs::path b = make_model("seed_b", "--arch tiny --seed 5");
  const fs::path c = make_model("seed_c", "--arch tiny --seed 6");
  for (const char* name : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
    EXPECT_EQ(read_file(a / name), read_file(b / name)) << name;
  EXPECT_NE(read_file(a / "model.safetensors"), read_file(c / "model.safetensors"));
}

TEST(MakeModel, LayersAndDtypeAreHonoured) {
  const fs::path dir = make_model("layers", "--arch tiny --layers 3 --dtype bf16 --seed 2");
  const nlohmann::json config = read_json(dir / "config.json");
  EXPECT_EQ(config["num_hidden_layers"], 3);
  EXPECT_EQ(config["torch_dtype"], "bfloat16");
  const SafetensorsFile file = SafetensorsFile::open((dir / "model.safetensors").string());
  ASSERT_NE(file.find("model.layers.2.mlp.down_proj.weight"), nullptr);
  EXPECT_EQ(file.find("model.layers.3.mlp.down_proj.weight"), nullptr);
  for (const SafetensorsTensor& t : file.tensors()) EXPECT_EQ(t.dtype, DType::kBF16) << t.name;
  expect_runs(dir);

  // A tensor's values depend on its name and the seed, not on the number of layers.
  const fs::path two = make_model("layers_two", "--arch tiny --dtype bf16 --seed 2");
  const SafetensorsFile two_file = SafetensorsFile::open((two / "model.safetensors").string());
  const SafetensorsTensor* q3 = file.find("model.layers.1.self_attn.q_proj.weight");
  const SafetensorsTensor* q2 = two_file.find("model.layers.1.self_attn.q_proj.weight");
  ASSERT_TRUE(q3 && q2);
  EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(q3->data), q3->nbytes),
            std::string_view(reinterpret_cast<const char*>(q2->data), q2->nbytes));
}

TEST(MakeModel, ShardedCheckpointHoldsTheSameTensors) {
  const fs::path root = fresh_temp_dir("sharded");
  const ModelConfig config = bench::model_preset("tiny");
  bench::write_random_checkpoint(config, (root / "single").string(), {.seed = 4});
  // 60 kB shards: the 40 kB embedding and head tables each end up in a shard of their own.
  const uint64_t bytes = bench::write_random_checkpoint(config, (root / "sharded").string(),
                                                      {.seed = 4, .max_shard_bytes = 60'000});
  ASSERT_TRUE(fs::exists(root / "sharded" / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(root / "sharded" / "model.safetensors"));
  const nlohmann::json index = read_json(root / "sharded" / "model.safetensors.index.json");
  EXPECT_EQ(index["metadata"]["total_size"], bytes);

  const SafetensorsModel single = SafetensorsModel::open((root / "single").string());
  const SafetensorsModel sharded = SafetensorsModel::open((root / "sharded").string());
  EXPECT_GE(sharded.shards().size(), 3u);
  ASSERT_EQ(single.tensors().size(), sharded.tensors().size());
  uint64_t total = 0;
  for (const SafetensorsTensor* t : single.tensors()) {
    const SafetensorsTensor& s = sharded.at(t->name);
    EXPECT_EQ(s.shape, t->shape) << t->name;
    EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(s.data), s.nbytes),
              std::string_view(reinterpret_cast<const char*>(t->data), t->nbytes))
        << t->name;
    total += t->nbytes;
  }
  EXPECT_EQ(total, bytes);
  expect_runs(root / "sharded");
}

TEST(MakeModel, BadFlags) {
  const std::string out = " --out " + (fresh_temp_dir("bad_flags") / "m").string();
  expect_pagoda_error("make-model --arch gpt5" + out, "'gpt5' is not one of llama2-7b");
  expect_pagoda_error("make-model" + out, "needs --arch");
  expect_pagoda_error("make-model --arch tiny", "needs --out");
  expect_pagoda_error("make-model --arch tiny --layers 0" + out, "--layers must be in [1, 1024]");
  expect_pagoda_error("make-model --arch tiny --dtype fp8" + out, "--dtype must be fp16 or bf16");
  expect_pagoda_error("make-model --arch tiny --seed many" + out, "many");
  // Never over a folder it did not write (a real model's weights would be replaced).
  const auto foreign = fresh_temp_dir("foreign");
  std::ofstream(foreign / "config.json") << R"({"model_type": "llama"})";
  expect_pagoda_error("make-model --arch tiny --out " + foreign.string(), "make-model did not write");
}

}  // namespace
}  // namespace pagoda

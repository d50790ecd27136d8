// The default model file read end to end, against values gguf-py's GGUFReader and
// gguf.quants.dequantize recorded (tools/make_format_fixtures.py).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <nlohmann/json.hpp>

#include "fixtures.h"
#include "pagoda/core/default_model.h"
#include "pagoda/format/dequantize.h"
#include "pagoda/format/gguf.h"

namespace pagoda {
namespace {

class SmolLM2 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // setup.sh installs the model; a missing one is a broken setup (default_model_path throws),
    // not a reason to skip.
    file_ = new GgufFile(GgufFile::open(default_model_path()));
    const std::vector<uint8_t> text =
        testing::read_bytes(testing::fixture_path("smollm2_q4_1.json"));
    expected_ = new nlohmann::json(nlohmann::json::parse(text.begin(), text.end()));
  }
  static void TearDownTestSuite() {
    delete file_;
    delete expected_;
  }
  static GgufFile* file_;
  static nlohmann::json* expected_;
};
GgufFile* SmolLM2::file_ = nullptr;
nlohmann::json* SmolLM2::expected_ = nullptr;

TEST_F(SmolLM2, Metadata) {
  ASSERT_NE(file_, nullptr);
  const GgufFile& f = *file_;
  const nlohmann::json& e = *expected_;
  EXPECT_EQ(f.version(), e["version"].get<uint32_t>());
  EXPECT_EQ(f.tensors().size(), e["tensor_count"].get<size_t>());
  EXPECT_EQ(f.metadata().size(), e["metadata_count"].get<size_t>());
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 30);
  EXPECT_EQ(f.get_int("llama.attention.head_count"), 9);
  EXPECT_EQ(f.get_int("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(f.get_int("llama.embedding_length"), 576);
  EXPECT_EQ(f.get_int("llama.context_length"), e["context_length"].get<int64_t>());
  EXPECT_EQ(f.get_float("llama.attention.layer_norm_rms_epsilon"), e["rms_epsilon"].get<double>());
  EXPECT_EQ(f.get_float("llama.rope.freq_base"), e["rope_freq_base"].get<double>());
  const std::vector<std::string> tokens = f.get_string_array("tokenizer.ggml.tokens");
  EXPECT_EQ(tokens.size(), e["token_count"].get<size_t>());
  for (size_t i = 0; i < e["first_tokens"].size(); ++i)
    EXPECT_EQ(tokens[i], e["first_tokens"][i].get<std::string>());
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.merges").size(), e["merge_count"].get<size_t>());
  const std::vector<int64_t> token_types = f.get_int_array("tokenizer.ggml.token_type");
  for (size_t i = 0; i < e["first_token_types"].size(); ++i)
    EXPECT_EQ(token_types[i], e["first_token_types"][i].get<int64_t>());
  EXPECT_EQ(f.get_int("tokenizer.ggml.bos_token_id"), e["bos_token_id"].get<int64_t>());
  EXPECT_EQ(f.get_int("tokenizer.ggml.eos_token_id"), e["eos_token_id"].get<int64_t>());
}

TEST_F(SmolLM2, TensorsDequantizeAsGgufPy) {
  ASSERT_NE(file_, nullptr);
  for (const auto& [name, e] : (*expected_)["tensors"].items()) {
    SCOPED_TRACE(name);
    const GgufTensorInfo* t = file_->find_tensor(name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(ggml_type_traits(uint32_t(t->type)).name, e["type"].get<std::string>());
    EXPECT_EQ(t->dims, e["dims"].get<std::vector<int64_t>>());
    std::vector<float> values(size_t(t->numel()));
    dequantize_row(t->type, t->data, values.data(), t->numel());
    const std::vector<uint32_t> first = e["first_bits"].get<std::vector<uint32_t>>();
    for (size_t i = 0; i < first.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(values[i]), first[i]) << "element " << i;
    }
    uint64_t bits_sum = 0;  // order-independent and exact: every element is checked
    double sum = 0;
    for (float v : values) {
      bits_sum += std::bit_cast<uint32_t>(v);
      sum += v;
    }
    EXPECT_EQ(bits_sum, e["bits_sum"].get<uint64_t>());
    // numpy sums pairwise, this loop in order: the doubles differ in the last bits only.
    EXPECT_NEAR(sum, e["sum"].get<double>(), 1e-9 * (1 + std::abs(sum)) + 1e-6);
  }
}

// Every tensor of the file dequantizes (the loader's whole-model path).
TEST_F(SmolLM2, EveryTensorDequantizes) {
  ASSERT_NE(file_, nullptr);
  std::vector<float> values;
  for (const GgufTensorInfo& t : file_->tensors()) {
    values.resize(size_t(t.numel()));
    ASSERT_NO_THROW(dequantize_row(t.type, t.data, values.data(), t.numel())) << t.name;
    ASSERT_TRUE(std::isfinite(values[0]) && std::isfinite(values.back())) << t.name;
  }
}

}  // namespace
}  // namespace pagoda

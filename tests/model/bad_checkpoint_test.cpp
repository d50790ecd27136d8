// Bad checkpoints end in pagoda::Error with the kind the CLI reports and a message that names the
// problem (the file, key or tensor), never in a crash or a silently wrong model. Each case starts
// from a good Hugging Face fixture (tests/model/fixtures/hf/) and breaks one thing, in a temporary
// folder; the GGUF case is built with tests/format/gguf_builder.h.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../format/gguf_builder.h"
#include "pagoda/backend/cpu/cpu_backend.h"
#include "pagoda/core/error.h"
#include "pagoda/model/model.h"

namespace pagoda {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kGood = fs::path(PAGODA_SOURCE_DIR) / "tests/model/fixtures/hf/llama";

// What a user does with a model path: open it, then load the weights.
void open_and_load(const fs::path& path) {
  const Checkpoint checkpoint = Checkpoint::open(path.string());
  CpuBackend backend;
  const Model model(checkpoint, backend, LoadOptions{.weight_dtype = DType::kF32, .show_progress = false});
}

// Runs `f`, which must throw pagoda::Error of `kind` whose message contains every one of `words`.
void expect_error(const std::function<void()>& f, ErrorKind kind, const std::vector<std::string>& words) {
  try {
    f();
    ADD_FAILURE() << "no error; expected " << error_kind_name(kind);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << "got " << error_kind_name(e.kind()) << ": " << e.what();
    for (const std::string& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << "'" << w << "' not in: " << e.what();
  }
  // Any other exception escapes and fails the test with its message.
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

void write_text(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

class BadCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("pagoda_bad_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The good llama fixture with its config.json edited by `edit`.
  void copy_good_with_config(const std::function<void(json&)>& edit) {
    fs::copy_file(kGood / "model.safetensors", dir_ / "model.safetensors");
    json config = read_json(kGood / "config.json");
    edit(config);
    write_text(dir_ / "config.json", config.dump(2));
  }

  fs::path dir_;
};

// The fixture itself loads: every failure below is caused by the one thing each test breaks.
TEST_F(BadCheckpoint, TheUnbrokenFixtureLoads) {
  copy_good_with_config([](json&) {});
  EXPECT_NO_THROW(open_and_load(dir_));
}

TEST_F(BadCheckpoint, FolderWithoutConfigJson) {
  fs::copy_file(kGood / "model.safetensors", dir_ / "model.safetensors");
  expect_error([&] { open_and_load(dir_); }, ErrorKind::kNotFound, {"config.json"});
}

TEST_F(BadCheckpoint, ConfigJsonThatIsNotJson) {
  fs::copy_file(kGood / "model.safetensors", dir_ / "model.safetensors");
  write_text(dir_ / "config.json", "{\"model_type\": \"llama\", \"hidden_size\": 48,");  // truncated
  expect_error([&] { open_and_load(dir_); }, ErrorKind::kCorrupt, {"config.json", "not valid JSON"});
}

TEST_F(BadCheckpoint, UnsupportedModelType) {
  copy_good_with_config([](json& c) { c["model_type"] = "gpt2"; });
  expect_error([&] { open_and_load(dir_); }, ErrorKind::kUnsupported, {"gpt2", "not supported"});
}

TEST_F(BadCheckpoint, MissingNumHiddenLayers) {
  copy_good_with_config([](json& c) { c.erase("num_hidden_layers"); });
  expect_error([&] { open_and_load(dir_); }, ErrorKind::kCorrupt, {"num_hidden_layers"});
}

// json::value() would throw json::type_error, which is not a pagoda::Error.
TEST_F(BadCheckpoint, FieldOfTheWrongType) {
  copy_good_with_config([](json& c) { c["rms_norm_eps"] = "1e-5"; });
  expect_error([&] { open_and_load(dir_); }, ErrorKind::kCorrupt, {"config.json", "wrong type"});
}

// The config is self-consistent, so opening succeeds; the tensors disagree with it at load.
TEST_F(BadCheckpoint, HiddenSizeThatDoesNotMatchTheTensors) {
  copy_good_with_config([](json& c) {
    ASSERT_EQ(c["hidden_size"], 48);
    c["hidden_size"] = 64;
  });
  EXPECT_NO_THROW(Checkpoint::open(dir_.string()));
  expect_error([&] { open_and_load(dir_); }, ErrorKind::kCorrupt, {"model.embed_tokens.weight", "expected [256, 64]"});
}

// A safetensors file holding every tensor of the good fixture but `drop`, repacked so the header
// offsets stay exact.
void write_safetensors_without(const fs::path& from, const fs::path& to, const std::string& drop) {
  std::ifstream in(from, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), 8);
  const json header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + ptrdiff_t(header_len));
  ASSERT_TRUE(header.contains(drop)) << drop << " is not in " << from;
  const char* data = bytes.data() + 8 + header_len;
  json out_header = json::object();
  std::string out_data;
  for (const auto& [name, entry] : header.items()) {
    if (name == drop) continue;
    if (name == "__metadata__") {
      out_header[name] = entry;
      continue;
    }
    const uint64_t begin = entry["data_offsets"][0], end = entry["data_offsets"][1];
    json e = entry;
    e["data_offsets"] = {out_data.size(), out_data.size() + (end - begin)};
    out_data.append(data + begin, end - begin);
    out_header[name] = e;
  }
  const std::string h = out_header.dump();
  const uint64_t n = h.size();
  std::ofstream out(to, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << h << out_data;
}

// A layer tensor, and the separate lm_head of an untied model: pagoda must not fall back to the
// embedding table when config.json says the head is its own tensor.
TEST_F(BadCheckpoint, MissingTensor) {
  for (const std::string missing : {"model.layers.1.mlp.down_proj.weight", "lm_head.weight"}) {
    SCOPED_TRACE(missing);
    fs::copy_file(kGood / "config.json", dir_ / "config.json", fs::copy_options::overwrite_existing);
    write_safetensors_without(kGood / "model.safetensors", dir_ / "model.safetensors", missing);
    expect_error([&] { open_and_load(dir_); }, ErrorKind::kNotFound, {"missing tensor", missing});
  }
}

// Llama 3's scaling is the only one pagoda implements; any other would silently change every
// position's rotation. transformers 5 writes the type in "rope_parameters", earlier versions in
// "rope_scaling": both must be checked.
TEST_F(BadCheckpoint, UnknownRopeScalingType) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    SCOPED_TRACE(key);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    copy_good_with_config([&](json& c) {
      c.erase("rope_parameters");
      c.erase("rope_scaling");
      c[key] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64}};
    });
    expect_error([&] { open_and_load(dir_); }, ErrorKind::kUnsupported, {"rope_scaling", "yarn"});
  }
}

// A GGUF whose metadata is a valid llama but whose embedding table is in a type pagoda has no
// dequantizer for. The reader knows these types' block sizes, so the file parses; loading fails.
TEST_F(BadCheckpoint, GgufTensorTypeWithoutDequantizer) {
  using testing::Bytes;
  using testing::GgufBuilder;
  constexpr uint32_t kHidden = 256, kVocab = 4;  // k-quant and IQ blocks hold 256 values
  for (const GgmlType type : {GgmlType::kQ2_K, GgmlType(16) /* iq2_xxs */}) {
    const GgmlTypeTraits traits = ggml_type_traits(uint32_t(type));
    SCOPED_TRACE(std::string(traits.name));
    ASSERT_FALSE(traits.can_dequantize) << "pick another type: pagoda now loads " << traits.name;
    GgufBuilder b;
    b.kv_string("general.architecture", "llama")
        .kv_pod<uint32_t>("llama.embedding_length", GgufValueType::kU32, kHidden)
        .kv_pod<uint32_t>("llama.feed_forward_length", GgufValueType::kU32, 512)
        .kv_pod<uint32_t>("llama.block_count", GgufValueType::kU32, 1)
        .kv_pod<uint32_t>("llama.attention.head_count", GgufValueType::kU32, 4)
        .kv_pod<uint32_t>("llama.context_length", GgufValueType::kU32, 128)
        .kv_pod<uint32_t>("llama.vocab_size", GgufValueType::kU32, kVocab)
        .kv_pod<float>("llama.attention.layer_norm_rms_epsilon", GgufValueType::kF32, 1e-5f)
        .tensor("token_embd.weight", {kHidden, kVocab}, type,
                std::vector<uint8_t>(kVocab * kHidden / size_t(traits.block_size) * size_t(traits.block_bytes)));
    const std::vector<uint8_t> bytes = b.build();
    const fs::path file = dir_ / "model.gguf";
    std::ofstream(file, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    expect_error([&] { open_and_load(file); }, ErrorKind::kUnsupported,
                 {"token_embd.weight", std::string(traits.name), "cannot load"});
  }
}

// The GGUF reader accepts a 0-dimensional tensor (a scalar); as a weight it is corrupt, and
// must be refused before anything reads its (absent) first dimension.
TEST_F(BadCheckpoint, GgufWeightWithoutDimensions) {
  testing::GgufBuilder b;
  b.kv_string("general.architecture", "llama")
      .kv_pod<uint32_t>("llama.embedding_length", GgufValueType::kU32, 64)
      .kv_pod<uint32_t>("llama.feed_forward_length", GgufValueType::kU32, 128)
      .kv_pod<uint32_t>("llama.block_count", GgufValueType::kU32, 1)
      .kv_pod<uint32_t>("llama.attention.head_count", GgufValueType::kU32, 4)
      .kv_pod<uint32_t>("llama.context_length", GgufValueType::kU32, 128)
      .kv_pod<uint32_t>("llama.vocab_size", GgufValueType::kU32, 4)
      .kv_pod<float>("llama.attention.layer_norm_rms_epsilon", GgufValueType::kF32, 1e-5f)
      .tensor("token_embd.weight", {}, GgmlType::kF32, std::vector<uint8_t>(4));
  const std::vector<uint8_t> bytes = b.build();
  const fs::path file = dir_ / "model.gguf";
  std::ofstream(file, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  expect_error([&] { open_and_load(file); }, ErrorKind::kCorrupt, {"token_embd.weight", "0 dimensions"});
}

}  // namespace
}  // namespace pagoda

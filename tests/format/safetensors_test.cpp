#include "pagoda/format/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "fixtures.h"
#include "pagoda/core/error.h"
#include "pagoda/core/half.h"

namespace pagoda {
namespace {

namespace fs = std::filesystem;

template <typename T>
std::vector<T> values_of(const SafetensorsTensor& t) {
  std::vector<T> out(t.nbytes / sizeof(T));
  std::memcpy(out.data(), t.data, t.nbytes);
  return out;
}

std::vector<float> halves_of(const SafetensorsTensor& t, float (*convert)(uint16_t)) {
  std::vector<float> out;
  for (uint16_t h : values_of<uint16_t>(t)) out.push_back(convert(h));
  return out;
}

// Values written by tools/make_format_fixtures.py with safetensors.torch.
TEST(Safetensors, SingleFileEveryDtype) {
  const SafetensorsFile f =
      SafetensorsFile::open(testing::fixture_path("safetensors/single/model.safetensors"));
  EXPECT_EQ(f.tensors().size(), 8u);
  const SafetensorsTensor* t = f.find("f32");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::kF32);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t->numel(), 6);
  EXPECT_EQ(values_of<float>(*t), (std::vector<float>{-0.5f, -0.25f, 0.f, 0.25f, 0.5f, 0.75f}));
  EXPECT_EQ(f.find("f16")->dtype, DType::kF16);
  EXPECT_EQ(halves_of(*f.find("f16"), f16_to_f32), (std::vector<float>{1.f, -2.f, 0.5f, 65504.f}));
  EXPECT_EQ(f.find("bf16")->dtype, DType::kBF16);
  EXPECT_EQ(f.find("bf16")->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(halves_of(*f.find("bf16"), bf16_to_f32),
            (std::vector<float>{1.f, -3.5f, 0.15625f, 0x1p100f}));
  EXPECT_EQ(f.find("i32")->dtype, DType::kI32);
  EXPECT_EQ(values_of<int32_t>(*f.find("i32")), (std::vector<int32_t>{-1, 0, 2147483647}));
  EXPECT_EQ(f.find("i64")->dtype, DType::kI64);
  EXPECT_EQ(values_of<int64_t>(*f.find("i64")),
            (std::vector<int64_t>{-(int64_t(1) << 53) - 1, 42}));
  EXPECT_EQ(f.find("u8")->dtype, DType::kU8);
  EXPECT_EQ(values_of<uint8_t>(*f.find("u8")), (std::vector<uint8_t>{0, 1, 254, 255}));
  EXPECT_TRUE(f.find("scalar")->shape.empty());
  EXPECT_EQ(f.find("scalar")->numel(), 1);
  EXPECT_EQ(values_of<float>(*f.find("scalar")), std::vector<float>{7.f});
  EXPECT_EQ(f.find("empty")->shape, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(f.find("empty")->nbytes, 0u);
  EXPECT_EQ(f.find("absent"), nullptr);
  const auto& meta = f.metadata();
  EXPECT_NE(std::find(meta.begin(), meta.end(),
                      std::pair<std::string, std::string>("note", "pagoda fixture")),
            meta.end());
}

TEST(Safetensors, ModelFromFolderOrFile) {
  for (const std::string& path : {testing::fixture_path("safetensors/single"),
                                  testing::fixture_path("safetensors/single/model.safetensors")}) {
    const SafetensorsModel m = SafetensorsModel::open(path);
    EXPECT_EQ(m.shards().size(), 1u);
    EXPECT_EQ(m.tensors().size(), 8u);
    EXPECT_EQ(m.tensors().front()->name, "bf16");  // sorted by name
    EXPECT_EQ(m.at("u8").dtype, DType::kU8);
  }
}

TEST(Safetensors, ShardedModel) {
  const SafetensorsModel m = SafetensorsModel::open(testing::fixture_path("safetensors/sharded"));
  EXPECT_EQ(m.shards().size(), 2u);
  ASSERT_EQ(m.tensors().size(), 3u);
  EXPECT_EQ(m.tensors()[0]->name, "lm_head.weight");
  EXPECT_EQ(m.tensors()[1]->name, "model.embed_tokens.weight");
  EXPECT_EQ(m.tensors()[2]->name, "model.norm.weight");
  const SafetensorsTensor& embed = m.at("model.embed_tokens.weight");
  EXPECT_EQ(embed.shape, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(values_of<float>(embed), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(halves_of(m.at("lm_head.weight"), f16_to_f32),
            (std::vector<float>{-0.f, -1, -2, -3, -4, -5, -6, -7}));
  EXPECT_EQ(halves_of(m.at("model.norm.weight"), bf16_to_f32), (std::vector<float>{1, 2}));
  EXPECT_EQ(m.find("absent"), nullptr);
  try {
    m.at("absent");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
  }
  const SafetensorsModel moved = SafetensorsModel(std::move(const_cast<SafetensorsModel&>(m)));
  EXPECT_EQ(moved.at("model.norm.weight").shape, (std::vector<int64_t>{2}));
}

// --- corrupt files, built here -------------------------------------------------------------

std::vector<uint8_t> file_bytes(const std::string& header, size_t data_size,
                                uint64_t claimed_len = 0) {
  const uint64_t len = claimed_len ? claimed_len : header.size();
  std::string s(8, '\0');
  std::memcpy(s.data(), &len, 8);
  s += header;
  s.append(data_size, '\0');
  return {s.begin(), s.end()};
}

void expect_error(const std::vector<uint8_t>& bytes, ErrorKind kind, const std::string& needle) {
  try {
    SafetensorsFile::parse(bytes, "x.safetensors");
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(SafetensorsCorrupt, ValidBaseline) {
  const auto f = SafetensorsFile::parse(
      file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8));
  EXPECT_EQ(f.tensors().size(), 1u);
}

TEST(SafetensorsCorrupt, Cases) {
  expect_error({1, 2, 3}, ErrorKind::kCorrupt, "shorter than the 8-byte header length");
  expect_error(file_bytes("{}", 0, 1000), ErrorKind::kCorrupt,
               "header length 1000 at offset 0 runs past end of file");
  expect_error(file_bytes("{}", 0, ~uint64_t(0)), ErrorKind::kCorrupt, "runs past end of file");
  expect_error(file_bytes(R"({"a":)", 0), ErrorKind::kCorrupt, "not valid JSON");
  expect_error(file_bytes("", 0), ErrorKind::kCorrupt, "not valid JSON");
  expect_error(file_bytes("[1, 2]", 0), ErrorKind::kCorrupt, "not a JSON object");
  expect_error(file_bytes(R"({"a": 5})", 0), ErrorKind::kCorrupt,
               "entry of tensor 'a' is not an object");
  expect_error(file_bytes(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4), ErrorKind::kCorrupt,
               "no dtype");
  expect_error(file_bytes(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", 4), ErrorKind::kCorrupt,
               "no shape");
  expect_error(file_bytes(R"({"a":{"dtype":"F32","shape":[1]}})", 4), ErrorKind::kCorrupt,
               "data_offsets");
  expect_error(file_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4),
               ErrorKind::kCorrupt, "data_offsets");
  expect_error(file_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-1,4]}})", 4),
               ErrorKind::kCorrupt, "data_offsets");
  expect_error(file_bytes(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
               ErrorKind::kCorrupt, "shape");
  expect_error(file_bytes(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4),
               ErrorKind::kCorrupt, "shape");
  expect_error(
      file_bytes(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})",
                 4),
      ErrorKind::kCorrupt, "overflows");
  expect_error(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4),
               ErrorKind::kCorrupt, "data_offsets [0, 8] lie outside the data section of 4 bytes");
  expect_error(file_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8),
               ErrorKind::kCorrupt, "outside");
  expect_error(file_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
               ErrorKind::kCorrupt, "holds 8 bytes but its shape and dtype F32 need 12");
  expect_error(file_bytes(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8),
               ErrorKind::kUnsupported, "dtype F64");
  expect_error(file_bytes(R"({"__metadata__":{"k":1}})", 0), ErrorKind::kCorrupt, "__metadata__");
  expect_error(file_bytes(R"({"__metadata__":[]})", 0), ErrorKind::kCorrupt, "__metadata__");
  expect_error(file_bytes("{\"\xff\":1}", 0), ErrorKind::kCorrupt, "not valid JSON");  // bad UTF-8
}

TEST(SafetensorsCorrupt, EveryTruncationThrows) {
  const std::vector<uint8_t> full =
      testing::read_bytes(testing::fixture_path("safetensors/single/model.safetensors"));
  ASSERT_NO_THROW(SafetensorsFile::parse(full));
  for (size_t n = 0; n < full.size(); ++n) {
    const std::vector<uint8_t> prefix(full.begin(), full.begin() + n);
    EXPECT_THROW(SafetensorsFile::parse(prefix), Error) << n;
  }
}

class ShardedFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("pagoda_safetensors_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::copy(testing::fixture_path("safetensors/sharded"), dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write_index(const std::string& text) {
    std::ofstream(dir_ / "model.safetensors.index.json") << text;
  }
  void expect_error(ErrorKind kind, const std::string& needle) {
    try {
      SafetensorsModel::open(dir_.string());
      ADD_FAILURE() << "expected an error containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
  fs::path dir_;
};

TEST_F(ShardedFolder, BadIndexes) {
  write_index("{not json");
  expect_error(ErrorKind::kCorrupt, "not valid JSON");
  write_index(R"({"metadata": {}})");
  expect_error(ErrorKind::kCorrupt, "no weight_map");
  write_index(R"({"weight_map": {"lm_head.weight": 3}})");
  expect_error(ErrorKind::kCorrupt, "not a string");
  write_index(R"({"weight_map": {"lm_head.weight": "../model-00002-of-00002.safetensors"}})");
  expect_error(ErrorKind::kCorrupt, "not a plain file name");
  write_index(R"({"weight_map": {"lm_head.weight": "missing.safetensors"}})");
  expect_error(ErrorKind::kNotFound, "missing.safetensors");
  write_index(R"({"weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}})");
  expect_error(ErrorKind::kCorrupt, "tensor 'lm_head.weight' is not in its shard");
  fs::copy_file(dir_ / "model-00001-of-00002.safetensors", dir_ / "copy.safetensors");
  write_index(R"({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors",
                                 "model.embed_tokens.weight": "copy.safetensors"}})");
  expect_error(ErrorKind::kCorrupt, "appears in more than one shard");
}

TEST_F(ShardedFolder, EmptyFolder) {
  fs::remove(dir_ / "model.safetensors.index.json");
  expect_error(ErrorKind::kNotFound, "holds neither");
}

}  // namespace
}  // namespace pagoda

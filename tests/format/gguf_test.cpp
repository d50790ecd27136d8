#include "pagoda/format/gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "gguf_builder.h"
#include "pagoda/core/error.h"
#include "pagoda/format/dequantize.h"

namespace pagoda {
namespace {

using testing::array_value;
using testing::Bytes;
using testing::GgufBuilder;
using VT = GgufValueType;

GgufFile parse(const std::vector<uint8_t>& bytes) { return GgufFile::parse(bytes, "test.gguf"); }

GgufBuilder every_value_type() {
  GgufBuilder b;
  b.kv_pod<uint8_t>("u8", VT::kU8, 200)
      .kv_pod<int8_t>("i8", VT::kI8, -100)
      .kv_pod<uint16_t>("u16", VT::kU16, 60000)
      .kv_pod<int16_t>("i16", VT::kI16, -30000)
      .kv_pod<uint32_t>("u32", VT::kU32, 4000000000u)
      .kv_pod<int32_t>("i32", VT::kI32, -2000000000)
      .kv_pod<float>("f32", VT::kF32, 0.1f)
      .kv_pod<uint8_t>("bool", VT::kBool, 1)
      .kv_string("string", "héllo")
      .kv_pod<uint64_t>("u64", VT::kU64, 18000000000000000000ull)
      .kv_pod<int64_t>("i64", VT::kI64, -9000000000000000000ll)
      .kv_pod<double>("f64", VT::kF64, 1e-300);
  return b;
}

TEST(Gguf, EveryScalarValueType) {
  const GgufFile f = parse(every_value_type().build());
  EXPECT_EQ(f.version(), 3u);
  ASSERT_EQ(f.metadata().size(), 12u);
  EXPECT_EQ(f.metadata()[0].first, "u8");  // file order kept
  EXPECT_EQ(f.get_int("u8"), 200);
  EXPECT_EQ(f.at("u8").type, VT::kU8);
  EXPECT_EQ(f.get_int("i8"), -100);
  EXPECT_EQ(f.get_int("u16"), 60000);
  EXPECT_EQ(f.get_int("i16"), -30000);
  EXPECT_EQ(f.get_int("u32"), 4000000000);
  EXPECT_EQ(f.get_int("i32"), -2000000000);
  EXPECT_EQ(f.get_float("f32"), double(0.1f));
  EXPECT_TRUE(f.at("bool").as_bool());
  EXPECT_EQ(f.get_string("string"), "héllo");
  EXPECT_EQ(std::get<uint64_t>(f.at("u64").value), 18000000000000000000ull);
  EXPECT_EQ(f.get_int("i64"), -9000000000000000000ll);
  EXPECT_EQ(f.get_float("f64"), 1e-300);
  EXPECT_EQ(f.get_float("u32"), 4000000000.0);  // integers read as floats
  EXPECT_TRUE(f.tensors().empty());
}

TEST(Gguf, TypedAccessErrorsNameKeyAndFile) {
  const GgufFile f = parse(every_value_type().build());
  for (auto get : {+[](const GgufFile& g) { g.get_string("u8"); },
                   +[](const GgufFile& g) { g.get_int("string"); },
                   +[](const GgufFile& g) { g.get_int("f32"); },
                   +[](const GgufFile& g) { g.get_int("u64"); },  // above int64
                   +[](const GgufFile& g) { g.get_string_array("string"); }}) {
    try {
      get(f);
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
      EXPECT_NE(std::string(e.what()).find("test.gguf"), std::string::npos) << e.what();
    }
  }
  try {
    f.get_int("absent.key");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
    EXPECT_EQ(std::string(e.what()), "missing metadata key 'absent.key' in test.gguf");
  }
  EXPECT_EQ(f.find("absent.key"), nullptr);
}

TEST(Gguf, ArraysFlatNestedAndEmpty) {
  GgufBuilder b;
  b.kv("tokens", VT::kArray, array_value(VT::kString, 3, Bytes().str("a").str("").str("<s>")));
  b.kv("scores", VT::kArray, array_value(VT::kF32, 2, Bytes().pod<float>(-1.5f).pod<float>(2.f)));
  b.kv("ids", VT::kArray, array_value(VT::kI32, 2, Bytes().pod<int32_t>(-7).pod<int32_t>(9)));
  // [[1, 2], [3]] as u16 arrays inside an array.
  const Bytes inner1 = array_value(VT::kU16, 2, Bytes().pod<uint16_t>(1).pod<uint16_t>(2));
  const Bytes inner2 = array_value(VT::kU16, 1, Bytes().pod<uint16_t>(3));
  b.kv("nested", VT::kArray, array_value(VT::kArray, 2, Bytes().append(inner1).append(inner2)));
  b.kv("empty", VT::kArray, array_value(VT::kString, 0, Bytes()));

  const GgufFile f = parse(b.build());
  EXPECT_EQ(f.get_string_array("tokens"), (std::vector<std::string>{"a", "", "<s>"}));
  EXPECT_EQ(f.at("tokens").array_type(), VT::kString);
  EXPECT_EQ(f.get_float_array("scores"), (std::vector<float>{-1.5f, 2.f}));
  EXPECT_EQ(f.get_int_array("ids"), (std::vector<int64_t>{-7, 9}));
  const GgufValue& nested = f.at("nested");
  EXPECT_EQ(nested.array_type(), VT::kArray);
  ASSERT_EQ(nested.as_array().size(), 2u);
  EXPECT_EQ(nested.as_array()[0].as_array()[1].as_int(), 2);
  EXPECT_EQ(nested.as_array()[1].as_array()[0].as_int(), 3);
  EXPECT_EQ(nested.as_array()[0].array_type(), VT::kU16);
  EXPECT_TRUE(f.get_string_array("empty").empty());
  EXPECT_EQ(f.at("empty").array_type(), VT::kU8);
}

TEST(Gguf, Version2And3ReadTheSame) {
  for (uint32_t version : {2u, 3u}) {
    GgufBuilder b = every_value_type();
    b.version = version;
    b.tensor("w", {4}, GgmlType::kF32, testing::f32_bytes({1, 2, 3, 4}));
    const std::vector<uint8_t> bytes = b.build();  // parse() keeps views into it
    const GgufFile f = parse(bytes);
    EXPECT_EQ(f.version(), version);
    EXPECT_EQ(f.get_string("string"), "héllo");
    ASSERT_NE(f.find_tensor("w"), nullptr);
    EXPECT_EQ(f.find_tensor("w")->data[4], 0x00);  // 2.0f = 0x40000000, little-endian
  }
}

TEST(Gguf, TensorsDefaultAlignment) {
  GgufBuilder b;
  b.kv_string("general.architecture", "llama");
  b.tensor("a", {3}, GgmlType::kF32, testing::f32_bytes({1, 2, 3}));  // 12 bytes, then padding
  b.tensor("q", {32, 2}, GgmlType::kQ8_0, std::vector<uint8_t>(68, 0));
  const std::vector<uint8_t> bytes = b.build();
  const GgufFile f = parse(bytes);
  EXPECT_EQ(f.alignment(), 32u);
  ASSERT_EQ(f.tensors().size(), 2u);
  const GgufTensorInfo& a = f.tensors()[0];
  EXPECT_EQ(a.name, "a");
  EXPECT_EQ(a.dims, (std::vector<int64_t>{3}));
  EXPECT_EQ(a.type, GgmlType::kF32);
  EXPECT_EQ(a.nbytes, 12u);
  EXPECT_EQ(a.numel(), 3);
  EXPECT_EQ(a.offset % 32, 0u);
  EXPECT_EQ(a.data, bytes.data() + a.offset);
  std::vector<float> values(3);
  dequantize_row(a.type, a.data, values.data(), 3);
  EXPECT_EQ(values, (std::vector<float>{1, 2, 3}));
  const GgufTensorInfo* q = f.find_tensor("q");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->nbytes, 68u);
  EXPECT_EQ(q->numel(), 64);
  EXPECT_EQ(q->offset, a.offset + 32);
  EXPECT_EQ(f.find_tensor("absent"), nullptr);
}

TEST(Gguf, CustomAlignment) {
  for (uint64_t alignment : {1u, 8u, 64u, 4096u}) {
    GgufBuilder b;
    b.alignment = alignment;
    b.kv_pod<uint32_t>("general.alignment", VT::kU32, uint32_t(alignment));
    b.tensor("a", {3}, GgmlType::kF32, testing::f32_bytes({1, 2, 3}));
    b.tensor("b", {2}, GgmlType::kF16, {0, 0x3c, 0, 0xc0});  // 1.0, -2.0
    const std::vector<uint8_t> bytes = b.build();
    const GgufFile f = parse(bytes);
    EXPECT_EQ(f.alignment(), alignment);
    for (const GgufTensorInfo& t : f.tensors()) EXPECT_EQ(t.offset % alignment, 0u);
    std::vector<float> values(2);
    dequantize_row(GgmlType::kF16, f.find_tensor("b")->data, values.data(), 2);
    EXPECT_EQ(values, (std::vector<float>{1.f, -2.f}));
  }
}

// A type pagoda can size but not dequantize parses; using it fails with a clear error.
TEST(Gguf, UndequantizableTypeFailsOnUse) {
  GgufBuilder b;
  b.tensor("w", {256}, GgmlType::kQ2_K, std::vector<uint8_t>(84, 0));
  const std::vector<uint8_t> bytes = b.build();
  const GgufFile f = parse(bytes);
  const GgufTensorInfo& t = f.tensors()[0];
  EXPECT_EQ(t.nbytes, 84u);
  std::vector<float> out(256);
  try {
    dequantize_row(t.type, t.data, out.data(), t.numel());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("q2_k"), std::string::npos);
  }
}

TEST(Gguf, OpenMapsAFile) {
  GgufBuilder b = every_value_type();
  b.tensor("w", {4}, GgmlType::kF32, testing::f32_bytes({1, 2, 3, 4}));
  const auto path = std::filesystem::temp_directory_path() / "pagoda_gguf_test.gguf";
  {
    const std::vector<uint8_t> bytes = b.build();
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  {
    const GgufFile f = GgufFile::open(path.string());
    EXPECT_EQ(f.origin(), path.string());
    float last;
    std::memcpy(&last, f.find_tensor("w")->data + 12, 4);
    EXPECT_EQ(last, 4.f);
    const GgufFile copy = f;  // copies share the mapping
    EXPECT_EQ(copy.find_tensor("w")->data, f.find_tensor("w")->data);
  }
  std::filesystem::remove(path);
  try {
    GgufFile::open("/nonexistent/model.gguf");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
  }
}

}  // namespace
}  // namespace pagoda

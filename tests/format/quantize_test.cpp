#include "pagoda/format/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/format/dequantize.h"
#include "pagoda/format/gguf.h"
#include "pagoda/format/gguf_writer.h"

namespace pagoda {
namespace {

std::vector<float> normal_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = dist(rng);
  return x;
}

struct Case {
  GgmlType type;
  double max_relative_rms;  // error RMS / value RMS for unit normal data
};

class QuantizeRoundTrip : public ::testing::TestWithParam<Case> {};

// The error of b-bit levels over a block's range is about range / 2^b / sqrt(12) per value: for a
// block of 32 normal values (range ~4.2) that is ~0.01 at 8 bits, ~0.04 at 5, ~0.08 at 4. A layout
// or packing mistake puts whole values in the wrong place: errors of order 1.
TEST_P(QuantizeRoundTrip, ErrorIsThatOfItsBits) {
  const Case c = GetParam();
  const GgmlTypeTraits traits = ggml_type_traits(uint32_t(c.type));
  const int64_t n = 256 * 64;
  const std::vector<float> x = normal_values(n, 7);
  std::vector<uint8_t> blocks(size_t(n / traits.block_size * traits.block_bytes));
  quantize_row(c.type, x.data(), blocks.data(), n);
  std::vector<float> y(static_cast<size_t>(n));
  dequantize_row(c.type, blocks.data(), y.data(), n);
  double err = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    err += double(x[i] - y[i]) * double(x[i] - y[i]);
    ref += double(x[i]) * double(x[i]);
  }
  EXPECT_LT(std::sqrt(err / ref), c.max_relative_rms) << traits.name;
  EXPECT_GT(std::sqrt(err / ref), c.max_relative_rms / 20) << traits.name << " should lose some precision";

  // A block of zeros stays zeros (no division by a zero scale).
  std::vector<float> zeros(size_t(traits.block_size), 0.f), back(size_t(traits.block_size), 1.f);
  quantize_row(c.type, zeros.data(), blocks.data(), traits.block_size);
  dequantize_row(c.type, blocks.data(), back.data(), traits.block_size);
  for (float v : back) EXPECT_EQ(v, 0.f) << traits.name;
}

INSTANTIATE_TEST_SUITE_P(Types, QuantizeRoundTrip,
                         ::testing::Values(Case{GgmlType::kQ8_0, 0.012}, Case{GgmlType::kQ6_K, 0.04},
                                           Case{GgmlType::kQ5_0, 0.06}, Case{GgmlType::kQ5_1, 0.05},
                                           Case{GgmlType::kQ5_K, 0.05}, Case{GgmlType::kQ4_0, 0.12},
                                           Case{GgmlType::kQ4_1, 0.1}, Case{GgmlType::kQ4_K, 0.1}),
                         [](const auto& info) { return std::string(ggml_type_traits(uint32_t(info.param.type)).name); });

// Q8_0 by hand: values -16..15, largest magnitude 16, so d = 16 / 127 and each value v is stored
// as round(v * 127 / 16).
TEST(Quantize, Q8_0ByHand) {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[size_t(j)] = float(j - 16);
  uint8_t block[34];
  quantize_row(GgmlType::kQ8_0, x.data(), block, 32);
  const float d = 16.f / 127.f;
  for (int j = 0; j < 32; ++j) EXPECT_EQ(int8_t(block[2 + j]), int(std::round(float(j - 16) * (1.f / d)))) << j;
  EXPECT_EQ(int8_t(block[2]), -127);
}

TEST(Quantize, BadInputIsAnError) {
  std::vector<float> x(100, 1.f);
  std::vector<uint8_t> out(1000);
  try {
    quantize_row(GgmlType::kQ4_K, x.data(), out.data(), 100);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("block size 256"), std::string::npos) << e.what();
  }
  try {
    quantize_row(GgmlType::kQ2_K, x.data(), out.data(), 256);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
  }
  EXPECT_FALSE(can_quantize(GgmlType::kQ8_1));
  EXPECT_TRUE(can_quantize(GgmlType::kQ6_K));
}

// What GgufWriter writes, GgufFile reads back: every metadata type used, tensors at aligned
// offsets with their bytes.
TEST(GgufWriter, ReadsBackWithGgufFile) {
  const std::string path = (std::filesystem::temp_directory_path() / "pagoda_gguf_writer_test.gguf").string();
  GgufWriter w(path);
  w.set("general.architecture", gguf_string("llama"));
  w.set("llama.block_count", gguf_u32(3));
  w.set("x.i32", gguf_i32(-5));
  w.set("x.f32", gguf_f32(0.25f));
  w.set("x.bool", gguf_bool(true));
  w.set("x.strings", gguf_string_array({"a", "bc", ""}));
  w.set("x.ints", gguf_i32_array({1, -2, 3}));
  w.set("x.floats", gguf_f32_array({1.5f, -2.f}));
  w.set("llama.block_count", gguf_u32(4));  // replaces
  const std::vector<float> a = normal_values(32 * 3, 1);
  std::vector<uint8_t> qa(34 * 3);
  quantize_row(GgmlType::kQ8_0, a.data(), qa.data(), 96);
  const std::vector<float> b = {1.f, 2.f, 3.f};
  EXPECT_EQ(w.add_tensor("a", {32, 3}, GgmlType::kQ8_0), qa.size());
  EXPECT_EQ(w.add_tensor("b", {3}, GgmlType::kF32), 12u);
  EXPECT_THROW(w.add_tensor("c", {33, 2}, GgmlType::kQ8_0), Error);
  w.write_header();
  w.write_data({qa.data(), 50});  // any split
  w.write_data({qa.data() + 50, qa.size() - 50});
  w.write_data({reinterpret_cast<const uint8_t*>(b.data()), 12});
  w.finish();

  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 4);
  EXPECT_EQ(f.get_int("x.i32"), -5);
  EXPECT_EQ(f.get_float("x.f32"), 0.25);
  EXPECT_TRUE(f.at("x.bool").as_bool());
  EXPECT_EQ(f.get_string_array("x.strings"), (std::vector<std::string>{"a", "bc", ""}));
  EXPECT_EQ(f.get_int_array("x.ints"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f.get_float_array("x.floats"), (std::vector<float>{1.5f, -2.f}));
  ASSERT_EQ(f.tensors().size(), 2u);
  const GgufTensorInfo& ta = f.tensors()[0];
  EXPECT_EQ(ta.type, GgmlType::kQ8_0);
  EXPECT_EQ(ta.dims, (std::vector<int64_t>{32, 3}));
  EXPECT_EQ(std::vector<uint8_t>(ta.data, ta.data + ta.nbytes), qa);
  EXPECT_EQ(f.tensors()[1].offset % 32, 0u);
  std::vector<float> rb(3);
  dequantize_row(GgmlType::kF32, f.tensors()[1].data, rb.data(), 3);
  EXPECT_EQ(rb, b);
  std::filesystem::remove(path);
}

TEST(GgufWriter, MissingOrExtraDataIsAnError) {
  const std::string path = (std::filesystem::temp_directory_path() / "pagoda_gguf_writer_short.gguf").string();
  GgufWriter w(path);
  w.add_tensor("a", {4}, GgmlType::kF32);
  w.write_header();
  const uint8_t bytes[20] = {};
  w.write_data({bytes, 8});
  EXPECT_THROW(w.finish(), Error);
  GgufWriter extra(path);
  extra.add_tensor("a", {4}, GgmlType::kF32);
  extra.write_header();
  EXPECT_THROW(extra.write_data({bytes, 20}), Error);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace pagoda

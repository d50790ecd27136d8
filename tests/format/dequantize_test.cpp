#include "pagoda/format/dequantize.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <string>
#include <vector>

#include "fixtures.h"
#include "pagoda/core/error.h"

namespace pagoda {
namespace {

struct Case {
  GgmlType type;
  const char* name;
};

class DequantizeFixture : public ::testing::TestWithParam<Case> {};

// Blocks and expected values come from gguf-py (tools/make_format_fixtures.py): quantized normal
// data and raw random blocks with finite scales. Both sides round each product and sum to fp32 in
// the same order, so agreement is bit-exact (nan payloads included for f16/bf16/f32).
TEST_P(DequantizeFixture, MatchesGgufPyBitExactly) {
  const Case c = GetParam();
  const std::vector<uint8_t> blocks =
      testing::read_bytes(testing::fixture_path(std::string("dequant/") + c.name + ".blocks"));
  const std::vector<uint8_t> expected_bytes =
      testing::read_bytes(testing::fixture_path(std::string("dequant/") + c.name + ".f32"));
  ASSERT_FALSE(blocks.empty());
  const GgmlTypeTraits traits = ggml_type_traits(uint32_t(c.type));
  ASSERT_EQ(blocks.size() % traits.block_bytes, 0u);
  const int64_t n = int64_t(blocks.size()) / traits.block_bytes * traits.block_size;
  ASSERT_EQ(expected_bytes.size(), size_t(n) * 4);

  std::vector<float> got(n);
  dequantize_row(c.type, blocks.data(), got.data(), n);
  int mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t want;
    std::memcpy(&want, expected_bytes.data() + 4 * i, 4);
    const uint32_t have = std::bit_cast<uint32_t>(got[i]);
    if (want != have && ++mismatches <= 5) {
      ADD_FAILURE() << c.name << " element " << i << " (block " << i / traits.block_size
                    << "): got " << got[i] << " (0x" << std::hex << have << "), want "
                    << std::bit_cast<float>(want) << " (0x" << want << std::dec << ")";
    }
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, DequantizeFixture,
    ::testing::Values(Case{GgmlType::kF32, "f32"}, Case{GgmlType::kF16, "f16"},
                      Case{GgmlType::kBF16, "bf16"}, Case{GgmlType::kQ4_0, "q4_0"},
                      Case{GgmlType::kQ4_1, "q4_1"}, Case{GgmlType::kQ5_0, "q5_0"},
                      Case{GgmlType::kQ5_1, "q5_1"}, Case{GgmlType::kQ8_0, "q8_0"},
                      Case{GgmlType::kQ4_K, "q4_k"}, Case{GgmlType::kQ5_K, "q5_k"},
                      Case{GgmlType::kQ6_K, "q6_k"}),
    [](const auto& info) { return std::string(info.param.name); });

// A block read from an odd address: the dequantizers must not assume alignment (UBSan checks).
TEST(Dequantize, UnalignedSource) {
  const std::vector<uint8_t> blocks =
      testing::read_bytes(testing::fixture_path("dequant/q4_k.blocks"));
  std::vector<uint8_t> shifted(blocks.size() + 1);
  std::memcpy(shifted.data() + 1, blocks.data(), blocks.size());
  std::vector<float> a(256), b(256);
  dequantize_row(GgmlType::kQ4_K, blocks.data(), a.data(), 256);
  dequantize_row(GgmlType::kQ4_K, shifted.data() + 1, b.data(), 256);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), 256 * sizeof(float)), 0);
}

TEST(Dequantize, UnsupportedTypeNamesIt) {
  std::vector<uint8_t> block(84);
  std::vector<float> out(256);
  try {
    dequantize_row(GgmlType::kQ2_K, block.data(), out.data(), 256);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("q2_k"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dequantize_row(GgmlType(1000), block.data(), out.data(), 256), Error);
}

TEST(Dequantize, RejectsPartialBlocks) {
  std::vector<uint8_t> block(18);
  std::vector<float> out(32);
  try {
    dequantize_row(GgmlType::kQ4_0, block.data(), out.data(), 31);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  }
}

TEST(GgmlTypeTraits, KnownAndUnknown) {
  EXPECT_EQ(ggml_type_traits(3).name, "q4_1");
  EXPECT_EQ(ggml_type_traits(3).block_size, 32);
  EXPECT_EQ(ggml_type_traits(3).block_bytes, 20);
  EXPECT_EQ(ggml_type_traits(14).block_bytes, 210);
  EXPECT_TRUE(ggml_type_traits(30).can_dequantize);
  EXPECT_FALSE(ggml_type_traits(10).can_dequantize);  // q2_k: sized, not dequantized
  EXPECT_EQ(ggml_type_traits(10).block_bytes, 84);
  for (uint32_t unknown : {4u, 5u, 31u, 1000u, 0xffffffffu}) {
    EXPECT_EQ(ggml_type_traits(unknown).name, "unknown");
    EXPECT_EQ(ggml_type_traits(unknown).block_size, 0);
    EXPECT_FALSE(ggml_type_traits(unknown).can_dequantize);
  }
}

}  // namespace
}  // namespace pagoda

#include "pagoda/core/half.h"

#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <limits>

namespace pagoda {
namespace {

// The scalar conversions must agree bit for bit with the hardware's (F16C), which implements
// IEEE round-to-nearest-even: every fp16 value, and a sweep of fp32 values around each boundary.
TEST(Half, F16ToF32MatchesHardwareForEveryValue) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float expected = _cvtsh_ss(uint16_t(h));
    const float got = f16_to_f32(uint16_t(h));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(expected)) << h;
    }
  }
}

TEST(Half, F32ToF16MatchesHardware) {
  int checked = 0;
  for (uint64_t x = 0; x <= 0xffffffffull; x += 0x1fff) {  // ~525k values over all exponents
    const float f = std::bit_cast<float>(uint32_t(x));
    const uint16_t expected = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
    const uint16_t got = f32_to_f16(f);
    if (std::isnan(f)) {
      EXPECT_EQ(got & 0x7c00, 0x7c00);
      EXPECT_NE(got & 0x3ff, 0);
    } else {
      ASSERT_EQ(got, expected) << std::hex << x;
    }
    ++checked;
  }
  // Exact halfway cases round to even.
  EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_GT(checked, 500000);
}

TEST(Half, Bf16RoundTrip) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-3.5f)), -3.5f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: rounds to even (1).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::infinity()))));
}

}  // namespace
}  // namespace pagoda

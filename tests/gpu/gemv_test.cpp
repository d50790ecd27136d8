// gemv (the decode-batch weight stream) against a host dot product in double over the same
// rounded inputs, with gemm_test.cpp's tolerance: |got - ref| <= u_out |ref| +
// 8 sqrt(k) 2^-24 sum_j |x_j w_j| + 1e-6. Shapes with a partial last CTA (n = 100) and a
// remainder after the unrolled loop (k = 1000), and the model's.
#include "gpu_test.h"
#include "pagoda/backend/cuda/gemv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/core/half.h"

namespace pagoda::cuda {
namespace {

float to_f32(DType dtype, uint16_t bits) { return dtype == DType::kF16 ? f16_to_f32(bits) : bf16_to_f32(bits); }
uint16_t from_f32(DType dtype, float x) { return dtype == DType::kF16 ? f32_to_f16(x) : f32_to_bf16(x); }

std::vector<uint16_t> random_values(DType dtype, size_t count, float scale, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, scale);
  std::vector<uint16_t> bits(count);
  for (auto& b : bits) b = from_f32(dtype, normal(rng));
  return bits;
}

double output_at(const std::vector<uint8_t>& out, DType out_dtype, int64_t n, int64_t row, int64_t col) {
  const size_t index = size_t(row * n + col);
  if (out_dtype == DType::kF32) {
    float value;
    std::memcpy(&value, &out[index * 4], 4);
    return value;
  }
  uint16_t bits;
  std::memcpy(&bits, &out[index * 2], 2);
  return to_f32(out_dtype, bits);
}

class GpuGemv : public GpuTest {};

TEST_F(GpuGemv, MatchesHostAndRepeatsBitForBit) {
  std::mt19937 rng(3);
  const std::pair<int64_t, int64_t> weight_shapes[] = {{100, 1000}, {4096, 4096}, {512, 14336}};
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    for (const auto& [n, k] : weight_shapes) {
      const std::vector<uint16_t> w = random_values(dtype, size_t(n * k), float(1.0 / std::sqrt(double(k))), rng);
      const std::vector<uint16_t> bias = random_values(dtype, size_t(n), 0.5f, rng);
      DeviceArray<uint16_t> d_w, d_bias;
      d_w.upload(w);
      d_bias.upload(bias);
      for (int64_t m = 1; m <= kGemvMaxRows; ++m) {
        const std::vector<uint16_t> x = random_values(dtype, size_t(m * k), 1.f, rng);
        DeviceArray<uint16_t> d_x;
        d_x.upload(x);
        for (const auto& [out_dtype, with_bias] : {std::pair{dtype, false}, std::pair{dtype, true}, std::pair{DType::kF32, false}}) {
          SCOPED_TRACE(testing::Message() << "m " << m << " n " << n << " k " << k << " " << dtype_name(dtype) << " -> "
                                          << dtype_name(out_dtype) << (with_bias ? " + bias" : ""));
          ASSERT_TRUE(gemv_supported(m, k, dtype, out_dtype, d_x.data(), d_w.data()));
          const size_t out_bytes = size_t(m * n) * dtype_size(out_dtype);
          DeviceArray<uint8_t> d_first(out_bytes), d_second(out_bytes);
          const void* bias_ptr = with_bias ? d_bias.data() : nullptr;
          gemv(d_x.data(), d_w.data(), bias_ptr, d_first.data(), m, n, k, dtype, out_dtype, nullptr);
          gemv(d_x.data(), d_w.data(), bias_ptr, d_second.data(), m, n, k, dtype, out_dtype, nullptr);
          check_cuda(cudaDeviceSynchronize(), "sync");
          const std::vector<uint8_t> first = d_first.download();
          ASSERT_EQ(first, d_second.download());
          const double u_out = out_dtype == DType::kF16 ? 0x1p-11 : out_dtype == DType::kBF16 ? 0x1p-8 : 0.0;
          const double accumulation = 8.0 * std::sqrt(double(k)) * 0x1p-24;
          for (int64_t row = 0; row < m; ++row) {
            for (int64_t col = 0; col < n; col += (n > 512 ? 37 : 1)) {
              double ref = with_bias ? to_f32(dtype, bias[size_t(col)]) : 0.0, magnitude = 0.0;
              for (int64_t j = 0; j < k; ++j) {
                const double product = double(to_f32(dtype, x[size_t(row * k + j)])) * to_f32(dtype, w[size_t(col * k + j)]);
                ref += product;
                magnitude += std::abs(product);
              }
              ASSERT_NEAR(output_at(first, out_dtype, n, row, col), ref, u_out * std::abs(ref) + accumulation * magnitude + 1e-6)
                  << "row " << row << " col " << col;
            }
          }
        }
      }
    }
  }
}

TEST(GemvSupported, OnlyWhatItRuns) {
  alignas(16) static uint16_t buffer[16];
  EXPECT_TRUE(gemv_supported(8, 64, DType::kF16, DType::kF32, buffer, buffer));
  EXPECT_FALSE(gemv_supported(9, 64, DType::kF16, DType::kF16, buffer, buffer));
  EXPECT_FALSE(gemv_supported(1, 60, DType::kF16, DType::kF16, buffer, buffer));
  EXPECT_FALSE(gemv_supported(1, 64, DType::kF32, DType::kF32, buffer, buffer));
  EXPECT_FALSE(gemv_supported(1, 64, DType::kBF16, DType::kF16, buffer, buffer));
  EXPECT_FALSE(gemv_supported(1, 64, DType::kF16, DType::kF16, buffer + 1, buffer));
}

}  // namespace
}  // namespace pagoda::cuda

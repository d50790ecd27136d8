// The CPU backend's ops against plain double-precision references, over both matmul paths
// (streaming for few rows, widened panels + sgemm for many) and every weight dtype, at the
// tighter tolerances of f32 sums the CPU computes in double or in few terms; the backend-op
// table (backend_ops_test.cpp) checks every op at its derived tolerance, and add, add_rms_norm
// and embed only there.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "pagoda/backend/cpu/cpu_backend.h"
#include "pagoda/backend/cpu/elementwise.h"
#include "pagoda/core/error.h"
#include "pagoda/core/half.h"

namespace pagoda {
namespace {

std::vector<float> random_vector(size_t n, uint64_t seed, float scale = 1.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// Weights stored as `dtype`, and the f32 values they hold after rounding (the reference uses those).
struct Weights {
  std::vector<uint16_t> half;
  std::vector<float> values;
  Tensor tensor;
};

Weights make_weights(int64_t m, int64_t k, DType dtype, uint64_t seed) {
  Weights w;
  w.values = random_vector(size_t(m * k), seed, 0.1f);
  if (dtype == DType::kF32) {
    w.tensor = Tensor::contiguous(w.values.data(), dtype, {m, k});
    return w;
  }
  w.half.resize(w.values.size());
  for (size_t i = 0; i < w.values.size(); ++i) {
    w.half[i] = dtype == DType::kF16 ? f32_to_f16(w.values[i]) : f32_to_bf16(w.values[i]);
    w.values[i] = dtype == DType::kF16 ? f16_to_f32(w.half[i]) : bf16_to_f32(w.half[i]);
  }
  w.tensor = Tensor::contiguous(w.half.data(), dtype, {m, k});
  return w;
}

struct MatmulCase {
  int64_t n, m, k;
  DType dtype;
  bool bias;
};

class CpuMatmul : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(CpuMatmul, MatchesReference) {
  const MatmulCase c = GetParam();
  CpuBackend backend;
  Weights w = make_weights(c.m, c.k, c.dtype, 1);
  std::vector<float> x = random_vector(size_t(c.n * c.k), 2), bias = random_vector(size_t(c.m), 3);
  std::vector<float> out(size_t(c.n * c.m), NAN);
  const Tensor bias_t = Tensor::contiguous(bias.data(), DType::kF32, {c.m});
  backend.matmul(Tensor::contiguous(x.data(), DType::kF32, {c.n, c.k}), w.tensor, c.bias ? &bias_t : nullptr,
                 Tensor::contiguous(out.data(), DType::kF32, {c.n, c.m}));
  for (int64_t r = 0; r < c.n; ++r)
    for (int64_t j = 0; j < c.m; ++j) {
      double ref = c.bias ? bias[size_t(j)] : 0.0, magnitude = 0;
      for (int64_t i = 0; i < c.k; ++i) {
        ref += double(x[size_t(r * c.k + i)]) * w.values[size_t(j * c.k + i)];
        magnitude += std::fabs(double(x[size_t(r * c.k + i)]) * w.values[size_t(j * c.k + i)]);
      }
      // f32 accumulation: error grows with the sum of |terms|.
      ASSERT_NEAR(out[size_t(r * c.m + j)], ref, 1e-5 * magnitude + 1e-6) << "row " << r << " col " << j;
    }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CpuMatmul,
    ::testing::Values(MatmulCase{1, 37, 64, DType::kF16, false}, MatmulCase{3, 64, 576, DType::kF16, true},
                      MatmulCase{4, 19, 35, DType::kBF16, false}, MatmulCase{8, 300, 72, DType::kF32, true},
                      MatmulCase{9, 300, 72, DType::kF16, true}, MatmulCase{33, 513, 100, DType::kBF16, false},
                      MatmulCase{40, 64, 128, DType::kF32, false}, MatmulCase{5, 7, 13, DType::kF16, true}));

TEST(CpuOps, RmsNorm) {
  CpuBackend backend;
  const int64_t n = 3, h = 100;
  std::vector<float> x = random_vector(size_t(n * h), 4), w = random_vector(size_t(h), 5), out(size_t(n * h));
  backend.rms_norm(Tensor::contiguous(x.data(), DType::kF32, {n, h}), Tensor::contiguous(w.data(), DType::kF32, {h}),
                   1e-5f, Tensor::contiguous(out.data(), DType::kF32, {n, h}));
  for (int64_t r = 0; r < n; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < h; ++c) ss += double(x[size_t(r * h + c)]) * x[size_t(r * h + c)];
    const double inv = 1.0 / std::sqrt(ss / h + 1e-5);
    for (int64_t c = 0; c < h; ++c)
      EXPECT_NEAR(out[size_t(r * h + c)], x[size_t(r * h + c)] * inv * w[size_t(c)], 1e-5);
  }
}

// Rotate-half RoPE: pair (i, i + d/2) rotates by position * inv_freq[i].
TEST(CpuOps, RopeRotatesHalfPairs) {
  const int64_t n = 4, heads = 3, d = 8;
  std::vector<float> x = random_vector(size_t(n * heads * d), 6), original = x;
  const std::vector<int32_t> positions = {0, 1, 7, 1000};
  const std::vector<float> inv_freq = {1.f, 0.1f, 0.01f, 0.001f};
  cpu::rope(Tensor::contiguous(x.data(), DType::kF32, {n, heads, d}), positions, inv_freq);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t hd = 0; hd < heads; ++hd)
      for (int64_t i = 0; i < d / 2; ++i) {
        const size_t base = size_t((r * heads + hd) * d);
        const double angle = double(float(positions[size_t(r)]) * inv_freq[size_t(i)]);
        const double a = original[base + size_t(i)], b = original[base + size_t(i + d / 2)];
        EXPECT_NEAR(x[base + size_t(i)], a * std::cos(angle) - b * std::sin(angle), 1e-5);
        EXPECT_NEAR(x[base + size_t(i + d / 2)], b * std::cos(angle) + a * std::sin(angle), 1e-5);
      }
}

TEST(CpuOps, SiluMul) {
  CpuBackend backend;
  const int64_t n = 2, width = 5;
  std::vector<float> gate_up = random_vector(size_t(n * 2 * width), 7), out(size_t(n * width));
  backend.silu_mul(Tensor::contiguous(gate_up.data(), DType::kF32, {n, 2 * width}),
                   Tensor::contiguous(out.data(), DType::kF32, {n, width}));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < width; ++c) {
      const double g = gate_up[size_t(r * 2 * width + c)], u = gate_up[size_t(r * 2 * width + width + c)];
      EXPECT_NEAR(out[size_t(r * width + c)], g / (1 + std::exp(-g)) * u, 1e-6);
    }
}

TEST(CpuOps, EmbedRejectsBadIds) {
  CpuBackend backend;
  Weights table = make_weights(10, 6, DType::kF16, 9);
  std::vector<float> out(6);
  StepBatch step;
  step.tokens = {10};
  EXPECT_THROW(backend.embed(table.tensor, step, Tensor::contiguous(out.data(), DType::kF32, {1, 6})), Error);
  step.tokens = {-1};
  EXPECT_THROW(backend.embed(table.tensor, step, Tensor::contiguous(out.data(), DType::kF32, {1, 6})), Error);
}

}  // namespace
}  // namespace pagoda

// The quantized matmul (q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k weights, int8 activations)
// against a double-precision product of the same weights dequantized by format/dequantize.h
// (ggml's reference dequantization, tested bit-exact against gguf-py), on every kernel ISA the
// CPU runs.
//
// Tolerances, per output y = sum_i w_i x_i (w_i the dequantized weights):
// - Activation quantization. Each block of 32 activations is stored as q * dx, dx = max|x| / 127,
//   q rounded to nearest, so |x_i - q_i dx| <= dx / 2 and the product moves by at most
//   E_q = sum over blocks of dx / 2 * sum_{i in block} |w_i|.
// - f32 arithmetic. The kernel computes each 32-group's integer dot product exactly (|sum| <
//   2^24), scales it by d_w * dx (one rounding) and adds it with one FMA to one of 8 lane sums
//   (G = k / 32 groups, then 3 adds across lanes); the constant term m * (dx sum q) is summed in
//   f32 the same way. Each kept value is at most |d_w q_i x_i| + |m x_i| <= (|w_i| + 2 |m|) |x_i|
//   per element, where m is the block's minimum or offset (bounded from its header below), so the
//   rounding errors sum to at most (G + 8) u A with u = 2^-24 and A = sum_i (|w_i| + 2 M_i) |x_i|;
//   the reference's own rounding of each w_i = d q + m to f32 adds 2 u A. We allow
//   E_f = (G + 10) 2^-23 A (a factor 2 of margin).
// With activations that are exact multiples of a power-of-two block scale, E_q is 0 and only E_f
// remains: a tight test that every bit of every format is unpacked right. With normal
// activations the bound is E_q + E_f, and the test prints the largest error seen as a share of it.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "pagoda/backend/cpu/quant_matmul.h"
#include "pagoda/core/half.h"
#include "pagoda/format/dequantize.h"

namespace pagoda::cpu {
namespace {

struct Format {
  DType dtype;
  GgmlType ggml;
  std::vector<int> f16_fields;  // byte offsets of the fp16 scales in a block
};

const std::vector<Format> kFormats = {
    {DType::kQ4_0, GgmlType::kQ4_0, {0}},    {DType::kQ4_1, GgmlType::kQ4_1, {0, 2}},
    {DType::kQ5_0, GgmlType::kQ5_0, {0}},    {DType::kQ5_1, GgmlType::kQ5_1, {0, 2}},
    {DType::kQ8_0, GgmlType::kQ8_0, {0}},    {DType::kQ4_K, GgmlType::kQ4_K, {0, 2}},
    {DType::kQ5_K, GgmlType::kQ5_K, {0, 2}}, {DType::kQ6_K, GgmlType::kQ6_K, {208}},
};

float f16_at(const uint8_t* p) { return f16_to_f32(uint16_t(p[0] | p[1] << 8)); }

// Bound on |m|, the constant a block adds to each of its weights in the kernel's decomposition
// w = d q + m (0 for the signed formats).
float minimum_bound(DType t, const uint8_t* block) {
  switch (t) {
    case DType::kQ4_0: return 8 * std::fabs(f16_at(block));
    case DType::kQ5_0: return 16 * std::fabs(f16_at(block));
    case DType::kQ4_1: case DType::kQ5_1: return std::fabs(f16_at(block + 2));
    case DType::kQ4_K: case DType::kQ5_K: return 63 * std::fabs(f16_at(block + 2));
    default: return 0;
  }
}

// Random blocks: every quant bit random, scales finite normal-ish fp16 values.
std::vector<uint8_t> random_blocks(const Format& f, int64_t m, int64_t k, std::mt19937_64& rng) {
  const size_t block_bytes_ = block_bytes(f.dtype);
  const int64_t blocks = m * k / block_elements(f.dtype);
  std::vector<uint8_t> bytes(size_t(blocks) * block_bytes_);
  for (uint8_t& b : bytes) b = uint8_t(rng());
  std::normal_distribution<float> scale(0.f, 0.01f);
  for (int64_t b = 0; b < blocks; ++b)
    for (int off : f.f16_fields) {
      const uint16_t h = f32_to_f16(scale(rng));
      bytes[size_t(b) * block_bytes_ + size_t(off)] = uint8_t(h);
      bytes[size_t(b) * block_bytes_ + size_t(off) + 1] = uint8_t(h >> 8);
    }
  return bytes;
}

struct Result {
  double worst_share_of_bound = 0;  // max |error| / tolerance over outputs
  double worst_quantization_share = 0;  // max |error| / E_q (normal activations)
};

// Runs the kernel on (n x k activations, m x k weights) and checks every output against its bound.
Result check(const Format& f, QuantIsa isa, int64_t n, int64_t m, int64_t k, const std::vector<float>& x,
             bool with_bias, std::mt19937_64& rng) {
  const std::vector<uint8_t> w = random_blocks(f, m, k, rng);
  const size_t row_bytes = dtype_bytes(f.dtype, k);
  std::vector<float> wf(size_t(m * k));
  for (int64_t j = 0; j < m; ++j) dequantize_row(f.ggml, w.data() + size_t(j) * row_bytes, wf.data() + j * k, k);
  std::vector<float> bias(static_cast<size_t>(m));
  for (float& b : bias) b = float(int(rng() % 200) - 100) / 64.f;
  std::vector<float> out(size_t(n * m), NAN);
  quant_matmul(Tensor::contiguous(const_cast<float*>(x.data()), DType::kF32, {n, k}),
               Tensor::contiguous(const_cast<uint8_t*>(w.data()), f.dtype, {m, k}), with_bias ? bias.data() : nullptr,
               Tensor::contiguous(out.data(), DType::kF32, {n, m}), isa);
  const int64_t per_block = block_elements(f.dtype), groups = k / 32;
  Result result;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < m; ++j) {
      double reference = with_bias ? bias[size_t(j)] : 0.0, e_q = 0, a = 0;
      for (int64_t g = 0; g < groups; ++g) {
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[size_t(r * k + g * 32 + i)]));
        const double dx = double(amax) / 127;
        for (int i = 0; i < 32; ++i) {
          const int64_t c = g * 32 + i;
          const double wv = wf[size_t(j * k + c)], xv = x[size_t(r * k + c)];
          const uint8_t* block = w.data() + size_t(j) * row_bytes + size_t(c / per_block) * block_bytes(f.dtype);
          reference += wv * xv;
          e_q += dx / 2 * std::fabs(wv);
          a += (std::fabs(wv) + 2 * double(minimum_bound(f.dtype, block))) * std::fabs(xv);
        }
      }
      const double e_f = double(groups + 10) * std::ldexp(1.0, -23) * a;
      const double tolerance = 1.0001 * e_q + e_f;  // 1.0001: dx itself is an f32 quotient
      const double got = out[size_t(r * m + j)];
      const double error = std::fabs(got - reference);
      EXPECT_LE(error, tolerance) << dtype_name(f.dtype) << " " << quant_isa_name(isa) << " row " << r << " col " << j
                                  << ": got " << got << ", want " << reference;
      result.worst_share_of_bound = std::max(result.worst_share_of_bound, error / tolerance);
      if (e_q > 0) result.worst_quantization_share = std::max(result.worst_quantization_share, error / e_q);
    }
  }
  return result;
}

std::vector<QuantIsa> isas() {
  std::vector<QuantIsa> v;
  for (QuantIsa isa : {QuantIsa::kAvx2, QuantIsa::kAvx512Vnni})
    if (quant_isa_supported(isa)) v.push_back(isa);
  return v;
}

// Activations that 8-bit block quantization stores exactly: integers in [-127, 127] times a
// power-of-two scale per block of 32, one of them +-127 so that the block's maximum fixes it.
std::vector<float> exact_activations(int64_t n, int64_t k, std::mt19937_64& rng) {
  std::vector<float> x(size_t(n * k));
  for (int64_t g = 0; g < n * k / 32; ++g) {
    const float scale = std::ldexp(1.f, int(rng() % 12) - 10);
    for (int i = 0; i < 32; ++i) x[size_t(g * 32 + i)] = float(int(rng() % 255) - 127) * scale;
    x[size_t(g * 32 + int(rng() % 32))] = (rng() % 2 ? 127.f : -127.f) * scale;
  }
  return x;
}

struct Shape {
  int64_t n, m, k;
};
// n: decode (1), a few sequences, and prefill tiles with remainders; m odd for the one-row tile.
const std::vector<Shape> kShapes = {{1, 33, 512}, {3, 16, 256}, {4, 7, 768}, {9, 20, 512}};

TEST(QuantMatmul, ExactActivationsLeaveOnlyRounding) {
  std::mt19937_64 rng(7);
  for (const Format& f : kFormats)
    for (QuantIsa isa : isas())
      for (const Shape& s : kShapes) {
        const Result r = check(f, isa, s.n, s.m, s.k, exact_activations(s.n, s.k, rng), s.n % 2 == 1, rng);
        EXPECT_LE(r.worst_share_of_bound, 1.0);
      }
}

TEST(QuantMatmul, NormalActivationsWithinQuantizationBound) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (const Format& f : kFormats)
    for (QuantIsa isa : isas()) {
      Result worst;
      for (const Shape& s : kShapes) {
        std::vector<float> x(size_t(s.n * s.k));
        for (float& v : x) v = normal(rng);
        const Result r = check(f, isa, s.n, s.m, s.k, x, s.n % 2 == 0, rng);
        worst.worst_quantization_share = std::max(worst.worst_quantization_share, r.worst_quantization_share);
      }
      std::printf("  %-5s %-11s largest error = %.3f of the 8-bit activation bound E_q\n",
                  std::string(dtype_name(f.dtype)).c_str(), quant_isa_name(isa), worst.worst_quantization_share);
    }
}

// The engine promises the same text however requests are batched. Activations are re-quantized
// to 8 bits before every matmul, so a last-bit difference in one layer can move a rounding
// boundary and grow into a visible one a few layers later: each row's result must not depend on
// the rows beside it (their count decides the tile shapes) by a single bit.
TEST(QuantMatmul, RowsAreBitExactWhateverTheBatch) {
  std::mt19937_64 rng(13);
  std::normal_distribution<float> normal(0.f, 1.f);
  constexpr int64_t n = 11, m = 9, k = 512;  // tiles of 4, 4, 3 rows and a one-row weight tile
  for (const Format& f : kFormats)
    for (QuantIsa isa : isas()) {
      const std::vector<uint8_t> w = random_blocks(f, m, k, rng);
      const Tensor wt = Tensor::contiguous(const_cast<uint8_t*>(w.data()), f.dtype, {m, k});
      std::vector<float> x(size_t(n * k)), all(size_t(n * m)), one(static_cast<size_t>(m));
      for (float& v : x) v = normal(rng);
      quant_matmul(Tensor::contiguous(x.data(), DType::kF32, {n, k}), wt, nullptr,
                   Tensor::contiguous(all.data(), DType::kF32, {n, m}), isa);
      for (int64_t r = 0; r < n; ++r) {
        quant_matmul(Tensor::contiguous(x.data() + r * k, DType::kF32, {1, k}), wt, nullptr,
                     Tensor::contiguous(one.data(), DType::kF32, {1, m}), isa);
        for (int64_t j = 0; j < m; ++j)
          ASSERT_EQ(one[size_t(j)], all[size_t(r * m + j)])
              << dtype_name(f.dtype) << " " << quant_isa_name(isa) << " row " << r << " col " << j;
      }
    }
}

// 8-bit block quantization of activations: q = round(x / d), d = max|x| / 127, s = d * sum(q).
TEST(QuantMatmul, QuantizeRowsRoundsToNearestOfTheBlockScale) {
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[size_t(i)] = float(i - 20) * 0.37f;
  x[40] = -50.f;  // the second block's max |x|
  std::vector<int8_t> q(64);
  float d[2], s[2];
  quantize_rows_q8(x.data(), 64, 1, 64, q.data(), d, s);
  EXPECT_FLOAT_EQ(d[0], 20 * 0.37f / 127.f);
  EXPECT_FLOAT_EQ(d[1], 50.f / 127.f);
  for (int b = 0; b < 2; ++b) {
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      const float v = x[size_t(32 * b + i)];
      EXPECT_EQ(q[size_t(32 * b + i)], int(std::nearbyint(v / d[b]))) << "element " << 32 * b + i;
      sum += q[size_t(32 * b + i)];
    }
    EXPECT_FLOAT_EQ(s[b], d[b] * float(sum));
  }
  EXPECT_EQ(q[40], -127);
}

}  // namespace
}  // namespace pagoda::cpu

// layer_ops.h against host references in double, computed from the same rounded f16/bf16 inputs,
// where these checks go past the backend-op table (tests/backend/backend_ops.h, which covers
// embed, add and silu_mul through the Backend): RMSNorm at an fp32-reduction tolerance tighter
// than the table's worst case, add_rms_norm with its output aliasing delta, RoPE + KV append into
// both pool layouts with every unowned pool element left untouched, and rejected shapes.
//
// Tolerance: each output is one fp32 computation rounded once to the dtype, so it may differ
// from the exact value by half an ulp (unit roundoff u: 2^-11 for f16, 2^-8 for bf16) plus the
// fp32 error before rounding (a few 1e-7 relative; the RMS reduction over 4096 squares stays
// under 1e-5), which can tip a value onto the other side of a rounding midpoint. Hence
// |got - ref| <= (u + 2e-5) |ref| + 1e-6 (the floor covers f16 subnormals). A wrong row, weight,
// sign or angle is off by O(|ref|), far outside it. The residual is checked bit for bit.
#include "gpu_test.h"
#include "pagoda/backend/cuda/layer_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/core/error.h"
#include "pagoda/core/half.h"

namespace pagoda::cuda {
namespace {

constexpr DType kDtypes[] = {DType::kF16, DType::kBF16};

float to_f32(DType dtype, uint16_t bits) { return dtype == DType::kF16 ? f16_to_f32(bits) : bf16_to_f32(bits); }
uint16_t from_f32(DType dtype, float x) { return dtype == DType::kF16 ? f32_to_f16(x) : f32_to_bf16(x); }
double unit_roundoff(DType dtype) { return dtype == DType::kF16 ? 0x1p-11 : 0x1p-8; }

// One fp32 computation rounded once to dtype (the file comment derives it).
void expect_rounded(DType dtype, uint16_t got, double ref, const char* what, size_t index) {
  const double tolerance = (unit_roundoff(dtype) + 2e-5) * std::abs(ref) + 1e-6;
  ASSERT_NEAR(to_f32(dtype, got), ref, tolerance) << what << " [" << index << "] " << dtype_name(dtype);
}

// count values ~ N(mean, scale^2), rounded to dtype: the bits the GPU reads.
std::vector<uint16_t> random_values(DType dtype, size_t count, float mean, float scale, std::mt19937& rng) {
  std::normal_distribution<float> normal(mean, scale);
  std::vector<uint16_t> bits(count);
  for (auto& b : bits) b = from_f32(dtype, normal(rng));
  return bits;
}

DeviceArray<uint16_t> to_device(const std::vector<uint16_t>& host) {
  DeviceArray<uint16_t> device;
  device.upload(host);
  return device;
}

void sync() { check_cuda(cudaDeviceSynchronize(), "sync"); }

// The exact RMSNorm of row x (rounded values) with weight w, in double.
std::vector<double> rms_norm_reference(DType dtype, const uint16_t* x, const uint16_t* w, int64_t hidden, float eps) {
  double sum_squares = 0;
  for (int64_t i = 0; i < hidden; ++i) sum_squares += double(to_f32(dtype, x[i])) * to_f32(dtype, x[i]);
  const double inv_rms = 1.0 / std::sqrt(sum_squares / double(hidden) + double(eps));
  std::vector<double> out(static_cast<size_t>(hidden));
  for (int64_t i = 0; i < hidden; ++i) out[size_t(i)] = to_f32(dtype, x[i]) * inv_rms * to_f32(dtype, w[i]);
  return out;
}

class GpuLayerOps : public GpuTest {};

// Plain (rows null) and gathered (rows: the sampling positions) RMSNorm, at SmolLM2's hidden
// size (576: fewer vectors than threads) and Llama's (4096).
TEST_F(GpuLayerOps, RmsNormMatchesHost) {
  std::mt19937 rng(2);
  const float eps = 1e-5f;
  for (DType dtype : kDtypes) {
    for (int64_t hidden : {576, 4096}) {
      const int64_t x_rows = 9;
      const std::vector<uint16_t> x = random_values(dtype, size_t(x_rows * hidden), 0.1f, 3.f, rng);
      const std::vector<uint16_t> weight = random_values(dtype, size_t(hidden), 1.f, 0.2f, rng);
      DeviceArray<uint16_t> d_x = to_device(x), d_weight = to_device(weight), d_out(size_t(x_rows * hidden));
      for (const std::vector<int32_t>& rows : {std::vector<int32_t>{}, std::vector<int32_t>{8, 0, 3}}) {
        const int64_t n = rows.empty() ? x_rows : int64_t(rows.size());
        DeviceArray<int32_t> d_rows;
        d_rows.upload(rows);
        rms_norm(d_x.data(), rows.empty() ? nullptr : d_rows.data(), d_weight.data(), eps, n, hidden, dtype,
                 d_out.data(), nullptr);
        sync();
        const std::vector<uint16_t> out = d_out.download();
        for (int64_t j = 0; j < n; ++j) {
          const int64_t r = rows.empty() ? j : rows[size_t(j)];
          const std::vector<double> ref = rms_norm_reference(dtype, &x[size_t(r * hidden)], weight.data(), hidden, eps);
          for (int64_t i = 0; i < hidden; ++i) {
            expect_rounded(dtype, out[size_t(j * hidden + i)], ref[size_t(i)], rows.empty() ? "rms_norm" : "rms_norm rows",
                           size_t(j * hidden + i));
          }
        }
      }
    }
  }
}

// The stored residual is exactly round(residual + delta) (fp32 sum, round to nearest even, as
// the host's f32_to_f16/bf16 do), and the norm is that of the rounded residual. Run again with
// out aliasing delta (allowed by the header): the same bits.
TEST_F(GpuLayerOps, AddRmsNormStoresRoundedResidualAndNormalizesIt) {
  std::mt19937 rng(3);
  const float eps = 1e-6f;
  for (DType dtype : kDtypes) {
    const int64_t n = 5, hidden = 4096;
    const std::vector<uint16_t> residual = random_values(dtype, size_t(n * hidden), 0.f, 2.f, rng);
    const std::vector<uint16_t> delta = random_values(dtype, size_t(n * hidden), 0.f, 0.5f, rng);
    const std::vector<uint16_t> weight = random_values(dtype, size_t(hidden), 1.f, 0.2f, rng);
    DeviceArray<uint16_t> d_residual = to_device(residual), d_delta = to_device(delta), d_weight = to_device(weight);
    DeviceArray<uint16_t> d_out(size_t(n * hidden));
    add_rms_norm(d_residual.data(), d_delta.data(), d_weight.data(), eps, n, hidden, dtype, d_out.data(), nullptr);
    sync();
    const std::vector<uint16_t> stored = d_residual.download();
    const std::vector<uint16_t> out = d_out.download();
    for (size_t i = 0; i < stored.size(); ++i) {
      ASSERT_EQ(stored[i], from_f32(dtype, to_f32(dtype, residual[i]) + to_f32(dtype, delta[i])))
          << "residual [" << i << "] " << dtype_name(dtype);
    }
    for (int64_t r = 0; r < n; ++r) {
      const std::vector<double> ref = rms_norm_reference(dtype, &stored[size_t(r * hidden)], weight.data(), hidden, eps);
      for (int64_t i = 0; i < hidden; ++i) {
        expect_rounded(dtype, out[size_t(r * hidden + i)], ref[size_t(i)], "add_rms_norm", size_t(r * hidden + i));
      }
    }

    DeviceArray<uint16_t> d_residual2 = to_device(residual), d_delta_as_out = to_device(delta);
    add_rms_norm(d_residual2.data(), d_delta_as_out.data(), d_weight.data(), eps, n, hidden, dtype,
                 d_delta_as_out.data(), nullptr);
    sync();
    EXPECT_EQ(d_residual2.download(), stored) << dtype_name(dtype);
    EXPECT_EQ(d_delta_as_out.download(), out) << "out aliasing delta, " << dtype_name(dtype);
  }
}

TEST_F(GpuLayerOps, RejectsUnvectorizableShapesAndOtherDtypes) {
  DeviceArray<uint16_t> buffer(64);
  EXPECT_THROW(add(buffer.data(), buffer.data(), 2, 12, DType::kF16, nullptr), Error);
  EXPECT_THROW(rms_norm(buffer.data(), nullptr, buffer.data(), 1e-5f, 2, 16, DType::kF32, buffer.data(), nullptr), Error);
  EXPECT_THROW(silu_mul(buffer.data() + 1, 1, 8, DType::kBF16, buffer.data(), nullptr), Error);  // misaligned
}

// RoPE + KV append against the definition in layer_ops.h, for both pool layouts, head_dim 64 and
// 128, several q and kv heads, positions up to 100000 and padding rows. The pool starts filled
// with a sentinel: every element no valid row owns must keep it.
struct RopeCase {
  KvLayout layout;
  int q_heads, kv_heads, head_dim;
};

TEST_F(GpuLayerOps, RopeAppendKvMatchesHost) {
  std::mt19937 rng(6);
  constexpr uint16_t kSentinel = 0x5a5a;
  const int32_t num_blocks = 8, block_size = 16;
  // (block, slot) pairs are distinct among the valid rows; rows 2 and 6 are padding.
  const std::vector<int32_t> positions = {0, 1, 17, 4095, 65537, 100000, 99999, 2};
  const std::vector<int32_t> slot_block = {3, 0, -1, 5, 2, 7, -1, 3};
  const int64_t n = int64_t(positions.size());
  const RopeCase cases[] = {{KvLayout::kHnd, 4, 2, 64}, {KvLayout::kNhd, 4, 2, 64},
                            {KvLayout::kHnd, 6, 2, 128}, {KvLayout::kNhd, 6, 3, 128}};
  for (DType dtype : kDtypes) {
    for (const RopeCase& c : cases) {
      SCOPED_TRACE(testing::Message() << dtype_name(dtype) << (c.layout == KvLayout::kHnd ? " HND" : " NHD")
                                      << " q_heads " << c.q_heads << " kv_heads " << c.kv_heads << " head_dim "
                                      << c.head_dim);
      const int hd = c.head_dim, half = hd / 2;
      const int heads = c.q_heads + 2 * c.kv_heads;
      std::vector<float> inv_freq(static_cast<size_t>(half));
      for (int i = 0; i < half; ++i) inv_freq[size_t(i)] = float(1.0 / std::pow(500000.0, 2.0 * i / hd));
      const std::vector<uint16_t> qkv = random_values(dtype, size_t(n * heads * hd), 0.f, 1.f, rng);

      DeviceArray<uint16_t> d_qkv = to_device(qkv), d_q(size_t(n * c.q_heads * hd));
      const size_t pool_elements = size_t(num_blocks) * block_size * c.kv_heads * hd;
      DeviceArray<uint16_t> d_k = to_device(std::vector<uint16_t>(pool_elements, kSentinel));
      DeviceArray<uint16_t> d_v = to_device(std::vector<uint16_t>(pool_elements, kSentinel));
      DeviceArray<int32_t> d_positions, d_slot_block;
      DeviceArray<float> d_inv_freq;
      d_positions.upload(positions);
      d_slot_block.upload(slot_block);
      d_inv_freq.upload(inv_freq);
      const PagedKv kv = make_paged_kv(d_k.data(), d_v.data(), dtype, c.layout, num_blocks, block_size, c.kv_heads, hd,
                                       Device::kCuda);
      rope_append_kv(d_qkv.data(), n, d_positions.data(), d_slot_block.data(), d_inv_freq.data(), c.q_heads,
                     c.kv_heads, hd, kv, dtype, d_q.data(), nullptr);
      sync();
      const std::vector<uint16_t> q = d_q.download(), k = d_k.download(), v = d_v.download();

      std::vector<bool> owned(pool_elements, false);
      for (int64_t r = 0; r < n; ++r) {
        const int32_t pos = positions[size_t(r)];
        for (int h = 0; h < heads; ++h) {
          const uint16_t* src = &qkv[size_t((r * heads + h) * hd)];
          const bool is_q = h < c.q_heads, is_k = !is_q && h < c.q_heads + c.kv_heads;
          if (!is_q && slot_block[size_t(r)] < 0) continue;
          // Where a k or v head of row r lives in the pool (unused for q heads).
          const int64_t kv_head = h - c.q_heads - (is_k ? 0 : c.kv_heads);
          const int64_t pool_base = int64_t(slot_block[size_t(r)]) * kv.page_stride + kv_head * kv.head_stride +
                                    int64_t(pos % block_size) * kv.token_stride;
          for (int i = 0; i < hd; ++i) {
            const size_t at = is_q ? size_t((r * c.q_heads + h) * hd + i) : size_t(pool_base + i);
            if (!is_q) owned[at] = true;
            if (!is_q && !is_k) {  // v: a plain copy
              ASSERT_EQ(v[at], src[i]) << "v row " << r << " head " << h << " d " << i;
              continue;
            }
            // The angle is the fp32 product (as the GPU and Hugging Face form it); cos/sin exact.
            const int pair = i % half;
            const float angle = float(pos) * inv_freq[size_t(pair)];
            const double cos_a = std::cos(double(angle)), sin_a = std::sin(double(angle));
            const double x = to_f32(dtype, src[pair]), y = to_f32(dtype, src[pair + half]);
            const double ref = i < half ? x * cos_a - y * sin_a : y * cos_a + x * sin_a;
            expect_rounded(dtype, is_q ? q[at] : k[at], ref, is_q ? "q" : "k", at);
          }
        }
      }
      for (size_t at = 0; at < pool_elements; ++at) {
        if (owned[at]) continue;
        ASSERT_EQ(k[at], kSentinel) << "k pool element " << at << " written by no valid row";
        ASSERT_EQ(v[at], kSentinel) << "v pool element " << at << " written by no valid row";
      }
    }
  }
}

}  // namespace
}  // namespace pagoda::cuda

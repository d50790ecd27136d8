#include "pagoda/backend/cpu/elementwise.h"

#include <cmath>

#include "pagoda/backend/cpu/thread_pool.h"
#include "pagoda/core/error.h"
#include "pagoda/core/half.h"
#include "pagoda/format/dequantize.h"

namespace pagoda::cpu {
namespace {

float element(const Tensor& t, int64_t row, int64_t col) {
  const int64_t i = row * t.strides[0] + col;
  switch (t.dtype) {
    case DType::kF32: return t.ptr<float>()[i];
    case DType::kF16: return f16_to_f32(t.ptr<uint16_t>()[i]);
    case DType::kBF16: return bf16_to_f32(t.ptr<uint16_t>()[i]);
    default: fail(ErrorKind::kUnsupported, "cpu: dtype {} in a weight", dtype_name(t.dtype));
  }
}

GgmlType ggml_type(DType t) {
  switch (t) {
    case DType::kQ4_0: return GgmlType::kQ4_0;
    case DType::kQ4_1: return GgmlType::kQ4_1;
    case DType::kQ5_0: return GgmlType::kQ5_0;
    case DType::kQ5_1: return GgmlType::kQ5_1;
    case DType::kQ8_0: return GgmlType::kQ8_0;
    case DType::kQ4_K: return GgmlType::kQ4_K;
    case DType::kQ5_K: return GgmlType::kQ5_K;
    case DType::kQ6_K: return GgmlType::kQ6_K;
    default: fail(ErrorKind::kUnsupported, "cpu: dtype {} in a quantized table", dtype_name(t));
  }
}

}  // namespace

void embed(const Tensor& table, std::span<const int32_t> ids, Tensor out) {
  const int64_t vocab = table.size(0), hidden = table.size(1);
  for (int32_t id : ids)
    if (id < 0 || id >= vocab) fail(ErrorKind::kInvalidArgument, "token id {} outside the vocabulary of {}", id, vocab);
  ThreadPool::shared().parallel_for(int64_t(ids.size()), [&](int64_t r) {
    float* dst = out.ptr<float>() + r * out.strides[0];
    if (is_block_quantized(table.dtype)) {  // a table kept in the file's blocks: one row's worth
      const auto* row = static_cast<const uint8_t*>(table.data) + dtype_bytes(table.dtype, ids[r] * table.strides[0]);
      dequantize_row(ggml_type(table.dtype), row, dst, hidden);
      return;
    }
    for (int64_t c = 0; c < hidden; ++c) dst[c] = element(table, ids[r], c);
  });
}

void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor out) {
  const int64_t n = x.size(0), hidden = x.size(1);
  const float* w = weight.ptr<float>();
  ThreadPool::shared().parallel_for(n, [&](int64_t r) {
    const float* src = x.ptr<float>() + r * x.strides[0];
    float* dst = out.ptr<float>() + r * out.strides[0];
    double sum_sq = 0;  // f64: summation order then cannot move the result
    for (int64_t c = 0; c < hidden; ++c) sum_sq += double(src[c]) * src[c];
    const float inv_rms = 1.f / std::sqrt(float(sum_sq / double(hidden)) + eps);
    for (int64_t c = 0; c < hidden; ++c) dst[c] = w[c] * (src[c] * inv_rms);
  });
}

void rope(Tensor x, std::span<const int32_t> positions, std::span<const float> inv_freq) {
  const int64_t n = x.size(0), heads = x.size(1), head_dim = x.size(2), half = head_dim / 2;
  ThreadPool::shared().parallel_for(n, [&](int64_t r) {
    float cos_table[512], sin_table[512];  // head_dim <= 1024 (checked by the model loader)
    for (int64_t i = 0; i < half; ++i) {
      // f32 angle as transformers computes it (position * inv_freq in f32, then cos/sin).
      const float angle = float(positions[r]) * inv_freq[i];
      cos_table[i] = std::cos(angle);
      sin_table[i] = std::sin(angle);
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x.ptr<float>() + r * x.strides[0] + h * x.strides[1];
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cos_table[i] - b * sin_table[i];
        v[i + half] = b * cos_table[i] + a * sin_table[i];
      }
    }
  });
}

void silu_mul(const Tensor& gate_up, Tensor out) {
  const int64_t n = out.size(0), width = out.size(1);
  ThreadPool::shared().parallel_for(n, [&](int64_t r) {
    const float* gate = gate_up.ptr<float>() + r * gate_up.strides[0];
    const float* up = gate + width;
    float* dst = out.ptr<float>() + r * out.strides[0];
    for (int64_t c = 0; c < width; ++c) dst[c] = gate[c] / (1.f + std::exp(-gate[c])) * up[c];
  });
}

void add(Tensor x, const Tensor& y) {
  const int64_t n = x.size(0), width = x.size(1);
  for (int64_t r = 0; r < n; ++r) {
    float* dst = x.ptr<float>() + r * x.strides[0];
    const float* src = y.ptr<float>() + r * y.strides[0];
    for (int64_t c = 0; c < width; ++c) dst[c] += src[c];
  }
}

}  // namespace pagoda::cpu

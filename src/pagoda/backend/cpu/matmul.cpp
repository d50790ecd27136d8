#include "pagoda/backend/cpu/matmul.h"

#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/core/half.h"

namespace pagoda::cpu {
namespace {

// Eight weights widened to f32.
template <DType W>
inline __m256 load8(const void* base, int64_t i) {
  if constexpr (W == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + i);
  } else if constexpr (W == DType::kF16) {
    const auto* p = static_cast<const uint16_t*>(base) + i;
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else {  // bf16: the high half of an f32
    const auto* p = static_cast<const uint16_t*>(base) + i;
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
}

template <DType W>
inline float load1(const void* base, int64_t i) {
  if constexpr (W == DType::kF32) return static_cast<const float*>(base)[i];
  else if constexpr (W == DType::kF16) return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
  else return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
}

inline float horizontal_sum(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// R rows of x against one weight row: each widened weight vector feeds R accumulators.
template <DType W, int R>
inline void dot_rows(const float* x, int64_t x_stride, const void* w_row, int64_t k, float* result) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    const __m256 wv = load8<W>(w_row, i);
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * x_stride + i), wv, acc[r]);
  }
  for (int r = 0; r < R; ++r) {
    float s = horizontal_sum(acc[r]);
    for (int64_t j = i; j < k; ++j) s += x[r * x_stride + j] * load1<W>(w_row, j);
    result[r] = s;
  }
}

template <DType W>
void matmul_streaming(const Tensor& x, const Tensor& w, const float* bias, Tensor out) {
  const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
  const float* xp = x.ptr<float>();
  float* op = out.ptr<float>();
  const int64_t x_stride = x.strides[0], out_stride = out.strides[0];
  const size_t w_row_bytes = size_t(k) * dtype_size(W);
  const auto* wp = static_cast<const uint8_t*>(w.data);
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < m; ++j) {
    const void* w_row = wp + size_t(j) * w_row_bytes;
    float dots[4];
    for (int64_t r0 = 0; r0 < n; r0 += 4) {
      const float* xr = xp + r0 * x_stride;
      const int64_t rows = std::min<int64_t>(4, n - r0);
      switch (rows) {
        case 4: dot_rows<W, 4>(xr, x_stride, w_row, k, dots); break;
        case 3: dot_rows<W, 3>(xr, x_stride, w_row, k, dots); break;
        case 2: dot_rows<W, 2>(xr, x_stride, w_row, k, dots); break;
        default: dot_rows<W, 1>(xr, x_stride, w_row, k, dots); break;
      }
      const float b = bias ? bias[j] : 0.f;
      for (int64_t r = 0; r < rows; ++r) op[(r0 + r) * out_stride + j] = dots[r] + b;
    }
  }
}

// Widens `rows` weight rows starting at `first` into dst [rows, k].
template <DType W>
void widen_panel(const Tensor& w, int64_t first, int64_t rows, float* dst) {
  const int64_t k = w.size(1);
  const auto* wp = static_cast<const uint8_t*>(w.data) + size_t(first) * size_t(k) * dtype_size(W);
  for (int64_t r = 0; r < rows; ++r) {
    const void* src = wp + size_t(r) * size_t(k) * dtype_size(W);
    float* d = dst + r * k;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) _mm256_storeu_ps(d + i, load8<W>(src, i));
    for (; i < k; ++i) d[i] = load1<W>(src, i);
  }
}

// Each thread widens its own panels of weight rows and multiplies them with a single-threaded
// sgemm: one threading runtime (OpenMP) owns the cores. OpenBLAS's own threads would spin after
// each call and starve the OpenMP threads of the next op (decode slowed 40x on 2 cores).
template <DType W>
void matmul_blas(const Tensor& x, const Tensor& w, const float* bias, Tensor out) {
  const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
  constexpr int64_t kPanelRows = 128;
  const int64_t panels = (m + kPanelRows - 1) / kPanelRows;
#pragma omp parallel
  {
    std::vector<float> panel(W == DType::kF32 ? 0 : size_t(std::min(kPanelRows, m)) * size_t(k));
#pragma omp for schedule(static)
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t first = p * kPanelRows, rows = std::min(kPanelRows, m - first);
      const float* wp;
      if constexpr (W == DType::kF32) {
        wp = w.ptr<float>() + first * k;
      } else {
        widen_panel<W>(w, first, rows, panel.data());
        wp = panel.data();
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(rows), int(k), 1.f, x.ptr<float>(),
                  int(x.strides[0]), wp, int(k), 0.f, out.ptr<float>() + first, int(out.strides[0]));
      if (bias)
        for (int64_t r = 0; r < n; ++r)
          for (int64_t j = first; j < first + rows; ++j) out.ptr<float>()[r * out.strides[0] + j] += bias[j];
    }
  }
}

template <DType W>
void matmul_typed(const Tensor& x, const Tensor& w, const float* bias, Tensor out) {
  if (x.size(0) <= kStreamingMaxRows) matmul_streaming<W>(x, w, bias, out);
  else matmul_blas<W>(x, w, bias, out);
}

}  // namespace

void matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor out) {
  // OpenMP threads call sgemm; OpenBLAS must not start threads of its own.
  static const bool single_threaded_blas = (openblas_set_num_threads(1), true);
  (void)single_threaded_blas;
  if (x.dtype != DType::kF32 || out.dtype != DType::kF32 || x.ndim != 2 || w.ndim != 2 ||
      x.size(1) != w.size(1) || out.size(0) != x.size(0) || out.size(1) != w.size(0) ||
      x.strides[1] != 1 || out.strides[1] != 1 || !w.is_contiguous() ||
      (bias && (bias->dtype != DType::kF32 || bias->numel() != w.size(0))))
    fail(ErrorKind::kInternal, "cpu matmul: bad operands x{} w{} out{}", x.shape_string(),
         w.shape_string(), out.shape_string());
  const float* b = bias ? bias->ptr<float>() : nullptr;
  switch (w.dtype) {
    case DType::kF32: return matmul_typed<DType::kF32>(x, w, b, out);
    case DType::kF16: return matmul_typed<DType::kF16>(x, w, b, out);
    case DType::kBF16: return matmul_typed<DType::kBF16>(x, w, b, out);
    default: fail(ErrorKind::kUnsupported, "cpu matmul: weight dtype {}", dtype_name(w.dtype));
  }
}

}  // namespace pagoda::cpu

#include "pagoda/backend/cpu/matmul.h"

#include "pagoda/backend/cpu/quant_matmul.h"

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

// A tile of R rows of x against C weight rows: R * C independent accumulators. One accumulator
// alone would chain every FMA on the last (4-cycle latency), capping a core at ~4 bytes of
// weights per cycle; C weight rows in flight hide that latency, and each widened weight vector
// still feeds all R rows.
template <DType W, int R, int C>
inline void dot_tile(const float* x, int64_t x_stride, const uint8_t* w, size_t w_row_bytes, int64_t k,
                     float* out, int64_t out_stride) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    __m256 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = load8<W>(w + size_t(c) * w_row_bytes, i);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * x_stride + i);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float s = horizontal_sum(acc[r][c]);
      for (int64_t j = i; j < k; ++j) s += x[r * x_stride + j] * load1<W>(w + size_t(c) * w_row_bytes, j);
      out[r * out_stride + c] = s;
    }
}

// Rows of x, in tiles of up to 4, against the C weight rows starting at w.
template <DType W, int C>
inline void dot_rows(const float* x, int64_t x_stride, int64_t n, const uint8_t* w, size_t w_row_bytes,
                     int64_t k, float* out, int64_t out_stride) {
  for (int64_t r0 = 0; r0 < n; r0 += 4) {
    const float* xr = x + r0 * x_stride;
    float* o = out + r0 * out_stride;
    switch (std::min<int64_t>(4, n - r0)) {
      case 4: dot_tile<W, 4, C>(xr, x_stride, w, w_row_bytes, k, o, out_stride); break;
      case 3: dot_tile<W, 3, C>(xr, x_stride, w, w_row_bytes, k, o, out_stride); break;
      case 2: dot_tile<W, 2, C>(xr, x_stride, w, w_row_bytes, k, o, out_stride); break;
      default: dot_tile<W, 1, C>(xr, x_stride, w, w_row_bytes, k, o, out_stride); break;
    }
  }
}

template <DType W>
void matmul_streaming(const Tensor& x, const Tensor& w, const float* bias, Tensor out) {
  constexpr int64_t kTileRows = 3;  // weight rows per tile: 4 x 3 accumulators + 3 weights + 1 x = 16 registers
  const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
  const size_t w_row_bytes = size_t(k) * dtype_size(W);
  const auto* wp = static_cast<const uint8_t*>(w.data);
  float* op = out.ptr<float>();
  const int64_t out_stride = out.strides[0];
  const int64_t tiles = (m + kTileRows - 1) / kTileRows;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t j = t * kTileRows, end = std::min(j + kTileRows, m);
    if (end - j == kTileRows) {
      dot_rows<W, kTileRows>(x.ptr<float>(), x.strides[0], n, wp + size_t(j) * w_row_bytes, w_row_bytes, k,
                             op + j, out_stride);
    } else {
      for (int64_t jj = j; jj < end; ++jj)
        dot_rows<W, 1>(x.ptr<float>(), x.strides[0], n, wp + size_t(jj) * w_row_bytes, w_row_bytes, k, op + jj,
                       out_stride);
    }
    if (bias)
      for (int64_t r = 0; r < n; ++r)
        for (int64_t jj = j; jj < end; ++jj) op[r * out_stride + jj] += bias[jj];
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
  if (is_block_quantized(w.dtype)) return quant_matmul(x, w, b, out);
  switch (w.dtype) {
    case DType::kF32: return matmul_typed<DType::kF32>(x, w, b, out);
    case DType::kF16: return matmul_typed<DType::kF16>(x, w, b, out);
    case DType::kBF16: return matmul_typed<DType::kBF16>(x, w, b, out);
    default: fail(ErrorKind::kUnsupported, "cpu matmul: weight dtype {}", dtype_name(w.dtype));
  }
}

}  // namespace pagoda::cpu

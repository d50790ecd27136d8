#include "pagoda/backend/cpu/quant_matmul.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "pagoda/backend/cpu/quant_kernels.h"
#include "pagoda/backend/cpu/thread_pool.h"
#include "pagoda/core/error.h"

namespace pagoda::cpu {
namespace {

QuantGemmFn kernel(QuantIsa isa) { return isa == QuantIsa::kAvx512Vnni ? quant_gemm_avx512 : quant_gemm_avx2; }

// Weight rows per task: enough work to amortize claiming it (a few microseconds), small enough
// that a descheduled thread's task is a small share of the matmul. Even, for the 2-row tiles.
int64_t rows_per_task(int64_t m, int64_t n, int threads) {
  const int64_t target_tasks = int64_t(threads) * (n > 1 ? 4 : 8);
  int64_t rows = std::max<int64_t>(16, (m + target_tasks - 1) / target_tasks);
  return (rows + 1) / 2 * 2;
}

}  // namespace

bool quant_isa_supported(QuantIsa isa) {
  if (isa == QuantIsa::kAvx2) return true;  // the build's floor
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

QuantIsa best_quant_isa() {
  static const QuantIsa best = quant_isa_supported(QuantIsa::kAvx512Vnni) ? QuantIsa::kAvx512Vnni : QuantIsa::kAvx2;
  return best;
}

const char* quant_isa_name(QuantIsa isa) { return isa == QuantIsa::kAvx512Vnni ? "avx512-vnni" : "avx2"; }

void quantize_rows_q8(const float* x, int64_t x_stride, int64_t n, int64_t k, int8_t* q, float* d, float* s) {
  const int64_t groups = k / 32;
  const __m256 sign_mask = _mm256_set1_ps(-0.f);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* src = x + r * x_stride + g * 32;
      __m256 v[4], amax = _mm256_setzero_ps();
      for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(src + 8 * i);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, v[i]));
      }
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
      const float scale = _mm_cvtss_f32(m4) / 127.f;
      const __m256 inverse = _mm256_set1_ps(scale > 0 ? 1.f / scale : 0.f);
      __m256i i32[4];
      for (int i = 0; i < 4; ++i)
        i32[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], inverse), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      // Sum of the 32 quants, then pack to bytes: packs interleave 128-bit lanes, the permute
      // restores element order.
      __m256i sum = _mm256_add_epi32(_mm256_add_epi32(i32[0], i32[1]), _mm256_add_epi32(i32[2], i32[3]));
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
      const __m256i words = _mm256_packs_epi32(i32[0], i32[1]), words2 = _mm256_packs_epi32(i32[2], i32[3]);
      __m256i bytes = _mm256_packs_epi16(words, words2);
      bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + r * k + g * 32), bytes);
      d[r * groups + g] = scale;
      s[r * groups + g] = scale * float(_mm_cvtsi128_si32(s4));
    }
  }
}

void quant_matmul(const Tensor& x, const Tensor& w, const float* bias, Tensor out) {
  quant_matmul(x, w, bias, out, best_quant_isa());
}

void quant_matmul(const Tensor& x, const Tensor& w, const float* bias, Tensor out, QuantIsa isa) {
  const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
  if (!is_block_quantized(w.dtype) || k % block_elements(w.dtype) != 0)
    fail(ErrorKind::kInternal, "quant_matmul: weight {} of {} columns", dtype_name(w.dtype), k);
  if (!quant_isa_supported(isa)) fail(ErrorKind::kUnsupported, "quant_matmul: this CPU lacks {}", quant_isa_name(isa));
  // The activations' int8 copy, per calling thread (the pool's workers only read it).
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> scales, sums;
  const int64_t groups = k / 32;
  q.resize(size_t(n * k));
  scales.resize(size_t(n * groups));
  sums.resize(size_t(n * groups));
  ThreadPool& pool = ThreadPool::shared();
  const float* xp = x.ptr<float>();
  int8_t* qp = q.data();
  float *dp = scales.data(), *sp = sums.data();
  const int64_t x_stride = x.strides[0];
  // Rows of activations per quantization task: a few per thread, at least 8 rows.
  const int64_t quant_rows = std::max<int64_t>(8, (n + 2 * pool.threads() - 1) / (2 * pool.threads()));
  pool.parallel_for((n + quant_rows - 1) / quant_rows, [&](int64_t t) {
    const int64_t r0 = t * quant_rows, rows = std::min(quant_rows, n - r0);
    quantize_rows_q8(xp + r0 * x_stride, x_stride, rows, k, qp + r0 * k, dp + r0 * groups, sp + r0 * groups);
  });
  const Q8Rows rows{.q = qp, .d = dp, .s = sp, .k = k};
  const QuantGemmFn gemm = kernel(isa);
  const size_t w_row_bytes = dtype_bytes(w.dtype, k);
  const auto* wp = static_cast<const uint8_t*>(w.data);
  float* op = out.ptr<float>();
  const int64_t out_stride = out.strides[0];
  const int64_t chunk = rows_per_task(m, n, pool.threads());
  pool.parallel_for((m + chunk - 1) / chunk, [&](int64_t t) {
    const int64_t first = t * chunk, last = std::min(first + chunk, m);
    gemm(w.dtype, wp, w_row_bytes, first, last, rows, n, op, out_stride);
    if (bias)
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = first; j < last; ++j) op[r * out_stride + j] += bias[j];
  });
}

}  // namespace pagoda::cpu

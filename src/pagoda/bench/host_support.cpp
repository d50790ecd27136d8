#include "pagoda/bench/host_support.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "pagoda/core/error.h"

namespace pagoda::bench {

// Four independent AVX2 xor accumulators per thread, so the loop is bound by loads, not by an
// add's latency (a plain floating-point sum reduction is).
double measure_host_read_bandwidth() {
  using Clock = std::chrono::steady_clock;
  const size_t bytes = size_t(512) << 20;
  const size_t vectors = bytes / sizeof(__m256i);
  auto* data = static_cast<__m256i*>(std::aligned_alloc(64, bytes));
  if (!data) fail(ErrorKind::kOutOfMemory, "bench: cannot allocate {} bytes", bytes);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < vectors; ++i) data[i] = _mm256_set1_epi64x(int64_t(i));
  double best = 0;
  int64_t sink = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto start = Clock::now();
#pragma omp parallel reduction(^ : sink)
    {
      __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
#pragma omp for schedule(static)
      for (size_t i = 0; i < vectors; i += 4) {
        a0 = _mm256_xor_si256(a0, _mm256_load_si256(data + i));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256(data + i + 1));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256(data + i + 2));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256(data + i + 3));
      }
      const __m256i a = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
      sink ^= _mm256_extract_epi64(a, 0) ^ _mm256_extract_epi64(a, 3);
    }
    best = std::max(best, double(bytes) / std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::free(data);
  if (sink == 42) std::puts("");  // keeps the loads
  return best;
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.starts_with("model name")) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

}  // namespace pagoda::bench

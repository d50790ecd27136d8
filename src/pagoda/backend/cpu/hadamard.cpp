#include "pagoda/backend/cpu/hadamard.h"

#include <cmath>

namespace pagoda::cpu {

void hadamard_rotate(float* x, int64_t count, int32_t n) {
  const float norm = 1.f / std::sqrt(float(n));
#pragma omp parallel for schedule(static)
  for (int64_t v = 0; v < count; ++v) {
    float* row = x + v * n;
    // D: the sign of element i is bit i of a fixed 64-bit pattern (repeated past 64).
    constexpr uint64_t kSigns = 0x9e3779b97f4a7c15ull;
    for (int32_t i = 0; i < n; ++i)
      if ((kSigns >> (i % 64)) & 1) row[i] = -row[i];
    for (int32_t h = 1; h < n; h *= 2)  // the fast Walsh-Hadamard transform, in place
      for (int32_t i = 0; i < n; i += 2 * h)
        for (int32_t j = i; j < i + h; ++j) {
          const float a = row[j], b = row[j + h];
          row[j] = a + b;
          row[j + h] = a - b;
        }
    for (int32_t i = 0; i < n; ++i) row[i] *= norm;
  }
}

}  // namespace pagoda::cpu

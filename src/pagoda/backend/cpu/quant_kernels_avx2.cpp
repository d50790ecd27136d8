// The quantized kernels for the build's floor, x86-64-v3 (AVX2, FMA, F16C).
#define PAGODA_QUANT_ISA avx2
#include "pagoda/backend/cpu/quant_kernels_body.h"

namespace pagoda::cpu {

void quant_gemm_avx2(DType w, const uint8_t* weights, size_t w_row_bytes, int64_t first, int64_t last,
                     const Q8Rows& x, int64_t rows, float* out, int64_t out_stride) {
  avx2::dispatch(w, weights, w_row_bytes, first, last, x, rows, out, out_stride);
}

}  // namespace pagoda::cpu

// The quantized kernels with AVX-512 VNNI (vpdpbusd on 256-bit registers, AVX512VL): one
// instruction per 32-weight dot product instead of two, and 32 vector registers for the tiles.
// This file alone is compiled with those instructions enabled (CMakeLists.txt); quant_matmul.cpp
// calls it only when cpuid reports them.
#define PAGODA_QUANT_ISA avx512
#define PAGODA_QUANT_VNNI 1
#include "pagoda/backend/cpu/quant_kernels_body.h"

namespace pagoda::cpu {

void quant_gemm_avx512(DType w, const uint8_t* weights, size_t w_row_bytes, int64_t first, int64_t last,
                       const Q8Rows& x, int64_t rows, float* out, int64_t out_stride) {
  avx512::dispatch(w, weights, w_row_bytes, first, last, x, rows, out, out_stride);
}

}  // namespace pagoda::cpu

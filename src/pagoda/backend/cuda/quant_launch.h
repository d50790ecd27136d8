// The launchers of the quantized-weight kernels, one translation unit each (they compile in
// parallel); quant_matmul.h's functions check the arguments and choose among them. Arguments as
// quant_gemv's, already checked.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "pagoda/core/dtype.h"

namespace pagoda::cuda {

// f16 activations, n <= kQuantGemvTensorCoreMaxRows.
void launch_quant_gemv_mma(const void* x, const void* w, DType w_type, const void* bias, void* out, int64_t n,
                           int64_t m, int64_t k, DType out_type, cudaStream_t stream);
// f16 or bf16 activations (act), n <= kQuantGemvMaxRows.
void launch_quant_gemv_simt(const void* x, const void* w, DType w_type, const void* bias, void* out, int64_t n,
                            int64_t m, int64_t k, DType act, DType out_type, cudaStream_t stream);

}  // namespace pagoda::cuda

// The checks and the choice of kernel of quant_matmul.h; the kernels are in quant_gemv_mma.cu,
// quant_gemv_simt.cu and quant_dequantize.cu.
#include "pagoda/backend/cuda/quant_matmul.h"

#include <cstdint>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/quant_launch.h"

namespace pagoda::cuda {
namespace {

bool aligned_16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void quant_gemv(const void* x, const void* w, DType w_type, const void* bias, void* out, int64_t n, int64_t m,
                int64_t k, DType act, DType out_type, cudaStream_t stream, QuantGemvKernel kernel) {
  if (kernel == QuantGemvKernel::kAuto)
    kernel = act == DType::kF16 && n >= 2 ? QuantGemvKernel::kTensorCores : QuantGemvKernel::kSimt;
  const bool tensor_cores = kernel == QuantGemvKernel::kTensorCores;
  const int64_t max_rows = tensor_cores ? kQuantGemvTensorCoreMaxRows : kQuantGemvMaxRows;
  if (!quantized_matmul_type(w_type) || n < 1 || n > max_rows || m < 1 || k < 1 || k % block_elements(w_type) != 0 ||
      (tensor_cores && act != DType::kF16) || (out_type != act && out_type != DType::kF32) || !aligned_16(x) ||
      !aligned_16(w) || (bias && out_type != act))
    check_cuda(cudaErrorInvalidValue, "quant_gemv (shape, type or alignment)");
  if (tensor_cores) {
    launch_quant_gemv_mma(x, w, w_type, bias, out, n, m, k, out_type, stream);
  } else {
    launch_quant_gemv_simt(x, w, w_type, bias, out, n, m, k, act, out_type, stream);
  }
}

}  // namespace pagoda::cuda

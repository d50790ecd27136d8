// The launcher of the group-tiled decode kernel, defined next to its instantiations in
// decode_tiled.cu; decode_attention.cpp calls it, or a benchmark's launcher of the same type.
// dtype: kF16 or kBF16; head_dim: 64, 128 or 256 (decode_unsupported_reason has checked both).
#pragma once

#include <cuda_runtime.h>

#include "pagoda/backend/cuda/kernels/decode_params.h"
#include "pagoda/core/dtype.h"

namespace pagoda::cuda {

// p.prefetch_distance <= 0 selects the kernel's default.
void launch_decode_tiled(DType dtype, int head_dim, DecodeParams p, int num_items, cudaStream_t stream);

// CTAs of the tiled kernel for (dtype, head_dim) resident on one multiprocessor.
int decode_tiled_ctas_per_sm(DType dtype, int head_dim);

// Runs a decode kernel over num_items work items of p (the type of launch_decode_tiled).
using DecodeLauncher = void (*)(DType dtype, int head_dim, DecodeParams p, int num_items, cudaStream_t stream);

}  // namespace pagoda::cuda

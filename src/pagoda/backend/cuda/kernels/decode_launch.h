// Launchers of the decode kernels, defined next to their instantiations in decode_tiled.cu and
// decode_paper_baseline.cu; decode_attention.cpp calls them. dtype: kF16 or kBF16; head_dim: 64,
// 128 or 256 (decode_unsupported_reason has checked both).
#pragma once

#include <cuda_runtime.h>

#include "pagoda/backend/cuda/kernels/decode_params.h"
#include "pagoda/core/dtype.h"

namespace pagoda::cuda {

// p.prefetch_distance <= 0 selects the kernel's default.
void launch_decode_tiled(DType dtype, int head_dim, DecodeParams p, int num_items, cudaStream_t stream);

// CTAs of the tiled kernel for (dtype, head_dim) resident on one multiprocessor.
int decode_tiled_ctas_per_sm(DType dtype, int head_dim);

void launch_decode_paper_baseline(DType dtype, int head_dim, DecodeParams p, int num_items,
                                  cudaStream_t stream);

}  // namespace pagoda::cuda

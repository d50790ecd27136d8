// The launcher of prefix_tiled_kernel, defined next to its instantiations in prefix_tiled.cu;
// prefix_attention.cpp calls it. dtype: kF16 or kBF16; head_dim: 64 or 128.
#pragma once

#include <cuda_runtime.h>

#include "pagoda/backend/cuda/kernels/prefix_params.h"
#include "pagoda/core/dtype.h"

namespace pagoda::cuda {

void launch_prefix_tiled(DType dtype, int head_dim, const PrefixParams& p, int grid, cudaStream_t stream);

// The compiled kernel's resources, for the tile selector's constraints.
struct PrefixKernelResources {
  int smem_bytes;    // dynamic shared memory per CTA
  int stages;
  int tile_tokens;
  int max_rows;
  int one_tile_rows;  // the most rows of an item of one KV tile: a stage's Q slot
  int registers;     // per thread
  int spill_bytes;   // local memory per thread: 0 unless registers spilled
  int ctas_per_sm;
};
PrefixKernelResources prefix_kernel_resources(DType dtype, int head_dim);

}  // namespace pagoda::cuda

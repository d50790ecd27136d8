// The per-head decode kernel: one CTA per (work item, query head), its 4 warps taking every 4th
// KV block, CUDA-core dot products, no GQA sharing: the structure of vLLM's xFormers-era paged
// kernel that the L2-prefetch paper ("Accelerating LLM Inference Throughput via Asynchronous KV
// Cache Prefetching", arXiv:2504.06319) starts from. It runs the same work items as the backend's
// group-tiled kernel (pass it as DecodeOptions::launch), so `pagoda bench attention` can measure
// the paper's claim against it. Bytes it moves: every work item's K and V once per query head.
#pragma once

#include <cuda_runtime.h>

#include "pagoda/backend/cuda/kernels/decode_params.h"
#include "pagoda/core/dtype.h"

namespace pagoda::bench {

// A cuda::DecodeLauncher. p.prefetch_distance: in per-warp blocks; <= 0 selects the kernel's default.
void launch_per_head_decode(DType dtype, int head_dim, cuda::DecodeParams p, int num_items, cudaStream_t stream);

}  // namespace pagoda::bench

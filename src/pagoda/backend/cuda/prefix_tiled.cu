// The prefix kernel's instantiations, {f16, bf16} x head_dim {64, 128}, its launch and its
// compiled resources.
#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/kernels/dispatch.cuh"
#include "pagoda/backend/cuda/kernels/prefix_launch.h"
#include "pagoda/backend/cuda/kernels/prefix_tiled.cuh"
#include "pagoda/backend/cuda/kernels/shared_memory.cuh"

namespace pagoda::cuda {
namespace {

template <typename T, int kHeadDim>
void allow_shared_memory() {
  allow_dynamic_shared_memory<prefix_tiled_kernel<T, kHeadDim>, int(PrefixTiledConfig<kHeadDim>::kSmemBytes)>(
      "cudaFuncSetAttribute(prefix_tiled_kernel)");
}

}  // namespace

void launch_prefix_tiled(DType dtype, int head_dim, const PrefixParams& p, int grid, cudaStream_t stream) {
  dispatch_head_dim_64_128(dtype, head_dim, "prefix_tiled_kernel dispatch", [&]<typename T, int kHeadDim>() {
    using C = PrefixTiledConfig<kHeadDim>;
    allow_shared_memory<T, kHeadDim>();
    prefix_tiled_kernel<T, kHeadDim><<<unsigned(grid), C::kThreads, C::kSmemBytes, stream>>>(p);
    check_cuda(cudaGetLastError(), "prefix_tiled_kernel launch");
  });
}

PrefixKernelResources prefix_kernel_resources(DType dtype, int head_dim) {
  PrefixKernelResources r{};
  dispatch_head_dim_64_128(dtype, head_dim, "prefix_tiled_kernel dispatch", [&]<typename T, int kHeadDim>() {
    using C = PrefixTiledConfig<kHeadDim>;
    allow_shared_memory<T, kHeadDim>();
    cudaFuncAttributes attributes{};
    check_cuda(cudaFuncGetAttributes(&attributes, prefix_tiled_kernel<T, kHeadDim>), "cudaFuncGetAttributes");
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.ctas_per_sm, prefix_tiled_kernel<T, kHeadDim>,
                                                             C::kThreads, C::kSmemBytes),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    r.smem_bytes = C::kSmemBytes;
    r.stages = C::kStages;
    r.tile_tokens = C::kTileTokens;
    r.max_rows = C::kMaxRows;
    r.one_tile_rows = kPrefixOneTileRows;
    r.registers = attributes.numRegs;
    r.spill_bytes = int(attributes.localSizeBytes);
  });
  return r;
}

}  // namespace pagoda::cuda

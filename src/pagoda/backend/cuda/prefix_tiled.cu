// The prefix kernel's instantiations, {f16, bf16} x head_dim {64, 128}, its launch and its
// compiled resources.
#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/kernels/prefix_launch.h"
#include "pagoda/backend/cuda/kernels/prefix_tiled.cuh"
#include "pagoda/backend/cuda/kernels/shared_memory.cuh"

namespace pagoda::cuda {
namespace {

// Calls fn.template operator()<T, kHeadDim>() for a runtime (dtype, head_dim): the kernel's
// instantiation list. Callers have checked the pair against prefix_unsupported_reason.
template <typename Fn>
void dispatch_prefix_kernel(DType dtype, int head_dim, Fn&& fn) {
  auto by_head_dim = [&]<typename T>() {
    switch (head_dim) {
      case 64: return fn.template operator()<T, 64>();
      case 128: return fn.template operator()<T, 128>();
      default: check_cuda(cudaErrorInvalidValue, "prefix kernel dispatch (head_dim not 64 or 128)");
    }
  };
  if (dtype == DType::kF16) {
    by_head_dim.template operator()<__half>();
  } else if (dtype == DType::kBF16) {
    by_head_dim.template operator()<__nv_bfloat16>();
  } else {
    check_cuda(cudaErrorInvalidValue, "prefix kernel dispatch (dtype not f16 or bf16)");
  }
}

template <typename T, int kHeadDim>
void allow_shared_memory() {
  allow_dynamic_shared_memory<prefix_tiled_kernel<T, kHeadDim>, int(PrefixTiledConfig<kHeadDim>::kSmemBytes)>(
      "cudaFuncSetAttribute(prefix_tiled_kernel)");
}

}  // namespace

void launch_prefix_tiled(DType dtype, int head_dim, const PrefixParams& p, int grid, cudaStream_t stream) {
  dispatch_prefix_kernel(dtype, head_dim, [&]<typename T, int kHeadDim>() {
    using C = PrefixTiledConfig<kHeadDim>;
    allow_shared_memory<T, kHeadDim>();
    prefix_tiled_kernel<T, kHeadDim><<<unsigned(grid), C::kThreads, C::kSmemBytes, stream>>>(p);
    check_cuda(cudaGetLastError(), "prefix_tiled_kernel launch");
  });
}

PrefixKernelResources prefix_kernel_resources(DType dtype, int head_dim) {
  PrefixKernelResources r{};
  dispatch_prefix_kernel(dtype, head_dim, [&]<typename T, int kHeadDim>() {
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
    r.registers = attributes.numRegs;
    r.spill_bytes = int(attributes.localSizeBytes);
  });
  return r;
}

}  // namespace pagoda::cuda

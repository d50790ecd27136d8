#include <cstdint>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/kernels/shared_memory.cuh"
#include "pagoda/backend/cuda/kernels/decode_launch.h"
#include "pagoda/backend/cuda/kernels/decode_tiled.cuh"
#include "pagoda/backend/cuda/kernels/dispatch.cuh"

namespace pagoda::cuda {
namespace {

template <typename T, int kHeadDim>
void allow_shared_memory() {
  allow_dynamic_shared_memory<decode_tiled_kernel<T, kHeadDim>, int(DecodeTiledConfig<kHeadDim>::kSmemBytes)>(
      "cudaFuncSetAttribute(decode_tiled_kernel)");
}

}  // namespace

void launch_decode_tiled(DType dtype, int head_dim, DecodeParams p, int num_items, cudaStream_t stream) {
  dispatch_decode_kernel(dtype, head_dim, [&]<typename T, int kHeadDim>() {
    using C = DecodeTiledConfig<kHeadDim>;
    allow_shared_memory<T, kHeadDim>();
    // A prefetch inside the cp.async window would ask for a tile already being loaded.
    p.prefetch_distance = p.prefetch_distance <= 0 ? C::kDefaultPrefetchDistance
                          : p.prefetch_distance < C::kStages ? C::kStages
                                                             : p.prefetch_distance;
    decode_tiled_kernel<T, kHeadDim><<<num_items, C::kThreads, C::kSmemBytes, stream>>>(p);
    check_cuda(cudaGetLastError(), "decode_tiled_kernel launch");
  });
}

int decode_tiled_ctas_per_sm(DType dtype, int head_dim) {
  int ctas = 0;
  dispatch_decode_kernel(dtype, head_dim, [&]<typename T, int kHeadDim>() {
    using C = DecodeTiledConfig<kHeadDim>;
    allow_shared_memory<T, kHeadDim>();
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, decode_tiled_kernel<T, kHeadDim>,
                                                             C::kThreads, C::kSmemBytes),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  });
  return ctas;
}

}  // namespace pagoda::cuda

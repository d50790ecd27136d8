#include "pagoda/bench/per_head_decode.h"

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/kernels/dispatch.cuh"
#include "pagoda/bench/per_head_decode.cuh"

namespace pagoda::bench {

void launch_per_head_decode(DType dtype, int head_dim, cuda::DecodeParams p, int num_items, cudaStream_t stream) {
  using C = PerHeadDecodeConfig;
  if (p.prefetch_distance <= 0) p.prefetch_distance = C::kDefaultPrefetchDistance;
  const dim3 grid(num_items, p.group);  // one CTA per query head: no GQA sharing
  cuda::dispatch_decode_kernel(dtype, head_dim, [&]<typename T, int kHeadDim>() {
    per_head_decode_kernel<T, kHeadDim><<<grid, C::kThreads, 0, stream>>>(p);
  });
  cuda::check_cuda(cudaGetLastError(), "per_head_decode_kernel launch");
}

}  // namespace pagoda::bench

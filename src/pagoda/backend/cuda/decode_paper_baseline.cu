#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/kernels/decode_launch.h"
#include "pagoda/backend/cuda/kernels/decode_paper_baseline.cuh"
#include "pagoda/backend/cuda/kernels/dispatch.cuh"

namespace pagoda::cuda {

void launch_decode_paper_baseline(DType dtype, int head_dim, DecodeParams p, int num_items,
                                  cudaStream_t stream) {
  using C = DecodePaperBaselineConfig;
  if (p.prefetch_distance <= 0) p.prefetch_distance = C::kDefaultPrefetchDistance;
  const dim3 grid(num_items, p.group);  // one CTA per query head: no GQA sharing
  dispatch_decode_kernel(dtype, head_dim, [&]<typename T, int kHeadDim>() {
    decode_paper_baseline_kernel<T, kHeadDim><<<grid, C::kThreads, 0, stream>>>(p);
  });
  check_cuda(cudaGetLastError(), "decode_paper_baseline_kernel launch");
}

}  // namespace pagoda::cuda

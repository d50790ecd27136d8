#include <cmath>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/merge_states.h"

namespace pagoda::cuda {
namespace {

// One warp per row: the lanes first agree on the max lse, then each lane merges a slice of the
// head dimension. Every split contributes exp(lse_s - max) of weight; an all-empty row (every lse
// -inf) yields o = 0 and lse = -inf rather than the NaN that exp(-inf - -inf) would give.
__global__ void merge_states_kernel(const float* __restrict__ partial_o,
                                    const float* __restrict__ partial_lse, int num_splits,
                                    int num_rows, int head_dim, float* __restrict__ out_o,
                                    float* __restrict__ out_lse) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= num_rows) return;

  float max_lse = -INFINITY;
  for (int s = 0; s < num_splits; ++s) max_lse = fmaxf(max_lse, partial_lse[s * num_rows + row]);
  if (max_lse == -INFINITY) {
    for (int d = lane; d < head_dim; d += 32) out_o[size_t(row) * head_dim + d] = 0.f;
    if (out_lse && lane == 0) out_lse[row] = -INFINITY;
    return;
  }
  float weight_sum = 0.f;
  for (int s = 0; s < num_splits; ++s) weight_sum += __expf(partial_lse[s * num_rows + row] - max_lse);
  const float inv_sum = 1.f / weight_sum;
  for (int d = lane; d < head_dim; d += 32) {
    float acc = 0.f;
    for (int s = 0; s < num_splits; ++s) {
      const float w = __expf(partial_lse[s * num_rows + row] - max_lse);
      acc += w * partial_o[(size_t(s) * num_rows + row) * head_dim + d];
    }
    out_o[size_t(row) * head_dim + d] = acc * inv_sum;
  }
  if (out_lse && lane == 0) out_lse[row] = max_lse + logf(weight_sum);
}

}  // namespace

void merge_states(const float* partial_o, const float* partial_lse, int num_splits, int num_rows,
                  int head_dim, float* out_o, float* out_lse, cudaStream_t stream) {
  constexpr int kWarpsPerBlock = 4;
  const int blocks = (num_rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  merge_states_kernel<<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
      partial_o, partial_lse, num_splits, num_rows, head_dim, out_o, out_lse);
  check_cuda(cudaGetLastError(), "merge_states launch");
}

}  // namespace pagoda::cuda

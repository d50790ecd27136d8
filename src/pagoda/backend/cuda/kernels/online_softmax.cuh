// One online-softmax step of a warp's 16 query rows, in the layout of mma.sync m16n8k16
// accumulators (lane g * 4 + t holds rows g and g + 8, columns 2t and 2t + 1 of each n-tile), as
// the tensor-core attention kernels (prefill_tiled, prefix_tiled) keep S, O and the row state.
#pragma once

#include <cmath>

namespace pagoda::cuda {

// s: kTiles n-tiles of 8 scores, already scaled to the exp2 domain and -inf where masked.
// Replaces s with P = exp2(s - new max), adds P's row sums to row_sum (this lane's columns only),
// and rescales row_sum and O by the change of the row maximum (0 on a row's first step, whose max
// starts at -inf). A row with no finite score yet keeps the empty state (max -inf, sum 0, O 0):
// its exponents are taken against 0 instead of -inf, which would make them NaN.
template <int kTiles, int kDimTiles>
__device__ __forceinline__ void online_softmax_step(float (&s)[kTiles][4], float (&row_max)[2], float (&row_sum)[2],
                                                    float (&o_acc)[kDimTiles][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // rows g, then g + 8
    float step_max = -INFINITY;
#pragma unroll
    for (int n = 0; n < kTiles; ++n) step_max = fmaxf(step_max, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
    // Over the row: the 4 lanes sharing g.
    step_max = fmaxf(step_max, __shfl_xor_sync(0xffffffffu, step_max, 1));
    step_max = fmaxf(step_max, __shfl_xor_sync(0xffffffffu, step_max, 2));
    const float new_max = fmaxf(row_max[h], step_max);
    const float base = new_max == -INFINITY ? 0.f : new_max;
    const float correction = exp2f(row_max[h] - base);
    row_max[h] = new_max;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < kTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[n][2 * h + e];
        x = exp2f(x - base);
        sum += x;
      }
    }
    row_sum[h] = row_sum[h] * correction + sum;
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n) {
      o_acc[n][2 * h] *= correction;
      o_acc[n][2 * h + 1] *= correction;
    }
  }
}

}  // namespace pagoda::cuda

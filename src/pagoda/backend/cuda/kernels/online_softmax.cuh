// One online-softmax step of a warp's 16 query rows, in the layout of mma.sync m16n8k16
// accumulators (lane g * 4 + t holds rows g and g + 8, columns 2t and 2t + 1 of each n-tile), as
// the tensor-core attention kernels (prefill_tiled, prefix_tiled) keep S, O and the row state.
#pragma once

#include <cmath>

#include "pagoda/backend/cuda/kernels/ptx.cuh"

namespace pagoda::cuda {

// s: kTiles n-tiles of 8 raw scores (q . k), -inf where masked; scale_log2: the softmax scale
// times log2(e), which takes them to the exp2 domain inside the exponent's FFMA rather than by a
// multiply of its own. Replaces s with P = exp2(s * scale_log2 - reference), adds P's row sums to
// row_sum (this lane's columns only), and rescales row_sum and O when a row's reference moves.
//
// The reference (row_max) is a row's maximum so far, kept lazily: it moves only when a score
// exceeds it by more than kLazyRescaleLog2, so P stays <= 2^8 (exact to fp16's and bf16's
// relative precision, far from fp32's range) and the sum and O are still relative to one
// reference, which is all the final o / sum and lse = reference + log(sum) need. Most steps after
// a row's first then leave the reference where it was, and a warp whose rows all kept theirs
// skips O's rescale, the step's largest cost after the mma. A row with no finite score yet keeps
// the empty state (reference -inf, sum 0, O 0): its exponents are taken against 0 instead of
// -inf, which would make them NaN.
inline constexpr float kLazyRescaleLog2 = 8.f;

template <int kTiles, int kDimTiles>
__device__ __forceinline__ void online_softmax_step(float (&s)[kTiles][4], float scale_log2, float (&row_max)[2],
                                                    float (&row_sum)[2], float (&o_acc)[kDimTiles][4]) {
  float correction[2];
  bool rescale = false;  // a row of this lane moved a finite reference: O holds its old scale
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // rows g, then g + 8
    float step_max = -INFINITY;
#pragma unroll
    for (int n = 0; n < kTiles; ++n) step_max = fmaxf(step_max, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
    // Over the row: the 4 lanes sharing g.
    step_max = fmaxf(step_max, __shfl_xor_sync(0xffffffffu, step_max, 1));
    step_max = fmaxf(step_max, __shfl_xor_sync(0xffffffffu, step_max, 2));
    step_max *= scale_log2;  // the scale is positive: the maximum's place is the same
    const bool moves = step_max > row_max[h] + kLazyRescaleLog2;  // always, from -inf to a finite max
    const float reference = moves ? step_max : row_max[h];
    const float base = reference == -INFINITY ? 0.f : reference;
    correction[h] = moves ? ptx::exp2_ftz(row_max[h] - base) : 1.f;  // 0 from -inf: O and the sum are 0 then
    rescale |= moves && row_max[h] != -INFINITY;
    row_max[h] = reference;
    const float minus_base = -base;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < kTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[n][2 * h + e];
        x = ptx::exp2_ftz(fmaf(x, scale_log2, minus_base));
        sum += x;
      }
    }
    row_sum[h] = row_sum[h] * correction[h] + sum;
  }
  if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o_acc[n][e] *= correction[e / 2];
    }
  }
}

}  // namespace pagoda::cuda

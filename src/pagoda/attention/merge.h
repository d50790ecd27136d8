// The attention state and its merge, the ⊕ of cascade inference ("Cascade Inference: Memory
// Bandwidth Efficient Shared Prefix Batch Decoding", flashinfer.ai/2024/02/02/cascade-inference.html). The state of one query row over a KV index set I
// is (o, lse): o = sum_{i in I} softmax(s)_i v_i, normalized over I, and lse = log(sum_{i in I}
// exp(s_i)), both fp32. For disjoint I and J,
//   (o, lse)(I u J) = ( (o_I e^lse_I + o_J e^lse_J) / (e^lse_I + e^lse_J),  log(e^lse_I + e^lse_J) ),
// computed relative to max(lse_I, lse_J) so that nothing overflows. ⊕ is commutative and
// associative, so split-KV, cascade and prefix packing may merge partial states in any order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace pagoda::attention {

// The state of an empty KV set: sum(exp(s)) = 0, so lse = -inf, and o = 0 by convention. It is
// the identity of ⊕. It needs a branch: with both sides empty the max is -inf and the weights
// exp(-inf - -inf) would be NaN, so an empty side is skipped instead of weighted.
constexpr float kEmptyLse = -std::numeric_limits<float>::infinity();

// (o_a, lse_a) <- (o_a, lse_a) ⊕ (o_b, lse_b) for one query row; o_a, o_b: [head_dim].
inline void merge_state(float* o_a, float& lse_a, const float* o_b, float lse_b,
                        int32_t head_dim) {
  if (lse_b == kEmptyLse) return;
  if (lse_a == kEmptyLse) {
    std::copy(o_b, o_b + head_dim, o_a);
    lse_a = lse_b;
    return;
  }
  const float max_lse = std::max(lse_a, lse_b);
  const float weight_a = std::exp(lse_a - max_lse);  // one of the two weights is exactly 1
  const float weight_b = std::exp(lse_b - max_lse);
  const float sum = weight_a + weight_b;
  for (int32_t d = 0; d < head_dim; ++d) o_a[d] = (o_a[d] * weight_a + o_b[d] * weight_b) / sum;
  lse_a = max_lse + std::log(sum);
}

}  // namespace pagoda::attention

// The attention-state merge (⊕ of the cascade paper) on the GPU, for split-KV decode: partial
// states (o, lse) of the same query rows over disjoint KV ranges combine into one.
#pragma once

#include <cuda_runtime.h>

namespace pagoda::cuda {

// partial_o:   [num_splits, num_rows, head_dim] fp32, each normalized over its own KV range
// partial_lse: [num_splits, num_rows] fp32, log(sum(exp(s))) over that range; -inf when empty
// out_o:       [num_rows, head_dim] fp32;  out_lse: [num_rows] fp32, may be null
void merge_states(const float* partial_o, const float* partial_lse, int num_splits, int num_rows,
                  int head_dim, float* out_o, float* out_lse, cudaStream_t stream);

}  // namespace pagoda::cuda

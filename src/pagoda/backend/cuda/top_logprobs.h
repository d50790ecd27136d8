// The k most likely tokens of rows of logits by log-softmax, on the GPU: a beam search's
// candidates, so that k (token, log-prob) pairs per row cross to the host instead of the row
// (64 x 128256 x 4 B = 33 MB per step for 16 beam searches of width 4). Semantics and rounding:
// backend/top_logprobs.h, which it matches bit for bit wherever the double sums of the two round
// alike to float (their orders differ).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pagoda::cuda {

// The largest k (the survivors are sorted in shared memory).
inline constexpr int32_t kMaxTopLogprobsOnDevice = 4096;

// logits: device fp32 [*, ld], valid columns [0, vocab). rows: device [n], the rows to rank.
// tokens, logprobs: device [n, k], out, best first (equal log-probs lower id first).
// Stream-ordered, no allocation, no host synchronization. 1 <= k <= min(vocab, kMaxTopLogprobsOnDevice) and
// ld >= vocab, else pagoda::Error.
void top_logprobs(const float* logits, int64_t ld, int32_t vocab, const int32_t* rows, int32_t n, int32_t k,
                  int32_t* tokens, float* logprobs, cudaStream_t stream);

}  // namespace pagoda::cuda

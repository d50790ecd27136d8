#include "pagoda/backend/cuda/sampling.h"

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/kernels/sampling.cuh"

namespace pagoda::cuda {

void sample_tokens(const float* logits, int64_t ld, int32_t vocab, const SampleRow* rows, int32_t n,
                   int32_t* tokens, cudaStream_t stream) {
  if (n == 0) return;
  if (n < 0 || vocab <= 0 || vocab >= (1 << 24) || ld < vocab) {
    check_cuda(cudaErrorInvalidValue, "sample_tokens (needs n >= 0, 0 < vocab < 2^24, ld >= vocab)");
  }
  sampling_kernel::sample_tokens_kernel<<<unsigned(n), sampling_kernel::kThreads, 0, stream>>>(
      logits, ld, vocab, rows, tokens);
  check_cuda(cudaGetLastError(), "sample_tokens launch");
}

uint64_t sampling_random_bits(uint64_t seed, uint64_t offset) {
  return sampling_kernel::philox_random_bits(seed, offset);
}

}  // namespace pagoda::cuda

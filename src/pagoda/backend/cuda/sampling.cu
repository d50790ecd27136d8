#include "pagoda/backend/cuda/sampling.h"

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/kernels/sampling.cuh"
#include "pagoda/backend/cuda/kernels/top_logprobs.cuh"
#include "pagoda/backend/cuda/top_logprobs.h"

// One file for both kernels: top_logprobs' is built on sampling.cuh, whose kernel may be
// defined in one translation unit only.
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

static_assert(kMaxTopLogprobsOnDevice <= top_logprobs_kernel::kMaxK, "the kernel sorts the survivors in shared memory");

void top_logprobs(const float* logits, int64_t ld, int32_t vocab, const int32_t* rows, int32_t n, int32_t k,
                  int32_t* tokens, float* logprobs, cudaStream_t stream) {
  if (n == 0) return;
  if (n < 0 || vocab <= 0 || ld < vocab || k < 1 || k > vocab || k > kMaxTopLogprobsOnDevice) {
    check_cuda(cudaErrorInvalidValue, "top_logprobs (needs n >= 0, 1 <= k <= min(vocab, 4096), ld >= vocab)");
  }
  top_logprobs_kernel::top_logprobs_kernel<<<unsigned(n), top_logprobs_kernel::kThreads, 0, stream>>>(
      logits, ld, vocab, rows, k, tokens, logprobs);
  check_cuda(cudaGetLastError(), "top_logprobs launch");
}

}  // namespace pagoda::cuda

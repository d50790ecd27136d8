// Token sampling on the GPU: each row of logits becomes one token id on the device, so a decode
// step downloads [batch] int32 instead of a [batch, vocab] fp32 matrix (64 x 128256 x 4 B =
// 33 MB per step over PCIe).
//
// Semantics: steps 3-8 of the CPU Sampler (src/pagoda/engine/sampler.h); penalties (steps 1-2)
// are applied to the logits before this call, if at all. Per row, over columns [0, vocab):
//   greedy (temperature < 1e-5, the engine's kGreedyBelowTemperature): the argmax of the logits,
//      ties to the lowest id. Identical to the CPU Sampler.
//   otherwise z = logit / temperature (IEEE division, as on the CPU), w = exp(z - max z), and:
//   top-k:  keep the k best-ranked tokens; rank = larger z first, equal z lower id first (-0 and
//           +0 are equal), so exactly k tokens stay
//   top-p:  among the top-k survivors, in rank order, keep a token while the mass ranked strictly
//           before it is < top_p * (their total mass); the best-ranked token always stays
//   min-p:  keep tokens with w >= min_p (that is, p >= min_p * p_max)
//   draw:   u = sampling_random_bits(seed, offset) / 2^64; walk the survivors in token-id order
//           and return the first whose cumulative mass exceeds u * (their total mass)
//
// Where the GPU can differ from the CPU Sampler, besides the random numbers (Philox here,
// mt19937_64 there, so random draws differ):
//   - masses are exact integer sums of w quantized to 40 fraction bits (floor(w * 2^40)), so they
//     are independent of summation order (deterministic) but may differ from the CPU's double
//     sums in the last bits: a top-p cut or a draw that falls within ~1e-7 (relative) of a
//     boundary can land one token over; a token with w < 2^-40 (p < 1e-12 p_max) is never drawn
//   - w is CUDA's expf, within 2 ulp of std::exp: a token within 2 ulp of the min-p threshold
//     may be kept on one side and dropped on the other.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pagoda::cuda {

// How one row of logits becomes a token.
struct SampleRow {
  float temperature;  // < 1e-5: greedy argmax, ties to the lowest id; the filters are ignored
  int32_t top_k;      // <= 0 or >= vocab: off
  float top_p;        // >= 1: off; else in (0, 1)
  float min_p;        // 0: off; else in (0, 1]
  uint64_t seed;      // the request's seed
  uint64_t offset;    // which draw of the request this is (the tokens it sampled before): the
                      // random number depends on (seed, offset) alone, so a request samples the
                      // same tokens whatever batch it is in and whatever row it occupies
};

// logits: device fp32 [n, ld], valid columns [0, vocab) (columns past vocab are never read:
// padded vocabularies). rows: device [n]. tokens: device int32 [n], out. Stream-ordered, no
// allocation, no host synchronization (graph-capturable). Rows may mix greedy and random
// sampling. A random row needs a finite max logit (a row of all -inf gets its argmax, id 0).
// 0 < vocab < 2^24 (integer masses must fit 64 bits) and ld >= vocab, else pagoda::Error.
void sample_tokens(const float* logits, int64_t ld, int32_t vocab, const SampleRow* rows, int32_t n,
                   int32_t* tokens, cudaStream_t stream);

// The 64 random bits of draw (seed, offset), computed on the host exactly as the kernel does:
// Philox-4x32-10 (Salmon et al. 2011, Random123's constants) with key = (seed low 32 bits, seed
// high 32 bits) and counter = (offset low, offset high, 0, 0); the bits are output words 0 and 1,
// word 0 high. For tests and for replaying a request's draws.
uint64_t sampling_random_bits(uint64_t seed, uint64_t offset);

}  // namespace pagoda::cuda

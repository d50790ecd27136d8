// The top-log-probs kernel (semantics in backend/top_logprobs.h): one CTA per row of logits, on
// the sampling kernel's selections (sampling.cuh), over log-probs instead of scaled logits.
//
// Per row: the max (one pass), the log-sum-exp in double (one pass), the k-th ranked log-prob by
// the ladder and the radix select from the top (a counting pass, then four passes that skip what
// cannot reach the cut), the tie at the cut resolved in id order where it straddles it (two more
// passes), then one gathering pass into shared memory and a bitonic sort of the k survivors by
// (log-prob, lower id first). A row of vocab V is ~8 reads of 4V bytes, mostly from L2 (the
// lm_head just wrote it), and V double-precision exp: for 64 rows of Llama-3's 128256 logits,
// 33 MB from DRAM once and 8M exp, tens of microseconds, against 33 MB over PCIe per step when
// the host ranks downloaded rows.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "pagoda/backend/cuda/kernels/sampling.cuh"

namespace pagoda::cuda::top_logprobs_kernel {

using sampling_kernel::kThreads;
using sampling_kernel::kWarps;

// The gathered (key, id) pairs reuse the radix histograms' shared memory once selection is done.
constexpr int32_t kMaxK = sampling_kernel::kWarps * sampling_kernel::kBins;

struct LogprobRow {
  const float* logits;  // [vocab]
  int32_t vocab;
  float lse;
  float max_z;  // the largest log-prob
  __device__ float z(int32_t i) const { return logits[i] - lse; }
};

__global__ void __launch_bounds__(kThreads)
    top_logprobs_kernel(const float* __restrict__ logits, int64_t ld, int32_t vocab, const int32_t* __restrict__ rows,
                        int32_t k, int32_t* __restrict__ tokens, float* __restrict__ logprobs) {
  using namespace sampling_kernel;
  __shared__ Shared s;
  __shared__ double warp_sum[kWarps];
  __shared__ uint32_t gathered;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* row_logits = logits + int64_t(rows[blockIdx.x]) * ld;

  // lse = m + float(log(sum exp(double(x) - double(m)))): every thread adds the warps' sums in
  // the same order, so all hold the same lse.
  const float max = row_logits[block_argmax(row_logits, vocab, s)];
  double sum = 0;
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) sum += exp(double(row_logits[i]) - double(max));
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) warp_sum[warp] = sum;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < kWarps; ++w) total += warp_sum[w];
  const float lse = max + float(log(total));
  const LogprobRow row{row_logits, vocab, lse, max - lse};

  // The k-th ranked token, as sample_tokens' top-k finds it: its key, then among the tokens tied
  // at that key the (k - above)-th in id order.
  RankCut cut;
  if (k < vocab) {
    const uint32_t floor = top_k_floor(row, uint32_t(k), s);
    const auto count = [floor](int32_t, float, uint32_t key) { return uint64_t(key >= floor); };
    const Selection kth = select_from_top(row, count, uint64_t(k), s);
    cut.key = kth.key;
    const uint64_t needed = uint64_t(k) - kth.above;
    if (kth.at_key > needed) {
      const auto tied = [&](int32_t, float, uint32_t key) { return uint64_t(key == kth.key); };
      sum_weights(row, tied, s);
      cut.id = walk_to(row, tied, needed - 1, s);
    }
  }

  // The k survivors as (key << 32 | ~id): descending order is larger log-prob first, then lower
  // id. Padding to a power of two with 0, below every survivor.
  unsigned long long* slots = &s.warp_histogram[0][0];
  int32_t padded = 1;
  while (padded < k) padded *= 2;
  __syncthreads();  // the selections are done with the histograms
  for (int32_t j = threadIdx.x; j < padded; j += kThreads) slots[j] = 0;
  if (threadIdx.x == 0) gathered = 0;
  __syncthreads();
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
    const uint32_t key = order_key(row.z(i));
    if (!cut.keeps(i, key)) continue;
    const uint32_t slot = atomicAdd(&gathered, 1u);
    if (slot < uint32_t(k)) slots[slot] = (uint64_t(key) << 32) | uint64_t(~uint32_t(i));
  }
  for (int32_t size = 2; size <= padded; size *= 2) {
    for (int32_t stride = size / 2; stride > 0; stride /= 2) {
      __syncthreads();
      for (int32_t t = threadIdx.x; t < padded / 2; t += kThreads) {
        const int32_t i = 2 * stride * (t / stride) + t % stride, j = i + stride;
        const unsigned long long a = slots[i], b = slots[j];
        if ((a < b) == ((i & size) == 0)) {  // descending within blocks whose bit `size` is 0
          slots[i] = b;
          slots[j] = a;
        }
      }
    }
  }
  __syncthreads();
  for (int32_t j = threadIdx.x; j < k; j += kThreads) {
    const auto id = int32_t(~uint32_t(slots[j]));
    tokens[int64_t(blockIdx.x) * k + j] = id;
    logprobs[int64_t(blockIdx.x) * k + j] = row.z(id);
  }
}

}  // namespace pagoda::cuda::top_logprobs_kernel

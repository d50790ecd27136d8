// The token-sampling kernel (semantics in sampling.h): one CTA per row of logits, which it
// re-reads from L2 a few times (a 152K vocabulary is 600 KB, too large for shared memory).
//
// No sort. Every selection is either
//   - a radix select from the top over the order-preserving bits of z (four passes of 8 bits):
//     the key v where the weight ranked above crosses a target, with a per-bin histogram of an
//     integer weight (1 for top-k's count, the quantized probability for top-p's mass). Tokens
//     that provably rank below the answer weigh 0 (a cheap bound first), so the histograms see
//     few tokens: shared-memory atomics on a few hot bins are what a radix pass costs; or
//   - a walk in token-id order: the first token whose cumulative weight exceeds a threshold,
//     which breaks ties at a cut key (lower ids first) and performs the final draw. Per-warp
//     sums of a full pass find the warp range that holds the crossing, per-thread sums of that
//     range the thread, which then walks its ~16 tokens.
// All weights are integers, so every sum is exact and independent of the order in which the
// threads add: a row gives the same token on every run, in every batch.
//
// Sampling on the device costs less than downloading the logits would (docs/experiments/engine.md).
// Each pass divides and keys all of the row (compute-bound, not memory-bound), so filters that
// need more passes (top-k, top-p) cost more than greedy's one read.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "pagoda/backend/cuda/sampling.h"

namespace pagoda::cuda::sampling_kernel {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kRadixBits = 8;
constexpr int kBins = 1 << kRadixBits;
constexpr int kBinsPerLane = kBins / 32;
// Top-k's ladder: distances below max z at which the tokens are counted, to find a floor that
// k tokens clear (z units: after temperature).
constexpr int kLadderRungs = 8;
constexpr float kLadderFirstRung = 0.25f;  // then doubling: 0.25, 0.5, ..., 32
// pagoda::kGreedyBelowTemperature (engine/sampling_params.h), which the backend cannot include.
constexpr float kGreedyTemperature = 1e-5f;
// Probabilities relative to the best token, w = exp(z - max z) in [0, 1], become integers with
// 40 fraction bits: a vocabulary below 2^24 sums to less than 2^64.
constexpr float kWeightScale = 1099511627776.0f;  // 2^40

// Philox-4x32-10 (Random123's round and key-schedule constants): 10 rounds of two 32x32->64
// multiplies, a counter-based generator, so draw (seed, offset) needs no state between steps.
__host__ __device__ inline uint64_t philox_random_bits(uint64_t seed, uint64_t offset) {
  uint32_t c0 = uint32_t(offset), c1 = uint32_t(offset >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c0;
    const uint64_t p1 = uint64_t(0xCD9E8D57u) * c2;
    const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c1 = uint32_t(p1);
    c3 = uint32_t(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return (uint64_t(c0) << 32) | c1;
}

// Unsigned keys that order like the floats: larger z, larger key. -0 becomes +0 first, so
// equal logits are equal keys, as the CPU's float comparison sees them.
__device__ __forceinline__ uint32_t order_key(float z) {
  const uint32_t bits = __float_as_uint(z == 0.0f ? 0.0f : z);
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

__device__ __forceinline__ uint64_t quantize_weight(float w) { return __float2ull_rz(w * kWeightScale); }

// Tokens that rank no later than the cut token (key, id) survive the rank filters. The
// initial cut keeps everything: every non-NaN float has a key > 0.
struct RankCut {
  uint32_t key = 0;
  int32_t id = INT32_MAX;
  __device__ bool keeps(int32_t i, uint32_t k) const { return k > key || (k == key && i <= id); }
};

// The row the selections below read: any type with vocab, max_z and z(i) (top_logprobs.cuh
// ranks log-probs, z = logit - lse, with them).
struct Row {
  const float* logits;  // [vocab]
  int32_t vocab;
  float temperature;
  float max_z;
  __device__ float z(int32_t i) const { return logits[i] / temperature; }
  __device__ float weight(float z_i) const { return expf(z_i - max_z); }
};

// Warp w owns the contiguous ids [begin, end), a multiple of 32 long (but the last): per-warp
// sums are then sums over id ranges, which is what a walk in id order needs.
struct WarpRange {
  int32_t begin;
  int32_t end;
};
__device__ inline WarpRange warp_range(int32_t vocab, int warp) {
  const int32_t chunk = (vocab + kThreads - 1) / kThreads * 32;
  const int32_t begin = min(vocab, warp * chunk);
  return {begin, min(vocab, begin + chunk)};
}

struct Shared {
  // One private histogram per warp: atomics of different warps never collide.
  unsigned long long warp_histogram[kWarps][kBins];
  unsigned long long histogram[kBins];
  unsigned long long warp_total[kWarps];
  unsigned long long scan_total[kWarps];
  uint32_t ladder_count[kLadderRungs];
  float warp_best[kWarps];
  int32_t warp_best_id[kWarps];
  uint32_t key;  // select_from_top's result so far
  unsigned long long above;
  unsigned long long at_key;
  int32_t walk_warp;
  unsigned long long walk_threshold;
  int32_t token;
};

// The argmax of the raw logits, lowest id on ties (dividing by a positive temperature is
// monotonic, so it is the argmax of z too). NaN never wins.
__device__ inline int32_t block_argmax(const float* logits, int32_t vocab, Shared& s) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float best = -INFINITY;
  int32_t best_id = INT32_MAX;
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = logits[i];
    if (v > best || (v == best && i < best_id)) {
      best = v;
      best_id = i;
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const float v = __shfl_xor_sync(0xffffffffu, best, offset);
    const int32_t id = __shfl_xor_sync(0xffffffffu, best_id, offset);
    if (v > best || (v == best && id < best_id)) {
      best = v;
      best_id = id;
    }
  }
  if (lane == 0) {
    s.warp_best[warp] = best;
    s.warp_best_id[warp] = best_id;
  }
  __syncthreads();
  best = s.warp_best[0];
  best_id = s.warp_best_id[0];
  for (int w = 1; w < kWarps; ++w) {
    if (s.warp_best[w] > best || (s.warp_best[w] == best && s.warp_best_id[w] < best_id)) {
      best = s.warp_best[w];
      best_id = s.warp_best_id[w];
    }
  }
  // A row of NaN only: no id won. Keep the result a valid token.
  return best_id == INT32_MAX ? 0 : best_id;
}

struct Selection {
  uint32_t key;       // the crossing key v
  uint64_t above;     // weight of the tokens with key > v: < target
  uint64_t at_key;    // weight of the tokens with key == v: above + at_key >= target
};

// Radix select from the top: the key v with W(key > v) < target <= W(key >= v), where W sums
// weight(i, z, key) (an integer). Needs 1 <= target <= W(all). Four passes over the row.
template <typename RowT, typename Weight>
__device__ Selection select_from_top(const RowT& row, const Weight& weight, uint64_t target, Shared& s) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const WarpRange range = warp_range(row.vocab, warp);
  uint32_t prefix = 0;
  uint64_t above = 0;
  for (int shift = 32 - kRadixBits; shift >= 0; shift -= kRadixBits) {
    for (int b = threadIdx.x; b < kWarps * kBins; b += kThreads) (&s.warp_histogram[0][0])[b] = 0;
    __syncthreads();
    const uint32_t decided = shift + kRadixBits >= 32 ? 0u : ~0u << (shift + kRadixBits);
    for (int32_t i = range.begin + lane; i < range.end; i += 32) {
      const float z = row.z(i);
      const uint32_t key = order_key(z);
      if ((key & decided) != prefix) continue;
      const uint64_t w = weight(i, z, key);
      if (w != 0) atomicAdd(&s.warp_histogram[warp][(key >> shift) & (kBins - 1)], w);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      unsigned long long sum = 0;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += s.warp_histogram[w][b];
      s.histogram[b] = sum;
    }
    __syncthreads();
    if (warp == 0) {
      // Lane l holds bins kBins-1-8l down to kBins-8-8l: lane order is descending key order.
      const int top_bin = kBins - 1 - lane * kBinsPerLane;
      uint64_t lane_sum = 0;
#pragma unroll
      for (int j = 0; j < kBinsPerLane; ++j) lane_sum += s.histogram[top_bin - j];
      uint64_t inclusive = lane_sum;
      for (int d = 1; d < 32; d *= 2) {
        const uint64_t t = __shfl_up_sync(0xffffffffu, inclusive, d);
        if (lane >= d) inclusive += t;
      }
      const uint32_t crossed = __ballot_sync(0xffffffffu, above + inclusive >= target);
      if (lane == __ffs(crossed) - 1) {
        uint64_t cumulative = above + inclusive - lane_sum;
        for (int j = 0; j < kBinsPerLane; ++j) {
          const uint64_t h = s.histogram[top_bin - j];
          if (cumulative + h >= target) {
            s.key = prefix | (uint32_t(top_bin - j) << shift);
            s.above = cumulative;
            s.at_key = h;
            break;
          }
          cumulative += h;
        }
      }
    }
    __syncthreads();
    prefix = s.key;
    above = s.above;
  }
  return {prefix, above, s.at_key};
}

// The total of weight over the row; leaves each warp's share in s.warp_total for walk_to().
template <typename RowT, typename Weight>
__device__ uint64_t sum_weights(const RowT& row, const Weight& weight, Shared& s) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const WarpRange range = warp_range(row.vocab, warp);
  uint64_t sum = 0;
  for (int32_t i = range.begin + lane; i < range.end; i += 32) {
    const float z = row.z(i);
    sum += weight(i, z, order_key(z));
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) s.warp_total[warp] = sum;
  __syncthreads();
  uint64_t total = 0;
  for (int w = 0; w < kWarps; ++w) total += s.warp_total[w];
  __syncthreads();  // s.warp_total stays for walk_to(); nothing rewrites it before the next sum
  return total;
}

// The first token, in id order, whose cumulative weight exceeds threshold (< the total that the
// preceding sum_weights(row, weight) returned, with the same weight). Integer sums: the per-thread
// pieces add up to exactly the per-warp totals, so the crossing is always found.
template <typename RowT, typename Weight>
__device__ int32_t walk_to(const RowT& row, const Weight& weight, uint64_t threshold, Shared& s) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    uint64_t before = 0;
    int w = 0;
    while (w < kWarps - 1 && before + s.warp_total[w] <= threshold) before += s.warp_total[w++];
    s.walk_warp = w;
    s.walk_threshold = threshold - before;
    s.token = -1;
  }
  __syncthreads();
  // The crossing warp's range, cut into one contiguous piece per thread.
  const WarpRange range = warp_range(row.vocab, s.walk_warp);
  const int32_t piece = (range.end - range.begin + kThreads - 1) / kThreads;
  const int32_t begin = min(range.end, range.begin + int32_t(threadIdx.x) * piece);
  const int32_t end = min(range.end, begin + piece);
  uint64_t mine = 0;
  for (int32_t i = begin; i < end; ++i) {
    const float z = row.z(i);
    mine += weight(i, z, order_key(z));
  }
  uint64_t inclusive = mine;
  for (int d = 1; d < 32; d *= 2) {
    const uint64_t t = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) inclusive += t;
  }
  if (lane == 31) s.scan_total[warp] = inclusive;
  __syncthreads();
  uint64_t before = inclusive - mine;
  for (int w = 0; w < warp; ++w) before += s.scan_total[w];
  const uint64_t local = s.walk_threshold;
  if (before <= local && local < before + mine) {
    for (int32_t i = begin; i < end; ++i) {
      const float z = row.z(i);
      before += weight(i, z, order_key(z));
      if (before > local) {
        s.token = i;
        break;
      }
    }
  }
  __syncthreads();
  return s.token;
}

// A key floor that at least k tokens clear, so the k best all do: the highest rung of a ladder
// below max z that holds k tokens. 0 (every token) when even the lowest holds fewer. One pass of
// comparisons into registers, no atomics per token.
template <typename RowT>
__device__ uint32_t top_k_floor(const RowT& row, uint32_t k, Shared& s) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float rung[kLadderRungs];
  uint32_t count[kLadderRungs];
#pragma unroll
  for (int j = 0; j < kLadderRungs; ++j) {
    rung[j] = row.max_z - kLadderFirstRung * float(1 << j);
    count[j] = 0;
  }
  if (threadIdx.x < kLadderRungs) s.ladder_count[threadIdx.x] = 0;
  __syncthreads();
  const WarpRange range = warp_range(row.vocab, warp);
  for (int32_t i = range.begin + lane; i < range.end; i += 32) {
    const float z = row.z(i);
#pragma unroll
    for (int j = 0; j < kLadderRungs; ++j) count[j] += z >= rung[j];
  }
#pragma unroll
  for (int j = 0; j < kLadderRungs; ++j) {
    const uint32_t total = __reduce_add_sync(0xffffffffu, count[j]);
    if (lane == 0) atomicAdd(&s.ladder_count[j], total);
  }
  __syncthreads();
  uint32_t floor = 0;
  for (int j = kLadderRungs - 1; j >= 0; --j) {
    if (s.ladder_count[j] >= k) floor = order_key(rung[j]);
  }
  __syncthreads();  // s.ladder_count is reset by the next call
  return floor;
}

__global__ void __launch_bounds__(kThreads)
    sample_tokens_kernel(const float* __restrict__ logits, int64_t ld, int32_t vocab,
                         const SampleRow* __restrict__ rows, int32_t* __restrict__ tokens) {
  __shared__ Shared s;
  const SampleRow params = rows[blockIdx.x];
  const float* row_logits = logits + int64_t(blockIdx.x) * ld;
  const int32_t best = block_argmax(row_logits, vocab, s);
  const float max_z = row_logits[best] / params.temperature;
  if (params.temperature < kGreedyTemperature || !isfinite(max_z)) {
    if (threadIdx.x == 0) tokens[blockIdx.x] = best;
    return;
  }
  const Row row{row_logits, vocab, params.temperature, max_z};

  RankCut cut;
  if (params.top_k > 0 && params.top_k < vocab) {
    // The k-th ranked token: its key, then, among the tokens tied at that key, the
    // (k - above)-th in id order (only when the tie straddles the cut).
    const uint32_t floor = top_k_floor(row, uint32_t(params.top_k), s);
    const auto count = [floor](int32_t, float, uint32_t key) { return uint64_t(key >= floor); };
    const Selection kth = select_from_top(row, count, uint64_t(params.top_k), s);
    cut.key = kth.key;
    const uint64_t needed = uint64_t(params.top_k) - kth.above;
    if (kth.at_key > needed) {
      const auto tied = [&](int32_t, float, uint32_t key) { return uint64_t(key == kth.key); };
      sum_weights(row, tied, s);
      cut.id = walk_to(row, tied, needed - 1, s);
    }
  }

  if (params.top_p < 1.0f) {
    // Over the top-k survivors: the cut key, where the mass ranked above drops below the target,
    // then the last token of that key (in id order) whose mass before it is < the target.
    const RankCut top_k_cut = cut;
    const auto mass = [&](int32_t i, float z, uint32_t key) {
      return top_k_cut.keeps(i, key) ? quantize_weight(row.weight(z)) : uint64_t(0);
    };
    const uint64_t total = sum_weights(row, mass, s);
    // mass_before < top_p * total  <=>  mass_before < ceil(top_p * total), in integers.
    const double real_target = ceil(double(params.top_p) * double(total));
    const uint64_t target = real_target < 1.0             ? 1
                            : real_target >= double(total) ? total
                                                           : uint64_t(real_target);
    // A token of mass q has at most vocab tokens ranked after it, each of mass <= ~q, so the
    // mass ranked before it is >= total - vocab * q: once q <= (total - target) / vocab it cannot
    // stay, nor rank at or above the cut. (A quarter of that bound, against expf's ulps.)
    const uint64_t never_kept = (total - target) / (4 * uint64_t(row.vocab));
    const auto candidate_mass = [&](int32_t i, float z, uint32_t key) {
      const uint64_t q = mass(i, z, key);
      return q > never_kept ? q : uint64_t(0);
    };
    const Selection crossing = select_from_top(row, candidate_mass, target, s);
    const auto tied_mass = [&](int32_t i, float z, uint32_t key) {
      return key == crossing.key ? mass(i, z, key) : uint64_t(0);
    };
    sum_weights(row, tied_mass, s);
    cut.key = crossing.key;
    cut.id = walk_to(row, tied_mass, target - crossing.above - 1, s);
  }

  // min-p, then the draw: the inverse CDF of the survivors' mass in id order at u * total.
  const float min_weight = params.min_p;
  const auto survivor_mass = [&](int32_t i, float z, uint32_t key) {
    if (!cut.keeps(i, key)) return uint64_t(0);
    const float w = row.weight(z);
    return w >= min_weight ? quantize_weight(w) : uint64_t(0);
  };
  // > 0: the best token has w = 1, survives every filter, and weighs 2^40.
  const uint64_t total = sum_weights(row, survivor_mass, s);
  const uint64_t threshold = __umul64hi(philox_random_bits(params.seed, params.offset), total);
  const int32_t token = walk_to(row, survivor_mass, threshold, s);
  if (threadIdx.x == 0) tokens[blockIdx.x] = token < 0 ? best : token;
}

}  // namespace pagoda::cuda::sampling_kernel

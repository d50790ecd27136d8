// per_head_decode_kernel: the decode structure the L2-prefetch paper starts from ("Accelerating
// LLM Inference Throughput via Asynchronous KV Cache Prefetching", arXiv:2504.06319, Figure 2 and
// Algorithm 1; vLLM's xFormers-era paged kernel), kept as the benchmarks' baseline:
// one CTA per (work item, query row), so a GQA group reads its KV once per query head; four
// warps, warp w taking blocks w, w + 4, ...; KV loaded straight into registers and reduced on
// CUDA cores. Every load waits on device memory, which is what prefetching hides: while warp w
// works on block b it asks L2 for block b + 4 * prefetch_distance with
// cp.async.bulk.prefetch.L2, and its own loads are marked evict_first.
//
// Within a block, 16 tokens at a time: two lanes per token split the K row (their dot products
// meet through one shuffle), then every lane owns head_dim / 32 output dims and walks the 16 V
// rows. Each warp keeps an online-softmax state; the warps merge with ⊕ at the end.
#pragma once

#include <cmath>
#include <cstdint>

#include "pagoda/backend/cuda/kernels/store_state.cuh"
#include "pagoda/backend/cuda/kernels/ptx.cuh"

namespace pagoda::bench {

namespace ptx = cuda::ptx;

struct PerHeadDecodeConfig {
  static constexpr int kWarps = 4;  // 128 threads, the paper's N_thread (Table 2)
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kDefaultPrefetchDistance = 1;  // Algorithm 1: the warp's next block
};

// N bytes of KV from global memory (N = 4, 8 or 16), evict_first when `hint`.
template <int kBytes>
struct KvWords {
  uint32_t w[kBytes / 4];
};
template <int kBytes>
__device__ __forceinline__ KvWords<kBytes> load_kv(const void* src, bool hint, uint64_t policy) {
  KvWords<kBytes> r;
  if constexpr (kBytes == 16) {
    const uint4 v = hint ? ptx::load_16_hint(src, policy) : __ldg(static_cast<const uint4*>(src));
    r.w[0] = v.x, r.w[1] = v.y, r.w[2] = v.z, r.w[3] = v.w;
  } else if constexpr (kBytes == 8) {
    const uint2 v = hint ? ptx::load_8_hint(src, policy) : __ldg(static_cast<const uint2*>(src));
    r.w[0] = v.x, r.w[1] = v.y;
  } else {
    static_assert(kBytes == 4);
    r.w[0] = hint ? ptx::load_4_hint(src, policy) : __ldg(static_cast<const uint32_t*>(src));
  }
  return r;
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(PerHeadDecodeConfig::kThreads)
    per_head_decode_kernel(const cuda::DecodeParams p) {
  using C = PerHeadDecodeConfig;
  constexpr int kChunksPerLane = kHeadDim / 16;  // 16-byte K chunks per lane (two lanes a row)
  constexpr int kDimsPerLane = kHeadDim / 32;    // output dims per lane
  __shared__ float q_s[kHeadDim];
  __shared__ float red_o[C::kWarps][kHeadDim];
  __shared__ float red_max[C::kWarps];
  __shared__ float red_sum[C::kWarps];

  ptx::launch_dependents();  // the merge, if any, may start its launch while this grid runs
  const attention::WorkItem item = p.items[blockIdx.x];
  const int r = blockIdx.y;  // query row within the group
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int half = lane & 1;   // which half of the K row's chunks
  const int token_in_pass = lane >> 1;
  const int num_tokens = item.token_end - item.token_begin;
  const int block_size = 1 << p.pool.block_size_log2;
  const int num_blocks = (num_tokens + block_size - 1) >> p.pool.block_size_log2;
  const int32_t* blocks = p.block_ids + item.block_begin;
  const T* k_head = static_cast<const T*>(p.pool.k) + item.kv_head * p.pool.head_stride;
  const T* v_head = static_cast<const T*>(p.pool.v) + item.kv_head * p.pool.head_stride;
  const bool hint = p.evict_first;
  const uint64_t policy = hint ? ptx::evict_first_policy() : 0;

  const int64_t q_row = int64_t(item.seq) * p.num_q_heads + int64_t(item.kv_head) * p.group + r;
  for (int d = tid; d < kHeadDim; d += C::kThreads) {
    q_s[d] = ptx::to_float(static_cast<const T*>(p.q)[q_row * kHeadDim + d]) * p.scale_log2;
  }
  __syncthreads();

  float max = -INFINITY, sum = 0.f;  // warp-uniform; exp2 domain
  float acc[kDimsPerLane] = {};

  for (int b = warp; b < num_blocks; b += C::kWarps) {
    const int64_t page = int64_t(blocks[b]) * p.pool.page_stride;
    const int ahead = b + C::kWarps * p.prefetch_distance;
    if (p.l2_prefetch && ahead < num_blocks) {  // Algorithm 1, lines 5-7
      const int64_t ahead_page = int64_t(blocks[ahead]) * p.pool.page_stride;
      if (p.blocks_contiguous) {
        if (lane < 2) ptx::prefetch_l2((lane ? v_head : k_head) + ahead_page, block_size * kHeadDim * 2);
      } else {
        for (int row = lane; row < 2 * block_size; row += 32) {
          ptx::prefetch_l2((row & 1 ? v_head : k_head) + ahead_page + (row >> 1) * p.pool.token_stride, kHeadDim * 2);
        }
      }
    }
    for (int t0 = 0; t0 < block_size; t0 += 16) {
      const int pass_begin = b * block_size + t0;
      if (pass_begin >= num_tokens) break;
      const int token = pass_begin + token_in_pass;
      const bool valid = token < num_tokens;
      float score = 0.f;
      if (valid) {
        const T* k_row = k_head + page + (t0 + token_in_pass) * p.pool.token_stride;
#pragma unroll
        for (int c = 0; c < kChunksPerLane; ++c) {
          const int chunk = 2 * c + half;  // the pair of lanes reads 32 contiguous bytes
          const KvWords<16> k = load_kv<16>(k_row + chunk * 8, hint, policy);
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            const float2 kf = ptx::unpack2<T>(k.w[w]);
            score += kf.x * q_s[chunk * 8 + 2 * w] + kf.y * q_s[chunk * 8 + 2 * w + 1];
          }
        }
      }
      score += __shfl_xor_sync(0xffffffffu, score, 1);
      score = valid ? score : -INFINITY;
      float pass_max = score;
#pragma unroll
      for (int offset = 2; offset < 32; offset *= 2) {
        pass_max = fmaxf(pass_max, __shfl_xor_sync(0xffffffffu, pass_max, offset));
      }
      const float new_max = fmaxf(max, pass_max);  // finite: token pass_begin is valid
      const float correction = exp2f(max - new_max);
      max = new_max;
      const float prob = exp2f(score - new_max);
      float pass_sum = half ? 0.f : prob;  // each token is held by two lanes
#pragma unroll
      for (int offset = 1; offset < 32; offset *= 2) pass_sum += __shfl_xor_sync(0xffffffffu, pass_sum, offset);
      sum = sum * correction + pass_sum;
#pragma unroll
      for (int e = 0; e < kDimsPerLane; ++e) acc[e] *= correction;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const float prob_j = __shfl_sync(0xffffffffu, prob, 2 * j);
        if (pass_begin + j < num_tokens) {
          const T* v_row = v_head + page + (t0 + j) * p.pool.token_stride + lane * kDimsPerLane;
          const KvWords<kDimsPerLane * 2> v = load_kv<kDimsPerLane * 2>(v_row, hint, policy);
#pragma unroll
          for (int w = 0; w < kDimsPerLane / 2; ++w) {
            const float2 vf = ptx::unpack2<T>(v.w[w]);
            acc[2 * w] += prob_j * vf.x;
            acc[2 * w + 1] += prob_j * vf.y;
          }
        }
      }
    }
  }

  // ⊕ over the warps (a warp with no blocks holds the empty state: max -inf, sum 0).
#pragma unroll
  for (int e = 0; e < kDimsPerLane; ++e) red_o[warp][lane * kDimsPerLane + e] = acc[e];
  if (lane == 0) {
    red_max[warp] = max;
    red_sum[warp] = sum;
  }
  __syncthreads();
  float all_max = -INFINITY;
#pragma unroll
  for (int w = 0; w < C::kWarps; ++w) all_max = fmaxf(all_max, red_max[w]);
  float all_sum = 0.f;
  if (all_max != -INFINITY) {
#pragma unroll
    for (int w = 0; w < C::kWarps; ++w) all_sum += red_sum[w] * exp2f(red_max[w] - all_max);
  }
  for (int d = tid; d < kHeadDim; d += C::kThreads) {
    float o = 0.f;
    if (all_sum > 0.f) {
#pragma unroll
      for (int w = 0; w < C::kWarps; ++w) o += red_o[w][d] * exp2f(red_max[w] - all_max);
      o /= all_sum;
    }
    cuda::store_state_o<T, kHeadDim>(p, item, r, d, o);
  }
  if (tid == 0) cuda::store_state_lse(p, item, r, all_sum > 0.f ? all_max * float(M_LN2) + logf(all_sum) : -INFINITY);
}

}  // namespace pagoda::bench

// decode_int2_kernel: paged decode attention computed on int2 KV codes, as "HACK: Homomorphic
// Acceleration via Compression of the Key-Value Cache for Disaggregated LLM Inference"
// (arXiv:2502.03589) does, with the numbers of cpu::attend_quantized_group. One CTA runs one work
// item of a DecodePlan (the GQA group of one (sequence, kv head) over a run of blocks, split KV
// merged by merge_states as for f16); each of its 4 warps takes whole blocks, and a block here
// is one V partition (Π = block size = 64), so every warp quantizes its own P.
//
// With a ~ m_a + s_a a' per partition of Π elements:
//   sum a b ~ Π m_a m_b + m_a s_b sum b' + m_b s_a sum a' + s_a s_b sum a' b',
// sum a' b' on the integer tensor cores (mma.sync m16n8k32 u8 x u8 -> s32), the code sums of K
// and V read from the pool (summation elimination), Q's and P's computed here:
//   S^T [16 tokens x 8 rows]  = K' [16 tokens x 32 dims] . Q'^T      (A = K codes, B = Q uint8)
//   O^T [16 dims x 8 rows]   += V'^T [16 dims x 32 tokens] . P'^T    (A = V codes, B = P uint8)
// The 2-bit codes are widened to bytes in registers: a 32-bit word of 16 codes gives, for
// u = 0..3, the 4 bytes (w >> 2u) & 0x03030303, i.e. elements 4i + u of the word's 16. An MMA
// sums over its k index in any order, so Q's and P's codes are stored in shared memory in that
// same order (word 4 t + u of a 64-element group holds elements 16 t + 4 i + u) and each B
// register is one 32-bit load. The open V partition of a sequence (fewer than Π tokens) is read
// from the f16 tail and weighted by fp32 P on the CUDA cores.
//
// Loads: a partition's K and V codes and metadata are six contiguous runs (5.3 KB at d = 128);
// each warp copies its own next partition with cp.async into its own shared-memory stage while it
// computes the current one, so no warp waits on memory between partitions and the CTA needs no
// barrier until the epilogue.
//
// Bytes: per token and kv head, K: d/4 codes + d/Π x (2 + 2 + 1) metadata; V: d/4 codes + d x 5
// / Π; + q and out. FLOPs: 4 x L x Hq x d integer MACs (as 2 bytes-ops each) per sequence.
#pragma once

#include <cmath>
#include <cstdint>

#include "pagoda/backend/cuda/kernels/ptx.cuh"
#include "pagoda/backend/cuda/kernels/quantized_decode_params.h"
#include "pagoda/backend/cuda/kernels/store_state.cuh"

namespace pagoda::cuda {

namespace kernels {

// d += a * b, a 16x32 u8 (row), b 32x8 u8 (col), d 16x8 s32.
__device__ __forceinline__ void mma_u8_16x8x32(int32_t (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t widen_codes(uint32_t word, int u) { return (word >> (2 * u)) & 0x03030303u; }

// Byte of element e (0..63) of a 64-element group in the MMA order above.
__device__ __forceinline__ int mma_order(int e) { return ((e / 16) * 4 + e % 4) * 4 + (e % 16) / 4; }

}  // namespace kernels

// One warp's stage: a partition's codes and metadata as they lie in the pool.
template <int kHeadDim>
struct DecodeInt2Stage {
  static constexpr int kParts = kHeadDim / kInt2Partition;  // K partitions per token
  static constexpr int kKCodes = 0;                                   // [64 tokens][d / 4]
  static constexpr int kVCodes = kKCodes + kInt2Partition * kHeadDim / 4;  // [d channels][16]
  static constexpr int kKMin = kVCodes + kHeadDim * kInt2Partition / 4;     // [64][kParts] f16
  static constexpr int kKScale = kKMin + kInt2Partition * kParts * 2;
  static constexpr int kKSums = kKScale + kInt2Partition * kParts * 2;      // [64][kParts] u8
  static constexpr int kVMin = kKSums + kInt2Partition * kParts;            // [d] f16
  static constexpr int kVScale = kVMin + kHeadDim * 2;
  static constexpr int kVSums = kVScale + kHeadDim * 2;                      // [d] u8
  static constexpr int kBytes = kVSums + kHeadDim;
  static constexpr int kStages = 2;
  static constexpr int kReduceBytes = kQuantizedDecodeWarps * 8 * kHeadDim * 4;
  static constexpr int kPipelineBytes = kQuantizedDecodeWarps * kStages * kBytes;
  static constexpr int kSmemBytes = kPipelineBytes > kReduceBytes ? kPipelineBytes : kReduceBytes;
  static_assert(kBytes % 16 == 0 && kKMin % 16 == 0 && kKSums % 16 == 0 && kVMin % 16 == 0 && kVSums % 16 == 0);
};

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kQuantizedDecodeWarps * 32, 3) decode_int2_kernel(const QuantizedDecodeParams qp) {
  constexpr int kWarps = kQuantizedDecodeWarps;
  constexpr int kPart = kInt2Partition;
  constexpr int kChunks = kHeadDim / kPart;  // K partitions per token
  constexpr int kDimTiles = kHeadDim / 16;
  const DecodeParams& p = qp.base;
  const kernels::QuantizedPoolArgs& pool = qp.pool;
  __shared__ uint32_t q_words[8][kHeadDim / 4];
  __shared__ float q_min[8][kChunks], q_scale[8][kChunks];
  __shared__ int32_t q_sum[8][kChunks];
  __shared__ uint32_t p_words[kWarps][8][kPart / 4];
  __shared__ float p_open[kWarps][8][kPart];
  __shared__ float red_max[kWarps][8], red_sum[kWarps][8];
  using S = DecodeInt2Stage<kHeadDim>;
  extern __shared__ __align__(128) uint8_t stages[];  // [warp][stage][S::kBytes], then the epilogue's o

  ptx::launch_dependents();
  const attention::WorkItem item = p.items[blockIdx.x];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int num_tokens = item.token_end - item.token_begin;
  const int num_parts = (num_tokens + kPart - 1) / kPart;
  const int32_t* blocks = p.block_ids + item.block_begin;
  const int h = item.kv_head;

  // Q to uint8 per partition of head_dim: warp w quantizes (row, partition) tasks w, w + 4, ...
  for (int task = warp; task < 8 * kChunks; task += kWarps) {
    const int r = task / kChunks, c = task % kChunks;
    float x[2] = {0.f, 0.f};
    if (r < p.group) {
      const T* q = static_cast<const T*>(p.q) +
                   (int64_t(item.seq) * p.num_q_heads + int64_t(h) * p.group + r) * kHeadDim + c * kPart;
      x[0] = ptx::to_float<T>(q[lane]);
      x[1] = ptx::to_float<T>(q[lane + 32]);
    }
    float lo = fminf(x[0], x[1]), hi = fmaxf(x[0], x[1]);
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
      lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
      hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
    }
    const float scale = __fdiv_rn(__fsub_rn(hi, lo), 255.f);
    int32_t sum = 0;
    uint8_t* bytes = reinterpret_cast<uint8_t*>(&q_words[r][c * 16]);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float ratio = scale > 0.f ? __fdiv_rn(__fsub_rn(x[k], lo), scale) : 0.f;
      const int32_t code = int32_t(rintf(ratio > 0.f ? fminf(ratio, 255.f) : 0.f));
      sum += code;
      bytes[kernels::mma_order(lane + 32 * k)] = uint8_t(code);
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) {
      q_min[r][c] = lo;
      q_scale[r][c] = scale;
      q_sum[r][c] = sum;
    }
  }
  __syncthreads();
  // The score of (token, row) over partition c, the four terms regrouped by K's min and scale:
  //   k_min (Π q_min + q_scale sum q') + k_scale (q_min sum k' + q_scale sum q' k').
  uint32_t q_b[kChunks][4];  // B registers of chunk c: words 4 t + u of row g
  float qm[kChunks][2], qs[kChunks][2], q_term[kChunks][2];  // rows 2t, 2t + 1
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
#pragma unroll
    for (int u = 0; u < 4; ++u) q_b[c][u] = q_words[g][c * 16 + t * 4 + u];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      qm[c][j] = q_min[2 * t + j][c];
      qs[c][j] = q_scale[2 * t + j][c];
      q_term[c][j] = float(kPart) * qm[c][j] + qs[c][j] * float(q_sum[2 * t + j][c]);
    }
  }

  float o_acc[kDimTiles][4] = {};  // O^T: dims 16 m + g (+ 8), rows 2t, 2t + 1
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};

  // The warp's partitions are warp, warp + 4, ...; its i-th goes to stage i % kStages.
  uint8_t* my_stages = stages + warp * S::kStages * S::kBytes;
  auto issue = [&](int i) {
    const int part = warp + i * kWarps;
    if (part < num_parts) {
      const int64_t block = blocks[part];
      const uint32_t dst = ptx::smem_address(my_stages + (i % S::kStages) * S::kBytes);
      auto copy = [&](int offset, const void* src, int bytes) {
        for (int c = lane; c < bytes / 16; c += 32)
          ptx::cp_async_16(dst + offset + 16 * c, static_cast<const uint8_t*>(src) + 16 * c, 16);
      };
      const int64_t k_meta = block * pool.k_meta_block + h * pool.k_meta_head;
      const int64_t v_meta = block * pool.v_meta_block + h * pool.v_meta_head;
      copy(S::kKCodes, pool.k_codes + block * pool.k_codes_block + h * pool.k_codes_head, S::kVCodes - S::kKCodes);
      copy(S::kVCodes, pool.v_codes + block * pool.v_codes_block + h * pool.v_codes_head, S::kKMin - S::kVCodes);
      copy(S::kKMin, pool.k_min + k_meta, S::kKScale - S::kKMin);
      copy(S::kKScale, pool.k_scale + k_meta, S::kKSums - S::kKScale);
      copy(S::kKSums, pool.k_sums + k_meta, S::kVMin - S::kKSums);
      copy(S::kVMin, pool.v_min + v_meta, S::kVScale - S::kVMin);
      copy(S::kVScale, pool.v_scale + v_meta, S::kVSums - S::kVScale);
      copy(S::kVSums, pool.v_sums + v_meta, S::kBytes - S::kVSums);
    }
    ptx::cp_async_commit();  // one group per partition, empty past the end
  };
#pragma unroll 1
  for (int i = 0; i < S::kStages - 1; ++i) issue(i);

#pragma unroll 1
  for (int i = 0, part = warp; part < num_parts; ++i, part += kWarps) {
    ptx::cp_async_wait<S::kStages - 2>();
    __syncwarp();  // the partition landed for every lane; the stage issued next was read before
    issue(i + S::kStages - 1);
    const uint8_t* stage = my_stages + (i % S::kStages) * S::kBytes;
    const int64_t block = blocks[part];
    const int valid = min(kPart, num_tokens - part * kPart);
    const bool sealed = valid == kPart;  // only a sequence's last partition can be open
    const uint8_t* k_base = stage + S::kKCodes;
    const uint8_t* v_base = stage + S::kVCodes;
    const __half* k_min_s = reinterpret_cast<const __half*>(stage + S::kKMin);
    const __half* k_scale_s = reinterpret_cast<const __half*>(stage + S::kKScale);
    const uint8_t* k_sums_s = stage + S::kKSums;
    const __half* v_min_s = reinterpret_cast<const __half*>(stage + S::kVMin);
    const __half* v_scale_s = reinterpret_cast<const __half*>(stage + S::kVScale);
    const uint8_t* v_sums_s = stage + S::kVSums;
    uint32_t k_lo[4][kChunks], k_hi[4][kChunks];  // tokens 16 tt + g (+ 8), bytes 16 c + 4 t
#pragma unroll
    for (int tt = 0; tt < 4; ++tt)
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        k_lo[tt][c] = *reinterpret_cast<const uint32_t*>(k_base + (16 * tt + g) * (kHeadDim / 4) + 16 * c + 4 * t);
        k_hi[tt][c] = *reinterpret_cast<const uint32_t*>(k_base + (16 * tt + g + 8) * (kHeadDim / 4) + 16 * c + 4 * t);
      }
    uint32_t v_lo[kDimTiles], v_hi[kDimTiles];  // channels 16 m + g (+ 8), tokens 16 t ...
    if (sealed) {
#pragma unroll
      for (int m = 0; m < kDimTiles; ++m) {
        v_lo[m] = *reinterpret_cast<const uint32_t*>(v_base + (16 * m + g) * (kPart / 4) + 4 * t);
        v_hi[m] = *reinterpret_cast<const uint32_t*>(v_base + (16 * m + g + 8) * (kPart / 4) + 4 * t);
      }
    }

    // Scores of the partition's 64 tokens: s[tt][e] is token 16 tt + g + 8 (e / 2), row 2t + e % 2.
    float s[4][4];
#pragma unroll
    for (int tt = 0; tt < 4; ++tt) {
      // Metadata of tokens 16 tt + g (+ 8), every partition: kChunks f16 / sums are adjacent.
      float k_min[2][kChunks], k_scale[2][kChunks], k_sum[2][kChunks];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int at = (16 * tt + g + 8 * half) * kChunks;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          k_min[half][c] = __half2float(k_min_s[at + c]);
          k_scale[half][c] = __half2float(k_scale_s[at + c]);
          k_sum[half][c] = float(k_sums_s[at + c]);
        }
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) s[tt][e] = 0.f;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        int32_t dot[4] = {0, 0, 0, 0};
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          const uint32_t a[4] = {kernels::widen_codes(k_lo[tt][c], 2 * m), kernels::widen_codes(k_hi[tt][c], 2 * m),
                                 kernels::widen_codes(k_lo[tt][c], 2 * m + 1),
                                 kernels::widen_codes(k_hi[tt][c], 2 * m + 1)};
          kernels::mma_u8_16x8x32(dot, a, q_b[c][2 * m], q_b[c][2 * m + 1]);
        }
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
          for (int j = 0; j < 2; ++j)
            s[tt][2 * half + j] += k_min[half][c] * q_term[c][j] +
                                   k_scale[half][c] * (qm[c][j] * k_sum[half][c] + qs[c][j] * float(dot[2 * half + j]));
      }
    }
    float part_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int tt = 0; tt < 4; ++tt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int token = 16 * tt + g + 8 * (e / 2);
        s[tt][e] = token < valid ? s[tt][e] * p.scale_log2 : -INFINITY;
        part_max[e % 2] = fmaxf(part_max[e % 2], s[tt][e]);
      }
    float p_lo[2], p_scale[2], p_sum[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int o = 4; o < 32; o *= 2) part_max[j] = fmaxf(part_max[j], __shfl_xor_sync(0xffffffffu, part_max[j], o));
      const float new_max = fmaxf(row_max[j], part_max[j]);  // finite: token 0 of the partition is valid
      const float correction = exp2f(row_max[j] - new_max);
      row_max[j] = new_max;
      float sum = 0.f, lo = INFINITY, hi = -INFINITY;
#pragma unroll
      for (int tt = 0; tt < 4; ++tt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float& x = s[tt][2 * half + j];
          x = exp2f(x - new_max);  // 0 past the valid tokens
          sum += x;
          lo = fminf(lo, x);
          hi = fmaxf(hi, x);
        }
      row_sum[j] = row_sum[j] * correction + sum;
#pragma unroll
      for (int m = 0; m < kDimTiles; ++m) {
        o_acc[m][j] *= correction;
        o_acc[m][j + 2] *= correction;
      }
#pragma unroll
      for (int o = 4; o < 32; o *= 2) {
        lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
        hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
      }
      p_lo[j] = lo;
      p_scale[j] = __fdiv_rn(__fsub_rn(hi, lo), 255.f);
    }

    if (sealed) {
      // P to uint8 per row over the partition, into shared memory in MMA order. A multiply by the
      // step's reciprocal, not the CPU's division: a code may differ by one where a numerator sits
      // on a rounding boundary, within the one step per token the tests allow for P.
      uint8_t* bytes = reinterpret_cast<uint8_t*>(p_words[warp]);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        int32_t sum = 0;
        const float inverse = p_scale[j] > 0.f ? 1.f / p_scale[j] : 0.f;
#pragma unroll
        for (int tt = 0; tt < 4; ++tt)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const float ratio = (s[tt][2 * half + j] - p_lo[j]) * inverse;
            const int32_t code = int32_t(rintf(ratio > 0.f ? fminf(ratio, 255.f) : 0.f));
            sum += code;
            bytes[(2 * t + j) * kPart + kernels::mma_order(16 * tt + g + 8 * half)] = uint8_t(code);
          }
#pragma unroll
        for (int o = 4; o < 32; o *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        p_sum[j] = float(sum);
      }
      __syncwarp();
      uint32_t p_b[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) p_b[u] = p_words[warp][g][t * 4 + u];
      float p_term[2];  // regrouped as for the scores: v_min (Π p_min + p_scale sum p') + ...
#pragma unroll
      for (int j = 0; j < 2; ++j) p_term[j] = float(kPart) * p_lo[j] + p_scale[j] * p_sum[j];
#pragma unroll
      for (int m = 0; m < kDimTiles; ++m) {
        int32_t dot[4] = {0, 0, 0, 0};
#pragma unroll
        for (int mm = 0; mm < 2; ++mm) {
          const uint32_t a[4] = {kernels::widen_codes(v_lo[m], 2 * mm), kernels::widen_codes(v_hi[m], 2 * mm),
                                 kernels::widen_codes(v_lo[m], 2 * mm + 1), kernels::widen_codes(v_hi[m], 2 * mm + 1)};
          kernels::mma_u8_16x8x32(dot, a, p_b[2 * mm], p_b[2 * mm + 1]);
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int at = 16 * m + g + 8 * half;
          const float v_min = __half2float(v_min_s[at]), v_scale = __half2float(v_scale_s[at]);
          const float v_sum = float(v_sums_s[at]);
#pragma unroll
          for (int j = 0; j < 2; ++j)
            o_acc[m][2 * half + j] +=
                v_min * p_term[j] + v_scale * (p_lo[j] * v_sum + p_scale[j] * float(dot[2 * half + j]));
        }
      }
      __syncwarp();
    } else {
      // The open partition: fp32 P times the f16 tail.
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int tt = 0; tt < 4; ++tt)
#pragma unroll
          for (int half = 0; half < 2; ++half) p_open[warp][2 * t + j][16 * tt + g + 8 * half] = s[tt][2 * half + j];
      __syncwarp();
      const __half* tail = pool.tail + int64_t(pool.tail_slot[block]) * pool.tail_slot_stride + h * pool.tail_head;
#pragma unroll
      for (int m = 0; m < kDimTiles; ++m)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int d = 16 * m + g + 8 * (e / 2);
          const float* w = p_open[warp][2 * t + e % 2];
          float acc = 0.f;
          for (int i = 0; i < valid; ++i) acc += w[i] * __half2float(tail[i * kHeadDim + d]);
          o_acc[m][e] += acc;
        }
      __syncwarp();
    }
  }

  // Epilogue: each warp's state per row, then ⊕ over the warps (as decode_tiled_kernel), o in
  // the stages' memory once every copy has landed.
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    row_sum[j] += __shfl_xor_sync(0xffffffffu, row_sum[j], 4);
    row_sum[j] += __shfl_xor_sync(0xffffffffu, row_sum[j], 8);
    row_sum[j] += __shfl_xor_sync(0xffffffffu, row_sum[j], 16);
  }
  ptx::cp_async_wait<0>();
  __syncthreads();
  auto red_o = reinterpret_cast<float(*)[8][kHeadDim]>(stages);  // [warp][row][d]
#pragma unroll
  for (int m = 0; m < kDimTiles; ++m)
#pragma unroll
    for (int e = 0; e < 4; ++e) red_o[warp][2 * t + e % 2][16 * m + g + 8 * (e / 2)] = o_acc[m][e];
  if (g == 0) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      red_max[warp][2 * t + j] = row_max[j];
      red_sum[warp][2 * t + j] = row_sum[j];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < p.group * kHeadDim; idx += kWarps * 32) {
    const int r = idx / kHeadDim, d = idx % kHeadDim;
    float max = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) max = fmaxf(max, red_max[w][r]);
    float sum = 0.f, acc = 0.f;
    if (max != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float weight = exp2f(red_max[w][r] - max);
        sum += red_sum[w][r] * weight;
        acc += red_o[w][r][d] * weight;
      }
    }
    store_state_o<T, kHeadDim>(p, item, r, d, sum > 0.f ? acc / sum : 0.f);
    if (d == 0) store_state_lse(p, item, r, sum > 0.f ? max * float(M_LN2) + logf(sum) : -INFINITY);
  }
}

}  // namespace pagoda::cuda

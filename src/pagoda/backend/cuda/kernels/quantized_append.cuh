// RoPE (and the randomized Hadamard rotation) fused with the append to an fp8 or int2 KV cache
// (core/quantized_paged_kv.h), and the sealing of int2 V partitions: the kernels of
// quantized_kv.h, bit for bit cpu::QuantizedKvCache::write's codes.
//
// quantized_append_kernel: one warp per (row, head) of q, k and v heads. Lane l holds elements
// l + 32 k of the head (kHeadDim / 32 of them), so a rotate-half pair (i, i + kHeadDim / 2) is in
// one lane, the Hadamard butterflies of strides below 32 are lane shuffles (above: in-lane), and
// an int2 partition's min, max and code sum (Π a multiple of 32) are warp reductions.
//   q:  rotated (and Hadamard-rotated) to q_out in T.
//   k:  fp8: one scale per (token, head), amax / 448; int2: per partition of Π dims, min and
//       scale rounded to f16, stochastic rounding, packed 4 codes a byte.
//   v:  fp8 as k; int2: to the block's tail slot in f16 (its partition is quantized when full).
// seal_int2_kernel: one thread per (channel) of one (row, kv head) whose token completes a V
// partition: the partition's Π f16 values from the tail, quantized along the sequence.
//
// Bytes: q, k, v read once (T), q written once (T), k and v written quantized (+ v in f16 to the
// tail under int2, then read back once when its partition seals). FLOPs: a few per element, the
// generator's 64-bit multiplies per int2 code.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "pagoda/backend/cuda/kernels/kv_quantize.cuh"
#include "pagoda/backend/cuda/kernels/quantized_pool_args.h"
#include "pagoda/backend/cuda/kernels/ptx.cuh"

namespace pagoda::cuda::kernels {

struct QuantizedAppendArgs {
  const void* qkv;            // [n, (q_heads + 2 kv_heads) * head_dim]
  const int32_t* positions;   // [n]
  const int32_t* slot_block;  // [n], < 0: a padding row
  const float* inv_freq;      // [head_dim / 2]
  void* q_out;                // [n, q_heads, head_dim]
  QuantizedPoolArgs pool;
  int64_t n;
  int32_t q_heads;
  int32_t kv_heads;
  int32_t layer;
  uint64_t seed;
  bool hadamard;
};

constexpr int kAppendWarps = 8;

__device__ __forceinline__ void store_sum(uint8_t* sums, int64_t index, int32_t sum_bytes, int32_t sum) {
  if (sum_bytes == 1) {
    sums[index] = uint8_t(sum);
  } else {
    sums[2 * index] = uint8_t(sum & 0xff);  // little endian, as the CPU's memcpy of a uint16_t
    sums[2 * index + 1] = uint8_t(sum >> 8);
  }
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kAppendWarps * 32) quantized_append_kernel(const QuantizedAppendArgs a) {
  constexpr int kElements = kHeadDim / 32;
  constexpr int kHalf = kHeadDim / 2;
  const int lane = threadIdx.x % 32;
  const int64_t unit = int64_t(blockIdx.x) * kAppendWarps + threadIdx.x / 32;
  const int heads = a.q_heads + 2 * a.kv_heads;
  if (unit >= a.n * heads) return;
  const int64_t row = unit / heads;
  const int head = int(unit % heads);
  const bool is_q = head < a.q_heads, is_k = !is_q && head < a.q_heads + a.kv_heads;
  const int32_t block = a.slot_block[row];
  if (!is_q && block < 0) return;
  const int32_t position = a.positions[row];

  const T* src = static_cast<const T*>(a.qkv) + row * int64_t(heads) * kHeadDim + int64_t(head) * kHeadDim;
  float x[kElements];
#pragma unroll
  for (int k = 0; k < kElements; ++k) x[k] = ptx::to_float<T>(src[lane + 32 * k]);
  if (is_q || is_k) {
#pragma unroll
    for (int k = 0; k < kElements / 2; ++k) {
      float sin_angle, cos_angle;
      sincosf(float(position) * a.inv_freq[lane + 32 * k], &sin_angle, &cos_angle);
      const float lo = x[k], hi = x[k + kElements / 2];
      x[k] = lo * cos_angle - hi * sin_angle;
      x[k + kElements / 2] = hi * cos_angle + lo * sin_angle;
    }
    if (a.hadamard) {
#pragma unroll
      for (int k = 0; k < kElements; ++k)
        if (hadamard_flips(lane + 32 * k)) x[k] = -x[k];
#pragma unroll
      for (int h = 1; h < 32; h *= 2)
#pragma unroll
        for (int k = 0; k < kElements; ++k) {
          const float other = __shfl_xor_sync(0xffffffffu, x[k], h);
          x[k] = (lane & h) ? __fsub_rn(other, x[k]) : __fadd_rn(x[k], other);
        }
#pragma unroll
      for (int h = 1; h < kElements; h *= 2)
#pragma unroll
        for (int k = 0; k < kElements; ++k)
          if (!(k & h)) {
            const float lo = x[k], hi = x[k + h];
            x[k] = __fadd_rn(lo, hi);
            x[k + h] = __fsub_rn(lo, hi);
          }
      const float norm = __fdiv_rn(1.f, __fsqrt_rn(float(kHeadDim)));
#pragma unroll
      for (int k = 0; k < kElements; ++k) x[k] = __fmul_rn(x[k], norm);
    }
  }
  (void)kHalf;
  if (is_q) {
    T* dst = static_cast<T*>(a.q_out) + (row * a.q_heads + head) * kHeadDim;
#pragma unroll
    for (int k = 0; k < kElements; ++k) dst[lane + 32 * k] = ptx::from_float<T>(x[k]);
    return;
  }
  const QuantizedPoolArgs& p = a.pool;
  const int kv_head = head - a.q_heads - (is_k ? 0 : a.kv_heads);
  const int32_t slot = position % p.block_size;
  if (!p.int2) {  // fp8: one scale per (token, head)
    float amax = 0.f;
#pragma unroll
    for (int k = 0; k < kElements; ++k) amax = fmaxf(amax, fabsf(x[k]));
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    const float scale = __fdiv_rn(amax, 448.f);
    uint8_t* codes = (is_k ? p.k_codes : p.v_codes) + int64_t(block) * p.k_codes_block + kv_head * p.k_codes_head +
                     int64_t(slot) * kHeadDim;
#pragma unroll
    for (int k = 0; k < kElements; ++k) codes[lane + 32 * k] = scale > 0.f ? f32_to_e4m3(__fdiv_rn(x[k], scale)) : 0;
    if (lane == 0)
      (is_k ? p.k_fp8_scale : p.v_fp8_scale)[int64_t(block) * p.fp8_scale_block + kv_head * p.fp8_scale_head + slot] =
          scale;
    return;
  }
  if (!is_k) {  // int2 V: into the tail, in f16
    const int32_t tail_slot = p.tail_slot[block];
    if (tail_slot < 0) return;  // the host gave every partition being written a slot
    __half* dst = p.tail + int64_t(tail_slot) * p.tail_slot_stride + kv_head * p.tail_head +
                  int64_t(slot % p.partition) * kHeadDim;
#pragma unroll
    for (int k = 0; k < kElements; ++k) dst[lane + 32 * k] = __float2half_rn(x[k]);
    return;
  }
  // int2 K: partition of element k is 32 k / Π, the same for every lane.
  const uint64_t stream = kv_stream(a.seed, a.layer, 0, kv_head);
  const int k_parts = kHeadDim / p.partition;
  const int per_part = p.partition / 32;  // elements of a lane in one partition
  const int64_t meta = int64_t(block) * p.k_meta_block + kv_head * p.k_meta_head + int64_t(slot) * k_parts;
  uint8_t* packed = p.k_codes + int64_t(block) * p.k_codes_block + kv_head * p.k_codes_head + int64_t(slot) * (kHeadDim / 4);
  for (int part = 0; part < k_parts; ++part) {
    float lo = x[part * per_part], hi = lo;
    for (int k = part * per_part + 1; k < (part + 1) * per_part; ++k) {
      lo = fminf(lo, x[k]);
      hi = fmaxf(hi, x[k]);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, offset));
      hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, offset));
    }
    const __half min_h = __float2half_rn(lo), scale_h = __float2half_rn(__fdiv_rn(__fsub_rn(hi, lo), 3.f));
    const float min = __half2float(min_h), scale = __half2float(scale_h);
    int32_t sum = 0;
    for (int k = part * per_part; k < (part + 1) * per_part; ++k) {
      const int d = lane + 32 * k;
      const int32_t code = int2_code(x[k], min, scale, stochastic_uniform(stream, uint64_t(position) * kHeadDim + d));
      sum += code;
      uint32_t bits = uint32_t(code) << (2 * (d % 4));
      bits |= __shfl_xor_sync(0xffffffffu, bits, 1);
      bits |= __shfl_xor_sync(0xffffffffu, bits, 2);
      if (lane % 4 == 0) packed[d / 4] = uint8_t(bits);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) {
      p.k_min[meta + part] = min_h;
      p.k_scale[meta + part] = scale_h;
      store_sum(p.k_sums, meta + part, p.sum_bytes, sum);
    }
  }
}

// Grid (rows, kv heads), kHeadDim threads: the V partitions that rows' tokens complete.
template <int kHeadDim>
__global__ void __launch_bounds__(kHeadDim)
    seal_int2_kernel(const int32_t* __restrict__ positions, const int32_t* __restrict__ slot_block,
                     QuantizedPoolArgs p, int32_t layer, uint64_t seed) {
  const int64_t row = blockIdx.x;
  const int kv_head = blockIdx.y;
  const int32_t block = slot_block[row];
  const int32_t position = positions[row];
  if (block < 0 || position % p.partition != p.partition - 1) return;
  const int32_t tail_slot = p.tail_slot[block];
  if (tail_slot < 0) return;
  const int c = threadIdx.x;
  const int32_t slot = position % p.block_size;
  const int32_t index = slot / p.partition;  // the partition within its block
  const int32_t first_pos = position - (p.partition - 1);
  const __half* tail = p.tail + int64_t(tail_slot) * p.tail_slot_stride + kv_head * p.tail_head + c;
  float lo = __half2float(tail[0]), hi = lo;
  for (int i = 1; i < p.partition; ++i) {
    const float v = __half2float(tail[int64_t(i) * kHeadDim]);
    lo = fminf(lo, v);
    hi = fmaxf(hi, v);
  }
  const __half min_h = __float2half_rn(lo), scale_h = __float2half_rn(__fdiv_rn(__fsub_rn(hi, lo), 3.f));
  const float min = __half2float(min_h), scale = __half2float(scale_h);
  const uint64_t stream = kv_stream(seed, layer, 1, kv_head);
  uint8_t* packed = p.v_codes + int64_t(block) * p.v_codes_block + kv_head * p.v_codes_head +
                    int64_t(c) * (p.block_size / 4) + index * p.partition / 4;
  int32_t sum = 0;
  for (int i0 = 0; i0 < p.partition; i0 += 4) {
    uint32_t byte = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = i0 + j;
      const float v = __half2float(tail[int64_t(i) * kHeadDim]);
      const int32_t code =
          int2_code(v, min, scale, stochastic_uniform(stream, uint64_t(first_pos + i) * kHeadDim + uint64_t(c)));
      sum += code;
      byte |= uint32_t(code) << (2 * j);
    }
    packed[i0 / 4] = uint8_t(byte);
  }
  const int64_t meta = int64_t(block) * p.v_meta_block + kv_head * p.v_meta_head + int64_t(index) * kHeadDim + c;
  p.v_min[meta] = min_h;
  p.v_scale[meta] = scale_h;
  store_sum(p.v_sums, meta, p.sum_bytes, sum);
}

// table[updates[2 i]] = updates[2 i + 1]: the host's changes to the tail-slot table.
__global__ void scatter_tail_slots_kernel(const int32_t* __restrict__ updates, int32_t count, int32_t* table) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) table[updates[2 * i]] = updates[2 * i + 1];
}

}  // namespace pagoda::cuda::kernels

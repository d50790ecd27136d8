// dequantize_kv_kernel: blocks of an fp8 or int2 cache widened to T into an HND pool of the same
// block size, so that the f16 prefill kernel can read a prefix that was cached quantized. One
// CTA per (listed block, kv head); tokens at or past the block's valid count are written as 0.
// An int2 V partition holding fewer than Π valid tokens is still open: its values come from the
// block's tail slot. Bytes: the blocks' codes and metadata in, 2 x B x d x 2 out per (block, head).
#pragma once

#include <cstdint>

#include "pagoda/backend/cuda/kernels/kv_quantize.cuh"
#include "pagoda/backend/cuda/kernels/ptx.cuh"
#include "pagoda/backend/cuda/kernels/quantized_pool_args.h"

namespace pagoda::cuda::kernels {

struct DequantizeArgs {
  QuantizedPoolArgs pool;
  const int32_t* blocks;        // [count] blocks of the quantized pool
  const int32_t* valid_tokens;  // [count] tokens written in each
  void* k;                      // [count] HND pages of T
  void* v;
  int32_t head_dim;
};

template <typename T>
__global__ void __launch_bounds__(256) dequantize_kv_kernel(const DequantizeArgs a) {
  const QuantizedPoolArgs& p = a.pool;
  const int64_t out_block = blockIdx.x;
  const int h = blockIdx.y;
  const int64_t block = a.blocks[out_block];
  const int valid = a.valid_tokens[out_block];
  const int dim = a.head_dim;
  const int64_t head_elements = int64_t(p.block_size) * dim;
  T* k_out = static_cast<T*>(a.k) + (out_block * gridDim.y + h) * head_elements;
  T* v_out = static_cast<T*>(a.v) + (out_block * gridDim.y + h) * head_elements;
  for (int64_t i = threadIdx.x; i < head_elements; i += blockDim.x) {
    const int s = int(i / dim), d = int(i % dim);
    float k = 0.f, v = 0.f;
    if (s < valid) {
      if (!p.int2) {
        const int64_t code_at = block * p.k_codes_block + h * p.k_codes_head + i;
        const int64_t scale_at = block * p.fp8_scale_block + h * p.fp8_scale_head + s;
        k = p.k_fp8_scale[scale_at] * e4m3_to_f32(p.k_codes[code_at]);
        v = p.v_fp8_scale[scale_at] * e4m3_to_f32(p.v_codes[code_at]);
      } else {
        const int k_parts = dim / p.partition;
        const uint8_t k_byte = p.k_codes[block * p.k_codes_block + h * p.k_codes_head + int64_t(s) * (dim / 4) + d / 4];
        const int64_t k_meta = block * p.k_meta_block + h * p.k_meta_head + int64_t(s) * k_parts + d / p.partition;
        k = __half2float(p.k_min[k_meta]) + __half2float(p.k_scale[k_meta]) * float((k_byte >> (2 * (d % 4))) & 3);
        const int index = s / p.partition;
        if ((index + 1) * p.partition <= valid) {
          const uint8_t v_byte = p.v_codes[block * p.v_codes_block + h * p.v_codes_head + int64_t(d) * (p.block_size / 4) + s / 4];
          const int64_t v_meta = block * p.v_meta_block + h * p.v_meta_head + int64_t(index) * dim + d;
          v = __half2float(p.v_min[v_meta]) + __half2float(p.v_scale[v_meta]) * float((v_byte >> (2 * (s % 4))) & 3);
        } else {
          const int32_t slot = p.tail_slot[block];
          v = slot < 0 ? 0.f
                       : __half2float(p.tail[int64_t(slot) * p.tail_slot_stride + h * p.tail_head +
                                             int64_t(s % p.partition) * dim + d]);
        }
      }
    }
    k_out[i] = ptx::from_float<T>(k);
    v_out[i] = ptx::from_float<T>(v);
  }
}

}  // namespace pagoda::cuda::kernels

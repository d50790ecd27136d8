// One layer's fp8 or int2 pools (core/quantized_paged_kv.h) as the kernels address them: its
// arrays and strides (bytes for the code and sum arrays, elements for the others), filled on the
// host by quantized_pool_args (quantized_kv.h). Plain data, passed by value.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace pagoda::cuda::kernels {

struct QuantizedPoolArgs {
  uint8_t* k_codes;
  uint8_t* v_codes;
  __half* k_min;
  __half* k_scale;
  uint8_t* k_sums;
  __half* v_min;
  __half* v_scale;
  uint8_t* v_sums;
  const int32_t* tail_slot;  // [num_blocks]: the tail slot of a block's open V partition, -1: none
  __half* tail;
  float* k_fp8_scale;
  float* v_fp8_scale;
  int64_t k_codes_block, k_codes_head;
  int64_t k_meta_block, k_meta_head;
  int64_t v_codes_block, v_codes_head;
  int64_t v_meta_block, v_meta_head;
  int64_t fp8_scale_block, fp8_scale_head;
  int64_t tail_slot_stride, tail_head;
  int32_t block_size;
  int32_t partition;
  int32_t sum_bytes;
  bool int2;
};

}  // namespace pagoda::cuda::kernels

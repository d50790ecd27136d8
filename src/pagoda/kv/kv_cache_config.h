// KvCacheConfig: the shape of a backend's K and V pools for every layer, addressed by the block
// ids of a BlockPool of the same num_blocks. The CPU backend's pools are backend/cpu/kv_cache.h;
// the GPU backend's are device memory of the same layout.
#pragma once

#include <cstdint>

#include "pagoda/core/dtype.h"
#include "pagoda/core/paged_kv.h"
#include "pagoda/core/quantized_paged_kv.h"

namespace pagoda::kv {

struct KvCacheConfig {
  int32_t num_layers = 0;
  int32_t num_blocks = 0;
  int32_t block_size = 16;  // tokens per block
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  DType dtype = DType::kF32;  // f32, f16 or bf16
  KvLayout layout = KvLayout::kHnd;
  // kFp8 or kInt2: stored quantized (backend/cpu/quantized_kv_cache.h; KvCache refuses them),
  // int2 in partitions of `partition` elements, with stochastic rounding seeded by `seed`.
  KvQuant quant = KvQuant::kNone;
  int32_t partition = 64;
  uint64_t seed = 0;
  // Keys (and the queries that meet them) are rotated by a randomized Hadamard transform before
  // they are stored (backend/cpu/hadamard.h): scores are unchanged, outlier channels spread out.
  bool hadamard = false;
  bool stochastic_rounding = false;  // int2: stochastic (the paper's) or nearest rounding
  // int2: kInt2, or kFp8 to store keys in fp8 beside int2 values (2-bit keys cost this model's
  // accuracy most; docs/experiments/kv-quantization.md).
  KvQuant key_quant = KvQuant::kInt2;
  // int2: a sequence's first tokens (attention sinks) also kept in f16, at most partition - 1.
  int32_t sink_tokens = 0;
};

}  // namespace pagoda::kv

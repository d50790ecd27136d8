// A layer's paged K or V pool as a tensor map, for the tensor memory accelerator's copies (sm_90):
// the 5-d tensor (64 elements, the tokens of a block, head_dim / 64 halves of a row, kv heads,
// blocks) of 2-byte elements, HND or NHD alike (the pool's strides). Its box, 16 tokens of one
// block and head, lands in shared memory as [head_dim / 64][16 tokens][128 bytes] with the
// 128-byte swizzle: 16-byte chunk c of a token's 128 bytes at c ^ (token % 8). Encoded on the
// host (cuTensorMapEncodeTiled) and passed to a kernel as a __grid_constant__ parameter.
//
// An encoding costs host time, and a pool does not move once the KV cache is allocated: its owner
// encodes a layer's two maps once (kv_tensor_maps), not at every launch.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "pagoda/core/paged_kv.h"

namespace pagoda::cuda {

inline constexpr int32_t kKvMapBoxTokens = 16;  // the smallest block size: a box never spans two blocks

// pool: kv.k or kv.v. Throws pagoda::Error where the driver cannot describe it.
CUtensorMap kv_tensor_map(const void* pool, const PagedKv& kv);

// One layer's K and V maps, with the pools they describe: a launch checks it reads those.
struct KvTensorMaps {
  CUtensorMap k;
  CUtensorMap v;
  PagedKv kv;
};
KvTensorMaps kv_tensor_maps(const PagedKv& kv);

}  // namespace pagoda::cuda

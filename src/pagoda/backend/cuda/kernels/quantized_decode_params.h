// What the quantized decode kernels read: the f16 kernels' DecodeParams (items, q, out, states;
// its pool field unused) and the layer's fp8 or int2 pools. Plain data, passed by value.
#pragma once

#include "pagoda/backend/cuda/kernels/decode_params.h"
#include "pagoda/backend/cuda/kernels/quantized_pool_args.h"

namespace pagoda::cuda {

constexpr int kQuantizedDecodeWarps = 4;
constexpr int kInt2Partition = 64;  // Π, and the block size, of the int2 decode kernel

struct QuantizedDecodeParams {
  DecodeParams base;
  kernels::QuantizedPoolArgs pool;
};

}  // namespace pagoda::cuda

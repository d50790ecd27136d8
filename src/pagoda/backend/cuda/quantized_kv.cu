#include "pagoda/backend/cuda/quantized_kv.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/kernels/decode_fp8.cuh"
#include "pagoda/backend/cuda/kernels/decode_int2.cuh"
#include "pagoda/backend/cuda/kernels/dequantize_kv.cuh"
#include "pagoda/backend/cuda/kernels/quantized_append.cuh"
#include "pagoda/backend/cuda/kernels/shared_memory.cuh"

namespace pagoda::cuda {
namespace {

// Calls fn.template operator()<T, kHeadDim>() for (dtype, head_dim), f16/bf16 x 64/128.
template <typename Fn>
void dispatch(DType dtype, int head_dim, const char* what, Fn&& fn) {
  auto by_dim = [&]<typename T>() {
    if (head_dim == 64) return fn.template operator()<T, 64>();
    if (head_dim == 128) return fn.template operator()<T, 128>();
    check_cuda(cudaErrorInvalidValue, what);
  };
  if (dtype == DType::kF16) {
    by_dim.template operator()<__half>();
  } else if (dtype == DType::kBF16) {
    by_dim.template operator()<__nv_bfloat16>();
  } else {
    check_cuda(cudaErrorInvalidValue, what);
  }
}

}  // namespace

void quantized_rope_append_kv(const void* qkv, int64_t n, const int32_t* positions, const int32_t* slot_block,
                              const float* inv_freq, int q_heads, int kv_heads, int head_dim,
                              const QuantizedPagedKv& kv, int32_t layer, uint64_t seed, bool hadamard, DType dtype,
                              void* q_out, cudaStream_t stream) {
  if (n == 0) return;
  if (kv.num_kv_heads != kv_heads || kv.head_dim != head_dim || q_heads <= 0)
    check_cuda(cudaErrorInvalidValue, "quantized_rope_append_kv (pool not matching heads/head_dim)");
  dispatch(dtype, head_dim, "quantized_rope_append_kv (dtype or head_dim)", [&]<typename T, int kHeadDim>() {
    const kernels::QuantizedAppendArgs args{.qkv = qkv,
                                            .positions = positions,
                                            .slot_block = slot_block,
                                            .inv_freq = inv_freq,
                                            .q_out = q_out,
                                            .pool = quantized_pool_args(kv),
                                            .n = n,
                                            .q_heads = q_heads,
                                            .kv_heads = kv_heads,
                                            .layer = layer,
                                            .seed = seed,
                                            .hadamard = hadamard};
    const int64_t warps = n * (q_heads + 2 * kv_heads);
    const auto blocks = unsigned((warps + kernels::kAppendWarps - 1) / kernels::kAppendWarps);
    kernels::quantized_append_kernel<T, kHeadDim><<<blocks, kernels::kAppendWarps * 32, 0, stream>>>(args);
    check_cuda(cudaGetLastError(), "quantized_append_kernel launch");
    if (kv.quant == KvQuant::kInt2) {
      kernels::seal_int2_kernel<kHeadDim><<<dim3(unsigned(n), unsigned(kv_heads)), kHeadDim, 0, stream>>>(
          positions, slot_block, args.pool, layer, seed);
      check_cuda(cudaGetLastError(), "seal_int2_kernel launch");
    }
  });
}

void scatter_tail_slots(const int32_t* updates, int32_t count, int32_t* table, cudaStream_t stream) {
  if (count == 0) return;
  kernels::scatter_tail_slots_kernel<<<unsigned((count + 255) / 256), 256, 0, stream>>>(updates, count, table);
  check_cuda(cudaGetLastError(), "scatter_tail_slots launch");
}

void launch_decode_quantized(KvQuant quant, DType dtype, int head_dim, const QuantizedDecodeParams& params,
                             int num_items, cudaStream_t stream) {
  dispatch(dtype, head_dim, "quantized decode dispatch", [&]<typename T, int kHeadDim>() {
    if (quant == KvQuant::kInt2) {
      constexpr int kSmem = DecodeInt2Stage<kHeadDim>::kSmemBytes;
      allow_dynamic_shared_memory<decode_int2_kernel<T, kHeadDim>, kSmem>("cudaFuncSetAttribute(decode_int2_kernel)");
      decode_int2_kernel<T, kHeadDim><<<num_items, kQuantizedDecodeWarps * 32, kSmem, stream>>>(params);
      check_cuda(cudaGetLastError(), "decode_int2_kernel launch");
    } else {
      using C = DecodeFp8Config<kHeadDim>;
      allow_dynamic_shared_memory<decode_fp8_kernel<T, kHeadDim>, C::kSmemBytes>("cudaFuncSetAttribute(decode_fp8_kernel)");
      decode_fp8_kernel<T, kHeadDim><<<num_items, C::kThreads, C::kSmemBytes, stream>>>(params);
      check_cuda(cudaGetLastError(), "decode_fp8_kernel launch");
    }
  });
}

int decode_quantized_ctas_per_sm(KvQuant quant, DType dtype, int head_dim) {
  int ctas = 0;
  dispatch(dtype, head_dim, "quantized decode occupancy", [&]<typename T, int kHeadDim>() {
    if (quant == KvQuant::kInt2) {
      constexpr int kSmem = DecodeInt2Stage<kHeadDim>::kSmemBytes;
      allow_dynamic_shared_memory<decode_int2_kernel<T, kHeadDim>, kSmem>("cudaFuncSetAttribute(decode_int2_kernel)");
      check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, decode_int2_kernel<T, kHeadDim>,
                                                               kQuantizedDecodeWarps * 32, kSmem),
                 "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    } else {
      using C = DecodeFp8Config<kHeadDim>;
      allow_dynamic_shared_memory<decode_fp8_kernel<T, kHeadDim>, C::kSmemBytes>("cudaFuncSetAttribute(decode_fp8_kernel)");
      check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, decode_fp8_kernel<T, kHeadDim>, C::kThreads,
                                                               C::kSmemBytes),
                 "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    }
  });
  return ctas;
}

void dequantize_kv_blocks(const QuantizedPagedKv& kv, const int32_t* blocks, const int32_t* valid_tokens,
                          int32_t count, const PagedKv& out, cudaStream_t stream) {
  if (count == 0) return;
  if (out.token_stride != kv.head_dim || out.head_stride != int64_t(kv.block_size) * kv.head_dim ||
      out.page_stride != out.head_stride * kv.num_kv_heads || out.block_size != kv.block_size || out.num_kv_heads != kv.num_kv_heads ||
      out.head_dim != kv.head_dim)
    check_cuda(cudaErrorInvalidValue, "dequantize_kv_blocks (the output pool's shape)");
  const kernels::DequantizeArgs args{.pool = quantized_pool_args(kv),
                                     .blocks = blocks,
                                     .valid_tokens = valid_tokens,
                                     .k = out.k,
                                     .v = out.v,
                                     .head_dim = kv.head_dim};
  const dim3 grid(unsigned(count), unsigned(kv.num_kv_heads));
  if (out.dtype == DType::kF16) {
    kernels::dequantize_kv_kernel<__half><<<grid, 256, 0, stream>>>(args);
  } else if (out.dtype == DType::kBF16) {
    kernels::dequantize_kv_kernel<__nv_bfloat16><<<grid, 256, 0, stream>>>(args);
  } else {
    check_cuda(cudaErrorInvalidValue, "dequantize_kv_blocks (dtype not f16 or bf16)");
  }
  check_cuda(cudaGetLastError(), "dequantize_kv_kernel launch");
}

}  // namespace pagoda::cuda

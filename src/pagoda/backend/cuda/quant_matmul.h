// Matmuls and lookups on GGUF block-quantized weights kept in their blocks in GPU memory (q4_0,
// q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k; kernels/quant_blocks.cuh has the layouts).
//
// - quant_gemv: out [n, m] = x [n, k] @ w [m, k]^T (+ bias) for few rows n. It streams each weight
//   once, through shared memory, and unpacks it in registers, fp32 accumulation, in one of two
//   kernels: on the tensor cores (f16 activations; a CTA owns 16 weight rows and every activation
//   row, up to 64), or SIMT (a warp per output row, fp32 FMAs, up to 16 rows; bf16 too). It moves
//   m x k weights in their blocks' bytes (dtype_bytes(w, m k)), plus n k activations (from L2
//   after the first warps) and n m outputs: at decode sizes the weight bytes are the whole cost,
//   so its bound is dtype_bytes / streaming bandwidth. 2 n m k FLOPs.
// - dequantize_rows: rows of w (all, or the ones `ids` names) to f16, bf16 or f32, bit-exact
//   with format/dequantize.cpp before the final rounding. It serves embed() on a quantized table
//   and larger batches, which dequantize the whole matrix into a scratch buffer and run cuBLASLt
//   on it (the scratch's write and read are that path's extra bytes: 2 x 2 m k).
//
// Contracts as layer_ops.h: device pointers, row-major contiguous, k a multiple of the type's
// block elements, w, x and out 16-byte aligned; only enqueues work on `stream` (no allocation,
// no synchronization), so a CUDA graph can capture it. Anything else is rejected with
// check_cuda(cudaErrorInvalidValue).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "pagoda/core/dtype.h"

namespace pagoda::cuda {

// Whether the kernels here take weights of type t.
constexpr bool quantized_matmul_type(DType t) {
  return t == DType::kQ4_0 || t == DType::kQ4_1 || t == DType::kQ5_0 || t == DType::kQ5_1 || t == DType::kQ8_0 ||
         t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K;
}

// Which kernel: kAuto is what the backend runs (measured on an H200, docs/experiments/
// gpu-quantized-matmul.md): SIMT for one row, where it is faster, and for bf16; the tensor cores
// for 2-16 rows of f16, where their time barely grows with the rows. Above kQuantGemvMaxRows the
// backend dequantizes the matrix for cuBLASLt, which was faster than either at 64 rows.
enum class QuantGemvKernel : uint8_t { kAuto, kTensorCores, kSimt };
constexpr int64_t kQuantGemvMaxRows = 16;              // kAuto and kSimt
constexpr int64_t kQuantGemvTensorCoreMaxRows = 64;   // kTensorCores (f16 only)

// x: [n, k] of act (f16 or bf16); w: [m, k] of w_type; bias: [m] of act, or null; out: [n, m] of
// out_type (act, or f32 for the logits). 1 <= n <= the kernel's rows (above).
void quant_gemv(const void* x, const void* w, DType w_type, const void* bias, void* out, int64_t n, int64_t m,
                int64_t k, DType act, DType out_type, cudaStream_t stream,
                QuantGemvKernel kernel = QuantGemvKernel::kAuto);

// out[i, :] = row ids[i] of w (row i when ids is null) for i < n, dequantized to out_type (f16,
// bf16 or f32). w: [rows, k] of w_type; ids: each in [0, rows) (the engine validates token ids).
void dequantize_rows(const void* w, DType w_type, int64_t rows, int64_t k, const int32_t* ids, int64_t n,
                     DType out_type, void* out, cudaStream_t stream);

}  // namespace pagoda::cuda

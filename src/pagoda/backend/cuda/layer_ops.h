// The per-token operations of a Llama-family layer on the GPU, around the GEMMs (gemm.h) and the
// attention kernels: embedding lookup, RMSNorm (plain, on selected rows, and fused with the
// residual add), residual add, SwiGLU, and RoPE fused with the KV-cache append.
//
// Common contract: activations and weights are f16 or bf16 (`dtype`), all math is fp32 with one
// rounding per stored value; every pointer is a device pointer; tensors are row-major contiguous.
// Each call only enqueues kernels on `stream`: no host synchronization and no allocation, so a
// step built from them can be captured in a CUDA graph.
//
// The kernels move 16-byte vectors (8 elements), so `hidden` and `width` must be multiples of 8
// and the tensors 16-byte aligned; every real model satisfies this, and anything else is
// rejected (check_cuda with cudaErrorInvalidValue) rather than served by a slow path.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "pagoda/core/dtype.h"
#include "pagoda/core/paged_kv.h"

namespace pagoda::cuda {

// out[i, :] = table[ids[i], :].
// table: [vocab, hidden]; ids: int32 [n], each in [0, vocab) (the engine validates token ids);
// out: [n, hidden].
void embed(const void* table, const int32_t* ids, int64_t n, int64_t hidden, DType dtype, void* out,
           cudaStream_t stream);

// out[j, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight, with r = rows ? rows[j] : j.
// x: [*, hidden]; rows: int32 [n] or null (the rows that sample, for the logits); weight: [hidden];
// out: [n, hidden].
void rms_norm(const void* x, const int32_t* rows, const void* weight, float eps, int64_t n, int64_t hidden,
              DType dtype, void* out, cudaStream_t stream);

// Fused residual add + RMSNorm: residual += delta, stored back rounded to dtype; then
// out = rms_norm(residual) * weight computed from that rounded residual, so the result is exactly
// what add() followed by rms_norm() produce. residual, delta, out: [n, hidden]; out may alias
// delta (not residual).
void add_rms_norm(void* residual, const void* delta, const void* weight, float eps, int64_t n, int64_t hidden,
                  DType dtype, void* out, cudaStream_t stream);

// x += y. x, y: [n, hidden].
void add(void* x, const void* y, int64_t n, int64_t hidden, DType dtype, cudaStream_t stream);

// SwiGLU: out[r, j] = silu(gate_up[r, j]) * gate_up[r, width + j].
// gate_up: [n, 2 * width] (the fused gate/up GEMM's output); out: [n, width].
void silu_mul(const void* gate_up, int64_t n, int64_t width, DType dtype, void* out, cudaStream_t stream);

// RoPE fused with the KV-cache append.
// qkv: [n, (q_heads + 2 * kv_heads) * head_dim], each row q heads, then k heads, then v heads
// (the fused QKV GEMM's output); not modified.
// Rotary embedding with Hugging Face Llama's rotate-half pairing (i, i + head_dim / 2): for pair i
// the angle is float(positions[r]) * inv_freq[i] (inv_freq: fp32 [head_dim / 2], any scaling
// already applied), and x'_i = x_i cos - x_{i+h} sin, x'_{i+h} = x_{i+h} cos + x_i sin, in fp32
// with full-precision sincosf (positions reach 128K radians).
//   - q_out: [n, q_heads, head_dim], the rotated q of every row;
//   - the rotated k and raw v of row r go to the paged pool `kv` (HND or NHD; kv.dtype == dtype,
//     kv.num_kv_heads == kv_heads, kv.head_dim == head_dim) at block slot_block[r], slot
//     positions[r] % kv.block_size. Rows with slot_block[r] < 0 (the padding rows of a
//     CUDA-graph batch) store nothing into the pool.
// head_dim must be a multiple of 16 (64 and 128 in practice).
void rope_append_kv(const void* qkv, int64_t n, const int32_t* positions, const int32_t* slot_block,
                    const float* inv_freq, int q_heads, int kv_heads, int head_dim, const PagedKv& kv,
                    DType dtype, void* q_out, cudaStream_t stream);

}  // namespace pagoda::cuda

// The CUDA backend's fp8 and int2 KV cache (core/quantized_paged_kv.h): the append that quantizes
// as RoPE writes K and V, paged decode attention on the codes, and the widening of cached blocks
// for prefill. The codes are bit for bit cpu::QuantizedKvCache's (same rounding, same seeded
// generator), and attention follows cpu::attend_quantized_group's arithmetic.
//
// The pools differ from the CPU's in one thing: the GPU keeps no `sealed` array. A sequence's
// V partition is sealed exactly when all its Π tokens have been written, which the kernels read
// off the sequence's length (a block is written by one sequence at a time: shared blocks are full
// and a partial one is copied before it is written). The tail slot of each block with an open
// partition is in `tail_slot` on the device, kept by the backend on the host and copied over in
// begin_step (scatter_tail_slots).
//
// Every call only enqueues kernels on `stream` (graph-capturable). dtype: T of q, qkv and out,
// f16 or bf16. head_dim 64 or 128; int2 with Π = 64 and a block size of 64.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "pagoda/attention/decode_batch.h"
#include "pagoda/backend/cuda/decode_attention.h"
#include "pagoda/backend/cuda/kernels/quantized_decode_params.h"
#include "pagoda/core/dtype.h"
#include "pagoda/core/paged_kv.h"
#include "pagoda/core/quantized_paged_kv.h"

namespace pagoda::cuda {

// Null when the quantized kernels run this shape and pool format, else why not.
const char* quantized_kv_unsupported_reason(const attention::AttentionShape& shape, KvQuant quant, int32_t partition,
                                            DType dtype);

kernels::QuantizedPoolArgs quantized_pool_args(const QuantizedPagedKv& kv);

// As rope_append_kv (layer_ops.h), the K and V rows quantized into kv instead: q rotated (then,
// when hadamard, Hadamard-rotated like k) to q_out; k rotated and quantized; v quantized (fp8) or
// put in its block's tail (int2), and the int2 V partitions these rows complete quantized.
// layer and seed pick the stochastic-rounding streams (cpu::kv_stream).
void quantized_rope_append_kv(const void* qkv, int64_t n, const int32_t* positions, const int32_t* slot_block,
                              const float* inv_freq, int q_heads, int kv_heads, int head_dim,
                              const QuantizedPagedKv& kv, int32_t layer, uint64_t seed, bool hadamard, DType dtype,
                              void* q_out, cudaStream_t stream);

// table[updates[2 i]] = updates[2 i + 1] for i < count (device arrays).
void scatter_tail_slots(const int32_t* updates, int32_t count, int32_t* table, cudaStream_t stream);

// Decode attention over kv by the uploaded plan (split KV merged as decode_attention does).
// q, out: [num_seqs, num_q_heads, head_dim] of dtype; lse may be null.
void decode_attention_quantized(DecodeWorkspace& workspace, const attention::AttentionShape& shape,
                                const QuantizedPagedKv& kv, DType dtype, const void* q, void* out, float* lse,
                                cudaStream_t stream);

// The kernel of decode_attention_quantized alone, over num_items work items of params.
void launch_decode_quantized(KvQuant quant, DType dtype, int head_dim, const QuantizedDecodeParams& params,
                             int num_items, cudaStream_t stream);

// Resident CTAs per multiprocessor of the quantized decode kernel of (quant, dtype, head_dim).
int decode_quantized_ctas_per_sm(KvQuant quant, DType dtype, int head_dim);
// The workers plan_decode should fill: multiprocessors x those CTAs.
attention::DeviceInfo decode_quantized_device_info(KvQuant quant, DType dtype, int head_dim);

// Blocks blocks[i] of kv (valid_tokens[i] tokens written) widened into pages i of out, an HND
// pool of dtype with kv's block size, kv heads and head_dim (device arrays of count entries).
void dequantize_kv_blocks(const QuantizedPagedKv& kv, const int32_t* blocks, const int32_t* valid_tokens,
                          int32_t count, const PagedKv& out, cudaStream_t stream);

}  // namespace pagoda::cuda

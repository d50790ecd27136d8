// Attention of the CPU backend over an int2 or fp8 KV cache (core/quantized_paged_kv.h): the
// reference the GPU kernels are tested against.
//
// int2 computes on the codes, as "HACK: Homomorphic Acceleration via Compression of the Key-Value
// Cache for Disaggregated LLM Inference" (arXiv:2502.03589) does: with a ~ m_a + s_a a' and
// b ~ m_b + s_b b' over a partition of Π elements,
//   sum a b ~ Π m_a m_b + m_a s_b sum b' + m_b s_a sum a' + s_a s_b sum a' b',
// where sum a' b' is an integer dot product and sum b' (K's and V's) is stored with the codes
// (summation elimination). Q is quantized to uint8 per partition of head_dim for Q K^T; the
// softmax numerators P to uint8 per partition of the sequence for P V. Tokens of a V partition
// that has not sealed yet are read from the f16 tail and weighted in fp32.
// fp8 dequantizes each element (scale * e4m3) and attends in fp32.
#pragma once

#include <cstdint>
#include <span>

#include "pagoda/attention/decode_batch.h"
#include "pagoda/core/quantized_paged_kv.h"

namespace pagoda::cpu {

// Raw scores q . k (no softmax scale) of `rows` query rows q [rows, head_dim] against tokens
// [0, length) of one kv head of a sequence whose blocks are `blocks`: scores [rows, length].
void quantized_scores(const QuantizedPagedKv& kv, int32_t kv_head, std::span<const int32_t> blocks,
                      int32_t length, const float* q, int32_t rows, float* scores);

// out [rows, head_dim] = p [rows, length] times V of tokens [0, length) of one kv head.
void quantized_weighted_values(const QuantizedPagedKv& kv, int32_t kv_head, std::span<const int32_t> blocks,
                               int32_t length, const float* p, int32_t rows, float* out);

// Softmax attention of a GQA group of `rows` query rows over tokens [0, length): out [rows,
// head_dim]; lse [rows] natural log of the softmax denominator (scores scaled by softmax_scale).
// length 0 gives out = 0 and lse = -inf.
void attend_quantized_group(const QuantizedPagedKv& kv, int32_t kv_head, std::span<const int32_t> blocks,
                            int32_t length, const float* q, int32_t rows, float softmax_scale, float* out,
                            float* lse);

// One query token per sequence of `batch` (q, out [num_seqs, num_q_heads, head_dim]), every
// (sequence, kv head) in parallel; lse [num_seqs, num_q_heads] may be null.
void decode_attention_quantized(const attention::DecodeBatch& batch, const attention::AttentionShape& shape,
                                const QuantizedPagedKv& kv, const float* q, float* out, float* lse = nullptr);

// Causal attention of num_new tokens at positions start_pos... whose K and V are in the pool,
// as attention::prefill_attention_cpu: token i attends to [0, start_pos + i].
void prefill_attention_quantized(const attention::AttentionShape& shape, const QuantizedPagedKv& kv,
                                 std::span<const int32_t> block_ids, int32_t start_pos, int32_t num_new,
                                 const float* q, float* out, float* lse = nullptr);

}  // namespace pagoda::cpu

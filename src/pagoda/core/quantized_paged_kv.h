// QuantizedPagedKv: one layer's paged K and V pools stored as int2 (asymmetric 2-bit, per
// partition of Π elements, as in "HACK: Homomorphic Acceleration via Compression of the
// Key-Value Cache for Disaggregated LLM Inference", arXiv:2502.03589) or fp8 e4m3 (one scale
// per token and kv head). It sits beside PagedKv (paged_kv.h): the same blocks and block ids,
// the HND order ([block][kv head][...]), every array addressed by its own strides.
//
// int2, with D = head_dim, B = block_size (a multiple of Π), S = sum_bytes():
//   K, partitioned along head_dim (a token's key is complete when written):
//     k_codes  [block][head][token][D / 4]   4 codes a byte, element d in bits 2 (d % 4)
//     k_min, k_scale [block][head][token][D / Π]  f16: k ~ min + scale * code
//     k_sums   [block][head][token][D / Π]   S bytes: the partition's sum of codes
//   V, partitioned along the sequence (per channel, Π tokens):
//     v_codes  [block][head][channel][B / 4] 4 codes a byte, token t in bits 2 (t % 4)
//     v_min, v_scale, v_sums [block][head][B / Π][D]
//   A V partition that does not hold Π tokens yet lives in a tail slot, unquantized (f16):
//     sealed[block]    V partitions of the block already quantized (the others are not valid)
//     tail_slot[block] the slot of the partition being filled, or -1
//     tail     [slot][head][Π][D] f16
//   The first `sink_tokens` tokens of a sequence (attention sinks) are also kept in f16, in a sink
//   slot of the sequence's first block, and attention reads them from there:
//     sink_slot[block] the slot of a block that holds a sequence's first tokens, or -1
//     sink_k, sink_v [slot][head][sink_tokens][D] f16
//   key_quant kFp8 keeps V as above but stores K as an fp8 pool does (below).
// fp8 (e4m3, saturating at ±448): k_codes, v_codes [block][head][token][D] one byte each, and
//   k_fp8_scale, v_fp8_scale [block][head][token] f32: x ~ scale * e4m3(code).
#pragma once

#include <cstdint>

#include "pagoda/core/half.h"

namespace pagoda {

enum class KvQuant : uint8_t { kNone, kFp8, kInt2 };

inline const char* kv_quant_name(KvQuant q) {
  return q == KvQuant::kInt2 ? "int2" : q == KvQuant::kFp8 ? "fp8" : "none";
}

// Bytes of a partition's stored code sum: at most 3 Π, so one byte up to Π = 64, two above.
inline int32_t int2_sum_bytes(int32_t partition) { return partition <= 64 ? 1 : 2; }

// Bytes one block of one kv head takes in one layer, K and V, data and metadata (an int2 pool's
// tail and sink slots excluded). element_bytes: of the unquantized pool (kNone). key_quant: of an
// int2 pool's keys (kInt2 or kFp8).
inline int64_t kv_block_head_bytes(KvQuant quant, int32_t element_bytes, int32_t head_dim, int32_t partition,
                                   int32_t block_size, KvQuant key_quant = KvQuant::kInt2) {
  const int64_t d = head_dim, b = block_size;
  switch (quant) {
    case KvQuant::kNone: return 2 * b * d * element_bytes;
    case KvQuant::kFp8: return 2 * b * (d + 4);
    case KvQuant::kInt2: {
      const int64_t meta = 4 + int2_sum_bytes(partition);  // f16 min, f16 scale, sum
      const int64_t k = key_quant == KvQuant::kFp8 ? b * (d + 4) : b * (d / 4 + (d / partition) * meta);
      const int64_t v = b * d / 4 + (b / partition) * d * meta;
      return k + v;
    }
  }
  return 0;
}

struct QuantizedPagedKv {
  KvQuant quant = KvQuant::kInt2;
  int32_t num_blocks = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t partition = 64;  // Π (int2)
  KvQuant key_quant = KvQuant::kInt2;  // int2: kInt2, or kFp8 for fp8 keys beside int2 values
  int32_t sink_tokens = 0;             // int2: a sequence's first tokens also kept in f16

  uint8_t* k_codes = nullptr;
  uint8_t* v_codes = nullptr;
  // int2
  f16* k_min = nullptr;
  f16* k_scale = nullptr;
  uint8_t* k_sums = nullptr;
  f16* v_min = nullptr;
  f16* v_scale = nullptr;
  uint8_t* v_sums = nullptr;
  int32_t* sealed = nullptr;
  int32_t* tail_slot = nullptr;
  f16* tail = nullptr;
  int32_t* sink_slot = nullptr;
  f16* sink_k = nullptr;
  f16* sink_v = nullptr;
  // fp8
  float* k_fp8_scale = nullptr;
  float* v_fp8_scale = nullptr;

  int32_t k_parts() const { return head_dim / partition; }   // K partitions per token
  int32_t v_parts() const { return block_size / partition; }  // V partitions per block
  int32_t sum_bytes() const { return int2_sum_bytes(partition); }
  int32_t code_bytes_per_row() const { return quant == KvQuant::kInt2 ? head_dim / 4 : head_dim; }
  bool fp8_keys() const { return quant == KvQuant::kFp8 || key_quant == KvQuant::kFp8; }
  int32_t k_code_bytes_per_row() const { return fp8_keys() ? head_dim : head_dim / 4; }

  // Strides, in elements of each array, of one block and of one head within it.
  int64_t k_codes_head() const { return int64_t(block_size) * k_code_bytes_per_row(); }
  int64_t k_codes_block() const { return num_kv_heads * k_codes_head(); }
  int64_t k_meta_head() const { return int64_t(block_size) * k_parts(); }  // k_min, k_scale, k_sums (x S)
  int64_t k_meta_block() const { return num_kv_heads * k_meta_head(); }
  int64_t v_codes_head() const {  // int2: channel-major; fp8: as K
    return quant == KvQuant::kInt2 ? int64_t(head_dim) * (block_size / 4) : k_codes_head();
  }
  int64_t v_codes_block() const { return num_kv_heads * v_codes_head(); }
  int64_t v_meta_head() const { return int64_t(v_parts()) * head_dim; }  // v_min, v_scale, v_sums (x S)
  int64_t v_meta_block() const { return num_kv_heads * v_meta_head(); }
  int64_t fp8_scale_head() const { return block_size; }
  int64_t fp8_scale_block() const { return int64_t(num_kv_heads) * block_size; }
  int64_t tail_head() const { return int64_t(partition) * head_dim; }
  int64_t tail_slot_stride() const { return num_kv_heads * tail_head(); }
  int64_t sink_head() const { return int64_t(sink_tokens) * head_dim; }
  int64_t sink_slot_stride() const { return num_kv_heads * sink_head(); }
};

}  // namespace pagoda

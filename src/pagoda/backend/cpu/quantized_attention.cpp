#include "pagoda/backend/cpu/quantized_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "pagoda/backend/cpu/kv_quantize.h"
#include "pagoda/core/error.h"

namespace pagoda::cpu {
namespace {

int32_t load_sum(const uint8_t* sums, int64_t index, int32_t sum_bytes) {
  if (sum_bytes == 1) return sums[index];
  uint16_t value = 0;
  std::memcpy(&value, sums + index * 2, 2);
  return value;
}

float to_f32(f16 x) { return f16_to_f32(x.bits); }

// The f16 copy of sink token t (< sink_tokens) of one kv head: K or V.
const f16* sink_row(const QuantizedPagedKv& kv, const f16* sinks, int32_t head, std::span<const int32_t> blocks,
                    int32_t t) {
  const int32_t slot = kv.sink_slot[blocks[0]];
  if (slot < 0) fail(ErrorKind::kInternal, "int2 KV: block {} holds no sink tokens", blocks[0]);
  return sinks + int64_t(slot) * kv.sink_slot_stride() + head * kv.sink_head() + int64_t(t) * kv.head_dim;
}

int32_t sinks_in(const QuantizedPagedKv& kv, int32_t length) {
  return kv.quant == KvQuant::kInt2 ? std::min(kv.sink_tokens, length) : 0;
}

void check_blocks(const QuantizedPagedKv& kv, std::span<const int32_t> blocks, int32_t length) {
  if (length < 0 || int64_t(blocks.size()) * kv.block_size < length)
    fail(ErrorKind::kInvalidArgument, "quantized attention: {} tokens in {} blocks of {}", length, blocks.size(),
         kv.block_size);
  const size_t used = size_t((int64_t(length) + kv.block_size - 1) / kv.block_size);
  for (size_t b = 0; b < used; ++b)
    if (blocks[b] < 0 || blocks[b] >= kv.num_blocks)
      fail(ErrorKind::kInvalidArgument, "block id {} outside the pool's {} blocks", blocks[b], kv.num_blocks);
}

void int2_scores(const QuantizedPagedKv& kv, int32_t head, std::span<const int32_t> blocks, int32_t length,
                 const float* q, int32_t rows, float* scores) {
  const int32_t dim = kv.head_dim, part = kv.partition, parts = kv.k_parts();
  std::vector<uint8_t> q_codes(size_t(rows) * size_t(dim)), k_codes(static_cast<size_t>(dim));
  std::vector<Uint8Params> q_params(size_t(rows) * size_t(parts));
  std::vector<int32_t> q_sums(size_t(rows) * size_t(parts));
  for (int32_t r = 0; r < rows; ++r)
    for (int32_t p = 0; p < parts; ++p) {
      const size_t at = size_t(r) * size_t(parts) + size_t(p);
      q_sums[at] = quantize_uint8(q + int64_t(r) * dim + p * part, part,
                                  q_codes.data() + int64_t(r) * dim + p * part, q_params[at]);
    }
  for (int32_t t = 0; t < length; ++t) {
    const int64_t block = blocks[size_t(t / kv.block_size)], slot = t % kv.block_size;
    const uint8_t* packed = kv.k_codes + block * kv.k_codes_block() + head * kv.k_codes_head() + slot * (dim / 4);
    for (int32_t d = 0; d < dim; ++d) k_codes[size_t(d)] = int2_code(packed, d);
    const int64_t meta = block * kv.k_meta_block() + head * kv.k_meta_head() + slot * parts;
    for (int32_t r = 0; r < rows; ++r) {
      const uint8_t* qc = q_codes.data() + int64_t(r) * dim;
      float score = 0.f;
      for (int32_t p = 0; p < parts; ++p) {
        int32_t dot = 0;  // the integer part: at most 255 x 3 x 128
        for (int32_t d = p * part; d < (p + 1) * part; ++d) dot += int32_t(qc[d]) * int32_t(k_codes[size_t(d)]);
        const Uint8Params& qp = q_params[size_t(r) * size_t(parts) + size_t(p)];
        const float k_min = to_f32(kv.k_min[meta + p]), k_scale = to_f32(kv.k_scale[meta + p]);
        const auto k_sum = float(load_sum(kv.k_sums, meta + p, kv.sum_bytes()));
        const auto q_sum = float(q_sums[size_t(r) * size_t(parts) + size_t(p)]);
        score += float(part) * qp.min * k_min + qp.min * k_scale * k_sum + k_min * qp.scale * q_sum +
                 qp.scale * k_scale * float(dot);
      }
      scores[int64_t(r) * length + t] = score;
    }
  }
}

void int2_weighted_values(const QuantizedPagedKv& kv, int32_t head, std::span<const int32_t> blocks, int32_t length,
                          const float* p, int32_t rows, float* out) {
  const int32_t dim = kv.head_dim, part = kv.partition;
  std::fill(out, out + int64_t(rows) * dim, 0.f);
  std::vector<float> p_part(static_cast<size_t>(part));
  std::vector<uint8_t> p_codes(size_t(rows) * size_t(part)), v_codes(static_cast<size_t>(part));
  std::vector<Uint8Params> p_params(static_cast<size_t>(rows));
  std::vector<int32_t> p_sums(static_cast<size_t>(rows));
  for (int32_t t0 = 0; t0 < length; t0 += part) {
    const int64_t block = blocks[size_t(t0 / kv.block_size)];
    const int32_t index = (t0 % kv.block_size) / part;  // the partition within its block
    const int32_t valid = std::min(part, length - t0);
    if (index >= kv.sealed[block]) {  // still in the tail: fp32 weights on f16 values
      const int32_t slot = kv.tail_slot[block];
      if (slot < 0) fail(ErrorKind::kInternal, "int2 KV: block {} has neither a sealed partition {} nor a tail", block, index);
      const f16* tail = kv.tail + int64_t(slot) * kv.tail_slot_stride() + head * kv.tail_head();
      for (int32_t i = 0; i < valid; ++i)
        for (int32_t r = 0; r < rows; ++r) {
          const float w = p[int64_t(r) * length + t0 + i];
          float* o = out + int64_t(r) * dim;
          for (int32_t c = 0; c < dim; ++c) o[c] += w * to_f32(tail[int64_t(i) * dim + c]);
        }
      continue;
    }
    // Tokens past `length` weigh 0: they make the partition's min 0 and their codes 0, exactly.
    // So do the sinks, which are weighted below in fp32 on their f16 copies.
    const int32_t sinks = t0 == 0 ? sinks_in(kv, length) : 0;
    for (int32_t r = 0; r < rows; ++r) {
      for (int32_t i = 0; i < part; ++i) p_part[size_t(i)] = i < valid && i >= sinks ? p[int64_t(r) * length + t0 + i] : 0.f;
      p_sums[size_t(r)] = quantize_uint8(p_part.data(), part, p_codes.data() + int64_t(r) * part, p_params[size_t(r)]);
    }
    const int64_t meta = block * kv.v_meta_block() + head * kv.v_meta_head() + int64_t(index) * dim;
    for (int32_t c = 0; c < dim; ++c) {
      const uint8_t* packed = kv.v_codes + block * kv.v_codes_block() + head * kv.v_codes_head() +
                              int64_t(c) * (kv.block_size / 4) + index * part / 4;
      for (int32_t i = 0; i < part; ++i) v_codes[size_t(i)] = int2_code(packed, i);
      const float v_min = to_f32(kv.v_min[meta + c]), v_scale = to_f32(kv.v_scale[meta + c]);
      const auto v_sum = float(load_sum(kv.v_sums, meta + c, kv.sum_bytes()));
      for (int32_t r = 0; r < rows; ++r) {
        const uint8_t* pc = p_codes.data() + int64_t(r) * part;
        int32_t dot = 0;
        for (int32_t i = 0; i < part; ++i) dot += int32_t(pc[i]) * int32_t(v_codes[size_t(i)]);
        const Uint8Params& pp = p_params[size_t(r)];
        out[int64_t(r) * dim + c] += float(part) * pp.min * v_min + pp.min * v_scale * v_sum +
                                     v_min * pp.scale * float(p_sums[size_t(r)]) + pp.scale * v_scale * float(dot);
      }
    }
    for (int32_t i = 0; i < sinks; ++i) {
      const f16* v = sink_row(kv, kv.sink_v, head, blocks, i);
      for (int32_t r = 0; r < rows; ++r) {
        const float w = p[int64_t(r) * length + i];
        for (int32_t c = 0; c < dim; ++c) out[int64_t(r) * dim + c] += w * to_f32(v[c]);
      }
    }
  }
}

// Row `slot` of one kv head of block `block` of an fp8 pool, dequantized.
void fp8_row(const QuantizedPagedKv& kv, const uint8_t* codes, const float* scales, int32_t head, int64_t block,
             int64_t slot, float* row) {
  const uint8_t* c = codes + block * kv.k_codes_block() + head * kv.k_codes_head() + slot * kv.head_dim;
  const float scale = scales[block * kv.fp8_scale_block() + head * kv.fp8_scale_head() + slot];
  for (int32_t d = 0; d < kv.head_dim; ++d) row[d] = scale * e4m3_to_f32(c[d]);
}

}  // namespace

void quantized_scores(const QuantizedPagedKv& kv, int32_t kv_head, std::span<const int32_t> blocks, int32_t length,
                      const float* q, int32_t rows, float* scores) {
  check_blocks(kv, blocks, length);
  if (!kv.fp8_keys()) {
    int2_scores(kv, kv_head, blocks, length, q, rows, scores);
  } else {
    std::vector<float> k(size_t(kv.head_dim));
    for (int32_t t = 0; t < length; ++t) {
      fp8_row(kv, kv.k_codes, kv.k_fp8_scale, kv_head, blocks[size_t(t / kv.block_size)], t % kv.block_size, k.data());
      for (int32_t r = 0; r < rows; ++r) {
        float s = 0.f;
        for (int32_t d = 0; d < kv.head_dim; ++d) s += q[int64_t(r) * kv.head_dim + d] * k[size_t(d)];
        scores[int64_t(r) * length + t] = s;
      }
    }
  }
  // Sink tokens: the f16 keys against the unquantized queries.
  for (int32_t t = 0; t < sinks_in(kv, length); ++t) {
    const f16* k = sink_row(kv, kv.sink_k, kv_head, blocks, t);
    for (int32_t r = 0; r < rows; ++r) {
      float s = 0.f;
      for (int32_t d = 0; d < kv.head_dim; ++d) s += q[int64_t(r) * kv.head_dim + d] * to_f32(k[d]);
      scores[int64_t(r) * length + t] = s;
    }
  }
}

void quantized_weighted_values(const QuantizedPagedKv& kv, int32_t kv_head, std::span<const int32_t> blocks,
                               int32_t length, const float* p, int32_t rows, float* out) {
  check_blocks(kv, blocks, length);
  if (kv.quant == KvQuant::kInt2) return int2_weighted_values(kv, kv_head, blocks, length, p, rows, out);
  std::fill(out, out + int64_t(rows) * kv.head_dim, 0.f);
  std::vector<float> v(size_t(kv.head_dim));
  for (int32_t t = 0; t < length; ++t) {
    fp8_row(kv, kv.v_codes, kv.v_fp8_scale, kv_head, blocks[size_t(t / kv.block_size)], t % kv.block_size, v.data());
    for (int32_t r = 0; r < rows; ++r) {
      const float w = p[int64_t(r) * length + t];
      for (int32_t d = 0; d < kv.head_dim; ++d) out[int64_t(r) * kv.head_dim + d] += w * v[size_t(d)];
    }
  }
}

void attend_quantized_group(const QuantizedPagedKv& kv, int32_t kv_head, std::span<const int32_t> blocks,
                            int32_t length, const float* q, int32_t rows, float softmax_scale, float* out,
                            float* lse) {
  if (length == 0) {
    std::fill(out, out + int64_t(rows) * kv.head_dim, 0.f);
    std::fill(lse, lse + rows, -std::numeric_limits<float>::infinity());
    return;
  }
  std::vector<float> p(size_t(rows) * size_t(length));
  quantized_scores(kv, kv_head, blocks, length, q, rows, p.data());
  std::vector<float> sums(static_cast<size_t>(rows));
  for (int32_t r = 0; r < rows; ++r) {
    float* row = p.data() + int64_t(r) * length;
    float max = -std::numeric_limits<float>::infinity();
    for (int32_t t = 0; t < length; ++t) max = std::max(max, row[t] * softmax_scale);
    float sum = 0.f;
    for (int32_t t = 0; t < length; ++t) sum += row[t] = std::exp(row[t] * softmax_scale - max);
    sums[size_t(r)] = sum;
    lse[r] = max + std::log(sum);
  }
  quantized_weighted_values(kv, kv_head, blocks, length, p.data(), rows, out);
  for (int32_t r = 0; r < rows; ++r)
    for (int32_t d = 0; d < kv.head_dim; ++d) out[int64_t(r) * kv.head_dim + d] /= sums[size_t(r)];
}

namespace {

void check_shape(const attention::AttentionShape& shape, const QuantizedPagedKv& kv) {
  if (shape.num_kv_heads != kv.num_kv_heads || shape.head_dim != kv.head_dim || shape.block_size != kv.block_size ||
      shape.num_kv_heads <= 0 || shape.num_q_heads % shape.num_kv_heads != 0)
    fail(ErrorKind::kInvalidArgument,
         "quantized KV pool ({} kv heads, head dim {}, block size {}) does not match the attention shape ({} q heads, "
         "{}, {}, {})", kv.num_kv_heads, kv.head_dim, kv.block_size, shape.num_q_heads, shape.num_kv_heads,
         shape.head_dim, shape.block_size);
}

}  // namespace

void decode_attention_quantized(const attention::DecodeBatch& batch, const attention::AttentionShape& shape,
                                const QuantizedPagedKv& kv, const float* q, float* out, float* lse) {
  check_shape(shape, kv);
  for (int32_t seq = 0; seq < batch.num_seqs(); ++seq) check_blocks(kv, batch.blocks_of(seq), batch.kv_lengths[size_t(seq)]);
  const int32_t group = shape.group_size();
  const int64_t tasks = int64_t(batch.num_seqs()) * shape.num_kv_heads;
  const int64_t dim = shape.head_dim;
#pragma omp parallel
  {
    std::vector<float> row_lse(static_cast<size_t>(group));
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const auto seq = int32_t(task / shape.num_kv_heads), head = int32_t(task % shape.num_kv_heads);
      const int64_t first_row = int64_t(seq) * shape.num_q_heads + int64_t(head) * group;
      attend_quantized_group(kv, head, batch.blocks_of(seq), batch.kv_lengths[size_t(seq)], q + first_row * dim, group,
                             shape.softmax_scale, out + first_row * dim, lse ? lse + first_row : row_lse.data());
    }
  }
}

void prefill_attention_quantized(const attention::AttentionShape& shape, const QuantizedPagedKv& kv,
                                 std::span<const int32_t> block_ids, int32_t start_pos, int32_t num_new,
                                 const float* q, float* out, float* lse) {
  check_shape(shape, kv);
  if (start_pos < 0 || num_new < 0 || int64_t(block_ids.size()) * kv.block_size < int64_t(start_pos) + num_new)
    fail(ErrorKind::kInvalidArgument, "prefill: tokens [{}, {}) with {} blocks of {}", start_pos,
         int64_t(start_pos) + num_new, block_ids.size(), kv.block_size);
  check_blocks(kv, block_ids, start_pos + num_new);
  const int32_t group = shape.group_size();
  const int64_t tasks = int64_t(num_new) * shape.num_kv_heads;
  const int64_t dim = shape.head_dim;
#pragma omp parallel
  {
    std::vector<float> row_lse(static_cast<size_t>(group));
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const auto i = int32_t(task / shape.num_kv_heads), head = int32_t(task % shape.num_kv_heads);
      const int64_t first_row = int64_t(i) * shape.num_q_heads + int64_t(head) * group;
      attend_quantized_group(kv, head, block_ids, start_pos + i + 1, q + first_row * dim, group, shape.softmax_scale,
                             out + first_row * dim, lse ? lse + first_row : row_lse.data());
    }
  }
}

}  // namespace pagoda::cpu

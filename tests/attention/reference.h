// Test helpers for attention: a host KV pool filled independently of kv/ (its element offsets
// written out per layout, not taken from make_paged_kv's strides), random data, and the exact
// reference: plain double-precision softmax attention over contiguous K and V.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "pagoda/core/half.h"
#include "pagoda/core/paged_kv.h"

namespace pagoda::attention::testing {

// Deterministic random numbers (xorshift64).
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed * 0x9e3779b97f4a7c15ull + 1) {}
  uint64_t bits() {
    state_ ^= state_ << 13;
    state_ ^= state_ >> 7;
    state_ ^= state_ << 17;
    return state_;
  }
  // Uniform in [lo, hi).
  float uniform(float lo, float hi) { return lo + (hi - lo) * float(bits() >> 40) * 0x1p-24f; }
  // Uniform in [0, n).
  uint64_t next(uint64_t n) { return bits() % n; }

 private:
  uint64_t state_;
};

struct HostPool {
  DType dtype;
  KvLayout layout;
  int32_t num_blocks, block_size, num_kv_heads, head_dim;
  std::vector<uint8_t> k_bytes, v_bytes;

  HostPool(DType dtype, KvLayout layout, int32_t num_blocks, int32_t block_size,
           int32_t num_kv_heads, int32_t head_dim)
      : dtype(dtype), layout(layout), num_blocks(num_blocks), block_size(block_size),
        num_kv_heads(num_kv_heads), head_dim(head_dim) {
    const size_t bytes = size_t(num_blocks) * size_t(block_size) * size_t(num_kv_heads) *
                         size_t(head_dim) * dtype_size(dtype);
    k_bytes.assign(bytes, 0xff);  // NaN in every dtype: reading an unwritten slot shows
    v_bytes.assign(bytes, 0xff);
  }

  PagedKv view() {
    return make_paged_kv(k_bytes.data(), v_bytes.data(), dtype, layout, num_blocks, block_size,
                         num_kv_heads, head_dim);
  }

  size_t offset(int32_t block, int32_t head, int32_t slot, int32_t d) const {
    const size_t b = size_t(block), h = size_t(head), s = size_t(slot);
    const size_t H = size_t(num_kv_heads), B = size_t(block_size), D = size_t(head_dim);
    return layout == KvLayout::kHnd ? ((b * H + h) * B + s) * D + size_t(d)
                                    : ((b * B + s) * H + h) * D + size_t(d);
  }

  // Stores row x [head_dim] of token slot `slot` in the pool's dtype; `stored` receives the
  // values the pool now holds.
  void store_row(bool is_v, int32_t block, int32_t head, int32_t slot, const float* x,
                 float* stored) {
    uint8_t* base = (is_v ? v_bytes : k_bytes).data() + offset(block, head, slot, 0) * dtype_size(dtype);
    for (int32_t d = 0; d < head_dim; ++d) {
      if (dtype == DType::kF32) {
        std::memcpy(base + size_t(d) * 4, &x[d], 4);
        stored[d] = x[d];
        continue;
      }
      const uint16_t bits = dtype == DType::kF16 ? f32_to_f16(x[d]) : f32_to_bf16(x[d]);
      std::memcpy(base + size_t(d) * 2, &bits, 2);
      stored[d] = dtype == DType::kF16 ? f16_to_f32(bits) : bf16_to_f32(bits);
    }
  }
};

// A sequence's KV as the reference sees it: contiguous, in the pool's rounded values.
struct HostSequence {
  std::vector<int32_t> blocks;
  int32_t length = 0;
  std::vector<float> k, v;  // [length, num_kv_heads, head_dim]
};

// Writes random K/V in [-1, 1) for tokens [begin, end) of seq into the pool (seq.blocks must
// cover them).
inline void fill_tokens(HostPool& pool, HostSequence& seq, int32_t begin, int32_t end,
                        Random& rng) {
  const size_t head_dim = size_t(pool.head_dim), row = size_t(pool.num_kv_heads) * head_dim;
  seq.k.resize(size_t(end) * row);
  seq.v.resize(size_t(end) * row);
  // Rows are windows at random offsets into one table of random values: drawing every value
  // afresh dominates the test's time under the sanitizers.
  static const std::vector<float> table = [] {
    Random table_rng(12345);
    std::vector<float> values(size_t(1) << 16);
    for (float& x : values) x = table_rng.uniform(-1, 1);
    return values;
  }();
  const uint64_t windows = table.size() - head_dim;
  for (int32_t t = begin; t < end; ++t) {
    const int32_t block = seq.blocks[size_t(t / pool.block_size)], slot = t % pool.block_size;
    for (int32_t h = 0; h < pool.num_kv_heads; ++h) {
      const size_t at = size_t(t) * row + size_t(h) * head_dim;
      pool.store_row(false, block, h, slot, &table[rng.next(windows)], &seq.k[at]);
      pool.store_row(true, block, h, slot, &table[rng.next(windows)], &seq.v[at]);
    }
  }
  seq.length = std::max(seq.length, end);
}

struct ReferenceState {
  std::vector<double> o;  // [head_dim]
  double lse;
};

// Exact attention of one query row over tokens [begin, end) of kv head `head`.
inline ReferenceState reference_attention(const float* q, const HostSequence& seq, int32_t head,
                                          int32_t num_kv_heads, int32_t head_dim, double scale,
                                          int32_t begin, int32_t end) {
  ReferenceState state{std::vector<double>(size_t(head_dim), 0.0),
                       -std::numeric_limits<double>::infinity()};
  if (begin >= end) return state;
  std::vector<double> scores;
  double max_score = -std::numeric_limits<double>::infinity();
  for (int32_t t = begin; t < end; ++t) {
    const float* k = &seq.k[(size_t(t) * size_t(num_kv_heads) + size_t(head)) * size_t(head_dim)];
    double s = 0;
    for (int32_t d = 0; d < head_dim; ++d) s += double(q[d]) * double(k[d]);
    scores.push_back(s * scale);
    max_score = std::max(max_score, scores.back());
  }
  double sum = 0;
  for (int32_t t = begin; t < end; ++t) {
    const double p = std::exp(scores[size_t(t - begin)] - max_score);
    sum += p;
    const float* v = &seq.v[(size_t(t) * size_t(num_kv_heads) + size_t(head)) * size_t(head_dim)];
    for (int32_t d = 0; d < head_dim; ++d) state.o[size_t(d)] += p * double(v[d]);
  }
  for (double& x : state.o) x /= sum;
  state.lse = max_score + std::log(sum);
  return state;
}

}  // namespace pagoda::attention::testing

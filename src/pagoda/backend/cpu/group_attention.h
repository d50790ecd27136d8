// The inner loop shared by the CPU decode executor and CPU prefill: the attention state of one
// GQA group of query rows over a token range of a paged sequence, by online softmax. Each KV
// row is read and converted once and used by every query row of the group, the order a GPU
// kernel reads a block in.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "pagoda/attention/merge.h"
#include "pagoda/core/error.h"
#include "pagoda/core/half.h"
#include "pagoda/core/paged_kv.h"

namespace pagoda::cpu {

template <typename T>
inline float kv_to_f32(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, f16>) {
    return f16_to_f32(x.bits);
  } else {
    static_assert(std::is_same_v<T, bf16>);
    return bf16_to_f32(x.bits);
  }
}

// Calls fn.template operator()<T>() with T the C++ type of the pool's elements.
template <typename Fn>
void dispatch_kv_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32: return fn.template operator()<float>();
    case DType::kF16: return fn.template operator()<f16>();
    case DType::kBF16: return fn.template operator()<bf16>();
    default: fail(ErrorKind::kUnsupported, "KV pool dtype {} (want f32, f16 or bf16)", dtype_name(dtype));
  }
}

// Per-thread buffers, sized once for a group and a block.
struct GroupScratch {
  std::vector<float> q;       // [rows, head_dim], pre-multiplied by the softmax scale
  std::vector<float> kv_row;  // [head_dim]: one K or V row converted to fp32
  std::vector<float> p;       // [rows, block_size]: scores, then exp(score - running max)
  std::vector<float> acc;     // [rows, head_dim]: sum of p * v, unnormalized
  std::vector<float> max;     // [rows]: running max score
  std::vector<float> sum;     // [rows]: running sum of exp(score - max)

  GroupScratch(int32_t rows, int32_t head_dim, int32_t block_size)
      : q(size_t(rows) * size_t(head_dim)), kv_row(size_t(head_dim)),
        p(size_t(rows) * size_t(block_size)), acc(size_t(rows) * size_t(head_dim)),
        max(size_t(rows)), sum(size_t(rows)) {}
};

inline float dot(const float* a, const float* b, int32_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int32_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

template <typename T>
inline void load_row(const T* src, float* dst, int32_t n) {
  for (int32_t i = 0; i < n; ++i) dst[i] = kv_to_f32(src[i]);
}

// State of `rows` query rows over KV tokens [token_begin, token_end) of kv head kv_head.
//   blocks: the sequence's block ids from its first block (token t is in blocks[t / block_size])
//   q:      [rows, head_dim] fp32;  o: [rows, head_dim] fp32 out;  lse: [rows] out
// An empty range gives the empty state (o = 0, lse = -inf).
template <typename T>
void attend_group(const PagedKv& kv, int32_t kv_head, std::span<const int32_t> blocks,
                  int32_t token_begin, int32_t token_end, const float* q, int32_t rows,
                  float softmax_scale, float* o, float* lse, GroupScratch& scratch) {
  const int32_t head_dim = kv.head_dim;
  const int32_t block_size = kv.block_size;
  for (int64_t i = 0; i < int64_t(rows) * head_dim; ++i) scratch.q[size_t(i)] = q[i] * softmax_scale;
  std::fill(scratch.acc.begin(), scratch.acc.end(), 0.f);
  std::fill(scratch.max.begin(), scratch.max.end(), attention::kEmptyLse);
  std::fill(scratch.sum.begin(), scratch.sum.end(), 0.f);
  const T* k_head = static_cast<const T*>(kv.k) + kv_head * kv.head_stride;
  const T* v_head = static_cast<const T*>(kv.v) + kv_head * kv.head_stride;
  float* kv_row = scratch.kv_row.data();

  const int32_t end_block = token_begin < token_end ? (token_end - 1) / block_size + 1 : 0;
  for (int32_t b = token_begin / block_size; b < end_block; ++b) {
    const int64_t page = int64_t(blocks[size_t(b)]) * kv.page_stride;
    const int32_t t0 = std::max(token_begin - b * block_size, 0);
    const int32_t t1 = std::min(token_end - b * block_size, block_size);
    const int32_t n = t1 - t0;
    for (int32_t t = t0; t < t1; ++t) {
      load_row(k_head + page + t * kv.token_stride, kv_row, head_dim);
      for (int32_t r = 0; r < rows; ++r) {
        scratch.p[size_t(r) * size_t(block_size) + size_t(t - t0)] =
            dot(&scratch.q[size_t(r) * size_t(head_dim)], kv_row, head_dim);
      }
    }
    // Online softmax: rescale what was accumulated under the old max once per block.
    for (int32_t r = 0; r < rows; ++r) {
      float* p = &scratch.p[size_t(r) * size_t(block_size)];
      const float new_max = std::max(scratch.max[size_t(r)], *std::max_element(p, p + n));
      const float correction = std::exp(scratch.max[size_t(r)] - new_max);  // exp(-inf) = 0 at first
      float block_sum = 0.f;
      for (int32_t t = 0; t < n; ++t) {
        p[t] = std::exp(p[t] - new_max);
        block_sum += p[t];
      }
      scratch.sum[size_t(r)] = scratch.sum[size_t(r)] * correction + block_sum;
      scratch.max[size_t(r)] = new_max;
      float* acc = &scratch.acc[size_t(r) * size_t(head_dim)];
      for (int32_t d = 0; d < head_dim; ++d) acc[d] *= correction;
    }
    for (int32_t t = t0; t < t1; ++t) {
      load_row(v_head + page + t * kv.token_stride, kv_row, head_dim);
      for (int32_t r = 0; r < rows; ++r) {
        const float weight = scratch.p[size_t(r) * size_t(block_size) + size_t(t - t0)];
        float* acc = &scratch.acc[size_t(r) * size_t(head_dim)];
#pragma omp simd
        for (int32_t d = 0; d < head_dim; ++d) acc[d] += weight * kv_row[d];
      }
    }
  }

  for (int32_t r = 0; r < rows; ++r) {
    const float sum = scratch.sum[size_t(r)];
    float* out = o + int64_t(r) * head_dim;
    const float* acc = &scratch.acc[size_t(r) * size_t(head_dim)];
    if (sum == 0.f) {  // empty range
      std::fill(out, out + head_dim, 0.f);
      lse[r] = attention::kEmptyLse;
      continue;
    }
    for (int32_t d = 0; d < head_dim; ++d) out[d] = acc[d] / sum;
    lse[r] = scratch.max[size_t(r)] + std::log(sum);
  }
}

// Throws Error(kInvalidArgument) unless kv is a CPU pool matching shape.
inline void check_pool(const PagedKv& kv, int32_t num_kv_heads, int32_t head_dim,
                       int32_t block_size) {
  if (kv.device != Device::kCpu || kv.num_kv_heads != num_kv_heads || kv.head_dim != head_dim ||
      kv.block_size != block_size || kv.k == nullptr || kv.v == nullptr) {
    fail(ErrorKind::kInvalidArgument,
         "KV pool ({} kv heads, head dim {}, block size {}) does not match the attention shape "
         "({}, {}, {}) or is not a CPU pool",
         kv.num_kv_heads, kv.head_dim, kv.block_size, num_kv_heads, head_dim, block_size);
  }
}

// Throws Error(kInvalidArgument) if a block id is outside the pool.
inline void check_block_ids(std::span<const int32_t> ids, int32_t num_blocks) {
  for (int32_t id : ids) {
    if (id < 0 || id >= num_blocks) {
      fail(ErrorKind::kInvalidArgument, "block id {} outside the pool's {} blocks", id, num_blocks);
    }
  }
}

}  // namespace pagoda::cpu

// Kernels of layer_ops.h: memory-bound elementwise and row-reduction kernels over f16/bf16 (T is
// __half or __nv_bfloat16). Each thread moves 16-byte vectors of 8 elements; the math is fp32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "pagoda/backend/cuda/kernels/ptx.cuh"

namespace pagoda::cuda::kernels {

constexpr int kVector = 8;          // elements of T in one 16-byte vector
constexpr int kRowThreads = 256;    // threads of a one-row-per-CTA kernel
constexpr int kFlatThreads = 256;   // threads of a CTA of a flat elementwise kernel

template <typename T>
__device__ __forceinline__ void unpack8(uint4 v, float (&f)[kVector]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 pair = ptx::unpack2<T>(words[i]);
    f[2 * i] = pair.x;
    f[2 * i + 1] = pair.y;
  }
}

template <typename T>
__device__ __forceinline__ uint4 pack8(const float (&f)[kVector]) {
  return uint4{ptx::pack2<T>(f[0], f[1]), ptx::pack2<T>(f[2], f[3]), ptx::pack2<T>(f[4], f[5]),
               ptx::pack2<T>(f[6], f[7])};
}

// The sum of every thread's x, returned to all threads of the CTA (kRowThreads of them).
__device__ __forceinline__ float block_sum(float x) {
  constexpr int kWarps = kRowThreads / 32;
  __shared__ float warp_sums[kWarps];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = x;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += warp_sums[w];
  return total;
}

// One CTA per output row: a plain copy, so the element type does not matter.
__global__ void __launch_bounds__(kRowThreads)
    embed_kernel(const uint4* __restrict__ table, const int32_t* __restrict__ ids, int64_t vectors_per_row,
                 uint4* __restrict__ out) {
  const uint4* src = table + int64_t(ids[blockIdx.x]) * vectors_per_row;
  uint4* dst = out + int64_t(blockIdx.x) * vectors_per_row;
  for (int64_t v = threadIdx.x; v < vectors_per_row; v += kRowThreads) dst[v] = src[v];
}

// One CTA per output row, fp32 sum of squares. The row is read twice rather than held in
// registers or shared memory: the second read hits L1/L2, and any hidden size works.
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    rms_norm_kernel(const T* __restrict__ x, const int32_t* __restrict__ rows, const T* __restrict__ weight,
                    float eps, int64_t hidden, T* __restrict__ out) {
  const int64_t row = rows ? rows[blockIdx.x] : blockIdx.x;
  const uint4* in = reinterpret_cast<const uint4*>(x + row * hidden);
  const uint4* w = reinterpret_cast<const uint4*>(weight);
  uint4* dst = reinterpret_cast<uint4*>(out + int64_t(blockIdx.x) * hidden);
  const int64_t vectors = hidden / kVector;
  float sum_squares = 0.f;
  for (int64_t v = threadIdx.x; v < vectors; v += kRowThreads) {
    float f[kVector];
    unpack8<T>(in[v], f);
#pragma unroll
    for (int i = 0; i < kVector; ++i) sum_squares += f[i] * f[i];
  }
  const float inv_rms = rsqrtf(block_sum(sum_squares) / float(hidden) + eps);
  for (int64_t v = threadIdx.x; v < vectors; v += kRowThreads) {
    float f[kVector], g[kVector];
    unpack8<T>(in[v], f);
    unpack8<T>(w[v], g);
#pragma unroll
    for (int i = 0; i < kVector; ++i) f[i] = f[i] * inv_rms * g[i];
    dst[v] = pack8<T>(f);
  }
}

// residual += delta (rounded to T and stored), then RMSNorm of the rounded residual. Each thread
// re-reads in the second pass only the vectors it wrote itself, so no barrier beyond the
// reduction's is needed; and it has read all of its delta before block_sum's barrier, so out
// may alias delta (no __restrict__ here for that reason).
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    add_rms_norm_kernel(T* residual, const T* delta, const T* __restrict__ weight, float eps, int64_t hidden,
                        T* out) {
  const int64_t offset = int64_t(blockIdx.x) * hidden;
  uint4* res = reinterpret_cast<uint4*>(residual + offset);
  const uint4* add = reinterpret_cast<const uint4*>(delta + offset);
  const uint4* w = reinterpret_cast<const uint4*>(weight);
  uint4* dst = reinterpret_cast<uint4*>(out + offset);
  const int64_t vectors = hidden / kVector;
  float sum_squares = 0.f;
  for (int64_t v = threadIdx.x; v < vectors; v += kRowThreads) {
    float a[kVector], b[kVector];
    unpack8<T>(res[v], a);
    unpack8<T>(add[v], b);
#pragma unroll
    for (int i = 0; i < kVector; ++i) a[i] += b[i];
    const uint4 rounded = pack8<T>(a);
    res[v] = rounded;
    unpack8<T>(rounded, a);  // the norm sees the stored values, not the fp32 sums
#pragma unroll
    for (int i = 0; i < kVector; ++i) sum_squares += a[i] * a[i];
  }
  const float inv_rms = rsqrtf(block_sum(sum_squares) / float(hidden) + eps);
  for (int64_t v = threadIdx.x; v < vectors; v += kRowThreads) {
    float f[kVector], g[kVector];
    unpack8<T>(res[v], f);
    unpack8<T>(w[v], g);
#pragma unroll
    for (int i = 0; i < kVector; ++i) f[i] = f[i] * inv_rms * g[i];
    dst[v] = pack8<T>(f);
  }
}

// x += y over `vectors` 16-byte vectors.
template <typename T>
__global__ void __launch_bounds__(kFlatThreads) add_kernel(uint4* __restrict__ x, const uint4* __restrict__ y, int64_t vectors) {
  for (int64_t v = int64_t(blockIdx.x) * kFlatThreads + threadIdx.x; v < vectors; v += int64_t(gridDim.x) * kFlatThreads) {
    float a[kVector], b[kVector];
    unpack8<T>(x[v], a);
    unpack8<T>(y[v], b);
#pragma unroll
    for (int i = 0; i < kVector; ++i) a[i] += b[i];
    x[v] = pack8<T>(a);
  }
}

// out[r, j] = silu(gate[r, j]) * up[r, j], gate and up the two halves of a gate_up row. One
// rounding, where Hugging Face rounds silu's result before the product.
template <typename T>
__global__ void __launch_bounds__(kFlatThreads)
    silu_mul_kernel(const T* __restrict__ gate_up, int64_t width, int64_t vectors, T* __restrict__ out) {
  const int64_t vectors_per_row = width / kVector;
  for (int64_t v = int64_t(blockIdx.x) * kFlatThreads + threadIdx.x; v < vectors; v += int64_t(gridDim.x) * kFlatThreads) {
    const int64_t row = v / vectors_per_row;
    const T* gate = gate_up + row * 2 * width + (v % vectors_per_row) * kVector;
    float g[kVector], u[kVector];
    unpack8<T>(*reinterpret_cast<const uint4*>(gate), g);
    unpack8<T>(*reinterpret_cast<const uint4*>(gate + width), u);
#pragma unroll
    for (int i = 0; i < kVector; ++i) g[i] = g[i] / (1.f + expf(-g[i])) * u[i];
    reinterpret_cast<uint4*>(out)[v] = pack8<T>(g);
  }
}

// What rope_append_kv_kernel needs of its call, in one launch argument.
struct RopeAppendArgs {
  const void* qkv;            // [n, (q_heads + 2 * kv_heads) * head_dim]
  const int32_t* positions;   // [n]
  const int32_t* slot_block;  // [n], < 0: a padding row, nothing stored into the pool
  const float* inv_freq;      // [head_dim / 2]
  void* q_out;                // [n, q_heads, head_dim]
  void* k_pool;               // PagedKv::k
  void* v_pool;               // PagedKv::v
  int64_t page_stride;        // PagedKv strides, in elements
  int64_t head_stride;
  int64_t token_stride;
  int64_t units;              // n * units_per_row
  int32_t block_size;
  int32_t q_heads;
  int32_t kv_heads;
  int32_t head_dim;
};

// One thread per (row, head, 8 rotation pairs): it loads elements [i, i + 8) and their partners
// [i + h, i + h + 8) as two 16-byte vectors, rotates them (q and k heads) or passes them through
// (v heads), and stores both halves to q_out or the pool. The angle is the fp32 product
// float(pos) * inv_freq[i], as Hugging Face computes it; sincosf (not __sincosf) keeps cos/sin
// accurate when that angle is 1e5 radians.
template <typename T>
__global__ void __launch_bounds__(kFlatThreads) rope_append_kv_kernel(RopeAppendArgs a) {
  const int64_t unit = int64_t(blockIdx.x) * kFlatThreads + threadIdx.x;
  if (unit >= a.units) return;
  const int half = a.head_dim / 2;
  const int units_per_head = half / kVector;
  const int units_per_row = (a.q_heads + 2 * a.kv_heads) * units_per_head;
  const int64_t row = unit / units_per_row;
  const int in_row = int(unit % units_per_row);
  const int head = in_row / units_per_head;
  const int i0 = (in_row % units_per_head) * kVector;

  const int64_t row_elements = int64_t(a.q_heads + 2 * a.kv_heads) * a.head_dim;
  const T* src = static_cast<const T*>(a.qkv) + row * row_elements + int64_t(head) * a.head_dim;
  float lo[kVector], hi[kVector];
  unpack8<T>(*reinterpret_cast<const uint4*>(src + i0), lo);
  unpack8<T>(*reinterpret_cast<const uint4*>(src + half + i0), hi);
  const int32_t position = a.positions[row];
  if (head < a.q_heads + a.kv_heads) {
#pragma unroll
    for (int i = 0; i < kVector; ++i) {
      float sin_angle, cos_angle;
      sincosf(float(position) * a.inv_freq[i0 + i], &sin_angle, &cos_angle);
      const float x = lo[i], y = hi[i];
      lo[i] = x * cos_angle - y * sin_angle;
      hi[i] = y * cos_angle + x * sin_angle;
    }
  }

  T* dst;
  if (head < a.q_heads) {
    dst = static_cast<T*>(a.q_out) + (row * a.q_heads + head) * a.head_dim;
  } else {
    const int32_t block = a.slot_block[row];
    if (block < 0) return;
    const bool is_k = head < a.q_heads + a.kv_heads;
    const int kv_head = head - a.q_heads - (is_k ? 0 : a.kv_heads);
    dst = static_cast<T*>(is_k ? a.k_pool : a.v_pool) + int64_t(block) * a.page_stride +
          int64_t(kv_head) * a.head_stride + int64_t(position % a.block_size) * a.token_stride;
  }
  *reinterpret_cast<uint4*>(dst + i0) = pack8<T>(lo);
  *reinterpret_cast<uint4*>(dst + half + i0) = pack8<T>(hi);
}

}  // namespace pagoda::cuda::kernels

#include "pagoda/backend/cuda/layer_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/kernels/layer_ops.cuh"

namespace pagoda::cuda {
namespace {

using kernels::kFlatThreads;
using kernels::kRowThreads;
using kernels::kVector;

// Calls fn.template operator()<T>() with T the CUDA type of an f16 or bf16 dtype.
template <typename Fn>
void dispatch_element_type(DType dtype, const char* op, Fn&& fn) {
  if (dtype == DType::kF16) {
    fn.template operator()<__half>();
  } else if (dtype == DType::kBF16) {
    fn.template operator()<__nv_bfloat16>();
  } else {
    check_cuda(cudaErrorInvalidValue, op);  // op names the call: "<op> (dtype not f16 or bf16)"
  }
}

bool aligned_16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The 16-byte-vector contract of layer_ops.h: a row length of whole vectors, aligned tensors.
void require_vectors(int64_t row_length, std::initializer_list<const void*> tensors, const char* what) {
  bool ok = row_length > 0 && row_length % kVector == 0;
  for (const void* p : tensors) ok = ok && aligned_16(p);
  if (!ok) check_cuda(cudaErrorInvalidValue, what);
}

// Grid of a grid-stride elementwise kernel: enough CTAs to fill the GPU many times over, and no
// more (each thread then loops).
unsigned flat_grid(int64_t vectors) {
  constexpr int64_t kMaxBlocks = int64_t(1) << 16;
  return unsigned(std::clamp<int64_t>((vectors + kFlatThreads - 1) / kFlatThreads, 1, kMaxBlocks));
}

void check_launch(const char* what) { check_cuda(cudaGetLastError(), what); }

}  // namespace

void embed(const void* table, const int32_t* ids, int64_t n, int64_t hidden, DType dtype, void* out,
           cudaStream_t stream) {
  if (dtype != DType::kF16 && dtype != DType::kBF16) check_cuda(cudaErrorInvalidValue, "embed (dtype not f16 or bf16)");
  if (n == 0) return;
  require_vectors(hidden, {table, out}, "embed (hidden not a multiple of 8, or a tensor not 16-byte aligned)");
  kernels::embed_kernel<<<unsigned(n), kRowThreads, 0, stream>>>(
      static_cast<const uint4*>(table), ids, hidden / kVector, static_cast<uint4*>(out));
  check_launch("embed launch");
}

void rms_norm(const void* x, const int32_t* rows, const void* weight, float eps, int64_t n, int64_t hidden,
              DType dtype, void* out, cudaStream_t stream) {
  dispatch_element_type(dtype, "rms_norm (dtype not f16 or bf16)", [&]<typename T>() {
    if (n == 0) return;
    require_vectors(hidden, {x, weight, out}, "rms_norm (hidden not a multiple of 8, or a tensor not 16-byte aligned)");
    kernels::rms_norm_kernel<T><<<unsigned(n), kRowThreads, 0, stream>>>(
        static_cast<const T*>(x), rows, static_cast<const T*>(weight), eps, hidden, static_cast<T*>(out));
    check_launch("rms_norm launch");
  });
}

void add_rms_norm(void* residual, const void* delta, const void* weight, float eps, int64_t n, int64_t hidden,
                  DType dtype, void* out, cudaStream_t stream) {
  dispatch_element_type(dtype, "add_rms_norm (dtype not f16 or bf16)", [&]<typename T>() {
    if (n == 0) return;
    require_vectors(hidden, {residual, delta, weight, out},
                    "add_rms_norm (hidden not a multiple of 8, or a tensor not 16-byte aligned)");
    kernels::add_rms_norm_kernel<T><<<unsigned(n), kRowThreads, 0, stream>>>(
        static_cast<T*>(residual), static_cast<const T*>(delta), static_cast<const T*>(weight), eps, hidden,
        static_cast<T*>(out));
    check_launch("add_rms_norm launch");
  });
}

void add(void* x, const void* y, int64_t n, int64_t hidden, DType dtype, cudaStream_t stream) {
  dispatch_element_type(dtype, "add (dtype not f16 or bf16)", [&]<typename T>() {
    if (n == 0) return;
    require_vectors(hidden, {x, y}, "add (hidden not a multiple of 8, or a tensor not 16-byte aligned)");
    const int64_t vectors = n * hidden / kVector;
    kernels::add_kernel<T><<<flat_grid(vectors), kFlatThreads, 0, stream>>>(
        static_cast<uint4*>(x), static_cast<const uint4*>(y), vectors);
    check_launch("add launch");
  });
}

void silu_mul(const void* gate_up, int64_t n, int64_t width, DType dtype, void* out, cudaStream_t stream) {
  dispatch_element_type(dtype, "silu_mul (dtype not f16 or bf16)", [&]<typename T>() {
    if (n == 0) return;
    require_vectors(width, {gate_up, out}, "silu_mul (width not a multiple of 8, or a tensor not 16-byte aligned)");
    const int64_t vectors = n * width / kVector;
    kernels::silu_mul_kernel<T><<<flat_grid(vectors), kFlatThreads, 0, stream>>>(
        static_cast<const T*>(gate_up), width, vectors, static_cast<T*>(out));
    check_launch("silu_mul launch");
  });
}

void rope_append_kv(const void* qkv, int64_t n, const int32_t* positions, const int32_t* slot_block,
                    const float* inv_freq, int q_heads, int kv_heads, int head_dim, const PagedKv& kv,
                    DType dtype, void* q_out, cudaStream_t stream) {
  dispatch_element_type(dtype, "rope_append_kv (dtype not f16 or bf16)", [&]<typename T>() {
    if (n == 0) return;
    // Every 16-byte vector of a head, of a pool page and of a pool token row must be aligned:
    // head_dim a multiple of 16 (8 rotation pairs per thread) and strides of whole vectors.
    const bool shape_ok = head_dim > 0 && head_dim % (2 * kVector) == 0 && q_heads > 0 && kv_heads > 0 &&
                          kv.dtype == dtype && kv.num_kv_heads == kv_heads && kv.head_dim == head_dim &&
                          kv.block_size > 0 && kv.page_stride % kVector == 0 && kv.head_stride % kVector == 0 &&
                          kv.token_stride % kVector == 0;
    if (!shape_ok || !aligned_16(qkv) || !aligned_16(q_out) || !aligned_16(kv.k) || !aligned_16(kv.v)) {
      check_cuda(cudaErrorInvalidValue,
                 "rope_append_kv (head_dim not a multiple of 16, pool not matching dtype/heads/head_dim, "
                 "or a tensor not 16-byte aligned)");
    }
    const int64_t units_per_row = int64_t(q_heads + 2 * kv_heads) * (head_dim / (2 * kVector));
    const kernels::RopeAppendArgs args{.qkv = qkv,
                                       .positions = positions,
                                       .slot_block = slot_block,
                                       .inv_freq = inv_freq,
                                       .q_out = q_out,
                                       .k_pool = kv.k,
                                       .v_pool = kv.v,
                                       .page_stride = kv.page_stride,
                                       .head_stride = kv.head_stride,
                                       .token_stride = kv.token_stride,
                                       .units = n * units_per_row,
                                       .block_size = kv.block_size,
                                       .q_heads = q_heads,
                                       .kv_heads = kv_heads,
                                       .head_dim = head_dim};
    const unsigned blocks = unsigned((args.units + kFlatThreads - 1) / kFlatThreads);
    kernels::rope_append_kv_kernel<T><<<blocks, kFlatThreads, 0, stream>>>(args);
    check_launch("rope_append_kv launch");
  });
}

}  // namespace pagoda::cuda

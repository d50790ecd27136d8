#include "pagoda/backend/cuda/gemv.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/kernels/ptx.cuh"

namespace pagoda::cuda {
namespace {

constexpr int kWarps = 8;  // weight rows per CTA
constexpr int kUnroll = 4;  // 16-byte weight loads in flight per lane

__device__ __forceinline__ float2 to_float2(uint32_t bits, __half) {
  return __half22float2(*reinterpret_cast<const __half2*>(&bits));
}
__device__ __forceinline__ float2 to_float2(uint32_t bits, __nv_bfloat16) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
}
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// acc[r] += dot(8 weights, 8 values of row r of x).
template <typename T, int kRows>
__device__ __forceinline__ void accumulate(const uint4& wv, const uint4* __restrict__ x, int64_t x_stride, int64_t v,
                                           float (&acc)[kRows]) {
  const uint32_t wb[4] = {wv.x, wv.y, wv.z, wv.w};
  float2 wf[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) wf[i] = to_float2(wb[i], T());
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const uint4 xv = __ldg(x + r * x_stride + v);
    const uint32_t xb[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 xf = to_float2(xb[i], T());
      acc[r] = fmaf(wf[i].x, xf.x, acc[r]);
      acc[r] = fmaf(wf[i].y, xf.y, acc[r]);
    }
  }
}

template <typename T, int kRows, typename Out>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias, Out* __restrict__ out,
                int64_t n, int64_t k) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int64_t vectors = k / 8;
  const uint4* wrow = reinterpret_cast<const uint4*>(w + row * k);
  // Before the previous kernel's output is needed: the weights of this warp's first unrolled
  // iteration (2 KB of its row) into L2, one 128-byte line per lane at most. Only the first
  // iteration's: every resident warp's whole rows would pass L2's size (down's are 28 KB each).
  if (row < n) {
    const int64_t v = int64_t(lane) * 8;
    if (v < vectors && v < kUnroll * 32) asm volatile("prefetch.global.L2 [%0];" ::"l"(wrow + v));
  }
  ptx::wait_prerequisite_grid();
  ptx::launch_dependents();
  if (row >= n) return;

  const uint4* xv = reinterpret_cast<const uint4*>(x);
  float acc[kRows] = {};
  int64_t v = lane;
  for (; v + (kUnroll - 1) * 32 < vectors; v += kUnroll * 32) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wv[u] = __ldcs(wrow + v + u * 32);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) accumulate<T, kRows>(wv[u], xv, vectors, v + u * 32, acc);
  }
  for (; v < vectors; v += 32) accumulate<T, kRows>(__ldcs(wrow + v), xv, vectors, v, acc);

#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], offset);
  }
  if (lane == 0) {
    const float b = bias ? to_float(bias[row]) : 0.f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) store(out + r * n + row, acc[r] + b);
  }
}

template <typename T, typename Out, int kRows>
void launch(const void* x, const void* w, const void* bias, void* out, int64_t n, int64_t k, cudaStream_t stream) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned((n + kWarps - 1) / kWarps));
  config.blockDim = dim3(kWarps * 32);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  check_cuda(cudaLaunchKernelEx(&config, gemv_kernel<T, kRows, Out>, static_cast<const T*>(x),
                                static_cast<const T*>(w), static_cast<const T*>(bias), static_cast<Out*>(out), n, k),
             "gemv launch");
}

template <typename T, typename Out>
void launch_rows(const void* x, const void* w, const void* bias, void* out, int64_t m, int64_t n, int64_t k,
                 cudaStream_t stream) {
  switch (m) {
    case 1: return launch<T, Out, 1>(x, w, bias, out, n, k, stream);
    case 2: return launch<T, Out, 2>(x, w, bias, out, n, k, stream);
    case 3: return launch<T, Out, 3>(x, w, bias, out, n, k, stream);
    case 4: return launch<T, Out, 4>(x, w, bias, out, n, k, stream);
    case 5: return launch<T, Out, 5>(x, w, bias, out, n, k, stream);
    case 6: return launch<T, Out, 6>(x, w, bias, out, n, k, stream);
    case 7: return launch<T, Out, 7>(x, w, bias, out, n, k, stream);
    case 8: return launch<T, Out, 8>(x, w, bias, out, n, k, stream);
    default: check_cuda(cudaErrorInvalidValue, "gemv (rows not in 1..8)");
  }
}

}  // namespace

bool gemv_supported(int64_t m, int64_t k, DType dtype, DType out_dtype, const void* x, const void* w) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return m >= 1 && m <= kGemvMaxRows && k > 0 && k % 8 == 0 && (dtype == DType::kF16 || dtype == DType::kBF16) &&
         (out_dtype == dtype || out_dtype == DType::kF32) && aligned(x) && aligned(w);
}

void gemv(const void* x, const void* w, const void* bias, void* out, int64_t m, int64_t n, int64_t k, DType dtype,
          DType out_dtype, cudaStream_t stream) {
  if (n == 0) return;
  if (dtype == DType::kF16) {
    if (out_dtype == DType::kF32) return launch_rows<__half, float>(x, w, bias, out, m, n, k, stream);
    return launch_rows<__half, __half>(x, w, bias, out, m, n, k, stream);
  }
  if (out_dtype == DType::kF32) return launch_rows<__nv_bfloat16, float>(x, w, bias, out, m, n, k, stream);
  return launch_rows<__nv_bfloat16, __nv_bfloat16>(x, w, bias, out, m, n, k, stream);
}

}  // namespace pagoda::cuda

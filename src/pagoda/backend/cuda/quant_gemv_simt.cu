// The SIMT GEMV of quant_matmul.h (one activation row, and bf16 activations).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/kernels/quant_blocks.cuh"
#include "pagoda/backend/cuda/quant_launch.h"
#include "pagoda/backend/cuda/quant_matmul.h"

namespace pagoda::cuda {
namespace {

using kernels::chunk_bytes;
using kernels::kChunkPieces;
using kernels::kPiece;
using kernels::stage_bytes;

constexpr int kGemvWarps = 4;   // output rows per CTA, one per warp
constexpr int kGemvStages = 4;  // chunks of a row in flight per warp
constexpr int kVector = 8;      // activations in one 16-byte load

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
__device__ __forceinline__ void store(T* out, int64_t at, float v) {
  if constexpr (std::is_same_v<T, float>) {
    out[at] = v;
  } else {
    out[at] = ptx::from_float<T>(v);
  }
}

// The SIMT GEMV (one activation row, where it beats the tensor-core one, and bf16): one warp per
// output row. The row's chunks (1024 weights each) are staged kGemvStages ahead by
// cp.async, so each warp keeps several KB of the stream in flight; lane l dequantizes piece l of
// each chunk once and multiplies it into every activation row. The warp's partial sums meet by
// shuffles, and lane b stores row b's output.
template <typename T, DType kType, int kRows>
__global__ void __launch_bounds__(kGemvWarps * 32)
    quant_gemv_kernel(const T* __restrict__ x, const uint8_t* __restrict__ w, const T* __restrict__ bias,
                      void* __restrict__ out, bool out_f32, int n, int64_t m, int64_t k) {
  constexpr int kStage = stage_bytes(kType);
  constexpr int kChunkBytes = chunk_bytes(kType);
  __shared__ __align__(16) uint8_t stages[kGemvWarps][kGemvStages][kStage];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t row = int64_t(blockIdx.x) * kGemvWarps + warp;
  if (row >= m) return;  // the warps share nothing but the CTA's shared memory
  const int64_t row_bytes = int64_t(dtype_bytes(kType, k));
  const int64_t row_begin = row * row_bytes, row_end = row_begin + row_bytes, total = m * row_bytes;
  const int pieces = int(k / kPiece);
  const int chunks = (pieces + kChunkPieces - 1) / kChunkPieces;

  auto issue = [&](int c) {
    if (c < chunks) {
      const int64_t begin = row_begin + int64_t(c) * kChunkBytes;
      kernels::stage_chunk(w, total, begin, min(begin + kChunkBytes, row_end), stages[warp][c % kGemvStages], lane);
    }
    ptx::cp_async_commit();  // an empty group past the last chunk keeps the wait count uniform
  };
#pragma unroll
  for (int c = 0; c < kGemvStages - 1; ++c) issue(c);

  float acc[kRows] = {};
  for (int c = 0; c < chunks; ++c) {
    issue(c + kGemvStages - 1);
    ptx::cp_async_wait<kGemvStages - 1>();
    __syncwarp();
    const int p = c * kChunkPieces + lane;
    if (p < pieces) {
      const uint8_t* stage = stages[warp][c % kGemvStages] + ((row_begin + int64_t(c) * kChunkBytes) & 15);
      float y[kPiece];
      kernels::dequantize_piece<kType>(stage, lane, y);
#pragma unroll
      for (int b = 0; b < kRows; ++b) {
        if (b < n) {
          const uint4* xv = reinterpret_cast<const uint4*>(x + int64_t(b) * k + int64_t(p) * kPiece);
          float sum = 0.f;
#pragma unroll
          for (int v = 0; v < kPiece / kVector; ++v) {
            float f[kVector];
            unpack8<T>(__ldg(xv + v), f);
#pragma unroll
            for (int i = 0; i < kVector; ++i) sum = fmaf(f[i], y[kVector * v + i], sum);
          }
          acc[b] += sum;
        }
      }
    }
    __syncwarp();  // the stage is refilled by the next iteration's issue
  }
#pragma unroll
  for (int b = 0; b < kRows; ++b) {
    float v = acc[b];
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane == b && b < n) {
      if (bias) v += ptx::to_float(bias[row]);
      if (out_f32) {
        store(static_cast<float*>(out), int64_t(b) * m + row, v);
      } else {
        store(static_cast<T*>(out), int64_t(b) * m + row, v);
      }
    }
  }
}

template <typename Fn>
void dispatch_activation(DType dtype, const char* what, Fn&& fn) {
  if (dtype == DType::kF16) {
    fn.template operator()<__half>();
  } else if (dtype == DType::kBF16) {
    fn.template operator()<__nv_bfloat16>();
  } else {
    check_cuda(cudaErrorInvalidValue, what);
  }
}

}  // namespace

void launch_quant_gemv_simt(const void* x, const void* w, DType w_type, const void* bias, void* out, int64_t n,
                            int64_t m, int64_t k, DType act, DType out_type, cudaStream_t stream) {
  const char* what = "quant_gemv (activation dtype)";
  const dim3 grid(unsigned((m + kGemvWarps - 1) / kGemvWarps));
  dispatch_activation(act, what, [&]<typename T>() {
    kernels::dispatch_quantized(w_type, [&]<DType kType>() {
      auto launch = [&]<int kRows>() {
        quant_gemv_kernel<T, kType, kRows><<<grid, kGemvWarps * 32, 0, stream>>>(
            static_cast<const T*>(x), static_cast<const uint8_t*>(w), static_cast<const T*>(bias), out,
            out_type == DType::kF32, int(n), m, k);
      };
      if (n == 1) {
        launch.template operator()<1>();
      } else if (n == 2) {
        launch.template operator()<2>();
      } else if (n <= 4) {
        launch.template operator()<4>();
      } else if (n <= 8) {
        launch.template operator()<8>();
      } else {
        launch.template operator()<16>();
      }
    });
  });
  check_cuda(cudaGetLastError(), "quant_gemv launch");
}

}  // namespace pagoda::cuda

// The tensor-core GEMV of quant_matmul.h (f16 activations).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/kernels/quant_blocks.cuh"
#include "pagoda/backend/cuda/quant_launch.h"
#include "pagoda/backend/cuda/quant_matmul.h"

namespace pagoda::cuda {
namespace {

using kernels::kPiece;

// The GEMV on tensor cores, f16 activations. A CTA owns 16 weight rows (the mma's M) and every
// activation row (kTiles tiles of 8, the mma's N); its kMmaWarps warps split the rows' k (split-K
// inside the CTA, so that a 4096-row matrix still gives every SM several warps streaming), each
// walking every kMmaWarps-th chunk of 256 weights, staged kMmaStages ahead by cp.async (the 16
// rows' byte ranges of a chunk form one stage). Per piece, each lane unpacks 16 weights
// (quant_blocks.cuh's PieceOperands) and loads its activations in the same k order; per 8
// activation rows two mma give T and two S, and the scales are applied in fp32. The warps' sums
// meet in shared memory, added in warp order. Lane (g, t) holds rows g, g + 8 and activation
// rows 2t, 2t + 1 of each tile.
constexpr int kMmaWarps = 8;
constexpr int kMmaStages = 2;
constexpr int kMmaRows = 16;
constexpr int kMmaChunk = 256;  // weights of a row per stage: one k-quant super-block, 8 small blocks

// Bytes a staged row may span: its 256 weights' bytes, up to 15 before (16-byte start) and 15
// after, and 16 of slack for the word reads past the end; a multiple of 16.
template <DType kType>
constexpr int mma_row_stride() {
  return (int(dtype_bytes(kType, kMmaChunk)) + 15 + 15 + 15) / 16 * 16 + 16;
}

// Dynamic shared memory of a CTA: the warps' stages, which the final reduction reuses.
template <DType kType, int kTiles>
constexpr int mma_shared_bytes() {
  const int stages = kMmaWarps * kMmaStages * kMmaRows * mma_row_stride<kType>();
  const int reduction = kMmaWarps * kTiles * 4 * 32 * int(sizeof(float));
  return stages > reduction ? stages : reduction;
}

// sum w x over a piece from T = sum (1024 + u) x and S = sum x: scale T + (offset - 1024 scale) S,
// the large terms cancelling inside one fused multiply-add. Explicit roundings, so that every
// instantiation (any number of activation tiles) computes a row's result the same way.
__device__ __forceinline__ float piece_sum(float scale, float offset, float t, float s) {
  return fmaf(scale, t, __fmul_rn(fmaf(-1024.f, scale, offset), s));
}

template <DType kType, int kTiles>
__global__ void __launch_bounds__(kMmaWarps * 32)
    quant_gemv_mma_kernel(const __half* __restrict__ x, const uint8_t* __restrict__ w, const __half* __restrict__ bias,
                          void* __restrict__ out, bool out_f32, int n, int64_t m, int64_t k) {
  constexpr int kStride = mma_row_stride<kType>();
  constexpr int kStage = kMmaRows * kStride;
  constexpr int kVectors = (kStride - 16) / 16;  // 16-byte copies a row's chunk may need
  constexpr int kChunkBytes = int(dtype_bytes(kType, kMmaChunk));
  constexpr int kPieces = kMmaChunk / kPiece;
  extern __shared__ __align__(16) uint8_t shared[];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  uint8_t* stages = shared + warp * kMmaStages * kStage;
  const int64_t row0 = int64_t(blockIdx.x) * kMmaRows;
  const int64_t row_bytes = int64_t(dtype_bytes(kType, k)), total = m * row_bytes;
  const int pieces = int(k / kPiece);
  const int chunks = (pieces + kPieces - 1) / kPieces;
  const int my_chunks = warp < chunks ? (chunks - warp + kMmaWarps - 1) / kMmaWarps : 0;

  auto issue = [&](int j) {  // this warp's j-th chunk
    if (j < my_chunks) {
      const int c = warp + j * kMmaWarps;
      uint8_t* stage = stages + (j % kMmaStages) * kStage;
      for (int i = lane; i < kMmaRows * kVectors; i += 32) {
        const int r = i / kVectors, v = i % kVectors;
        const int64_t row = min(row0 + r, m - 1);  // a last partial tile re-reads the last row
        const int64_t begin = row * row_bytes + int64_t(c) * kChunkBytes;
        const int64_t end = min(begin + kChunkBytes, (row + 1) * row_bytes);
        const int64_t at = (begin & ~int64_t(15)) + 16 * int64_t(v);
        if (at >= end) continue;
        uint8_t* dst = stage + r * kStride + 16 * v;
        if (at + 16 <= total) {
          ptx::cp_async_16(ptx::smem_address(dst), w + at, 16);
        } else {
          for (int64_t b = at; b < total; ++b) dst[b - at] = w[b];
        }
      }
    }
    ptx::cp_async_commit();
  };
#pragma unroll
  for (int j = 0; j < kMmaStages - 1; ++j) issue(j);

  const int64_t row_g = min(row0 + g, m - 1), row_g8 = min(row0 + g + 8, m - 1);
  constexpr uint32_t kOnes[4] = {0x3c003c00u, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u};
  float acc[kTiles][4] = {};
  for (int j = 0; j < my_chunks; ++j) {
    issue(j + kMmaStages - 1);
    ptx::cp_async_wait<kMmaStages - 1>();
    __syncwarp();
    const int c = warp + j * kMmaWarps;
    const uint8_t* stage = stages + (j % kMmaStages) * kStage;
    const uint8_t* chunk_g = stage + g * kStride + ((row_g * row_bytes + int64_t(c) * kChunkBytes) & 15);
    const uint8_t* chunk_g8 = stage + (g + 8) * kStride + ((row_g8 * row_bytes + int64_t(c) * kChunkBytes) & 15);
    const int chunk_pieces = min(kPieces, pieces - c * kPieces);
    for (int p = 0; p < chunk_pieces; ++p) {
      kernels::PieceOperands<kType> a, b;
      kernels::unpack_piece<kType>(chunk_g, p, t, a);
      kernels::unpack_piece<kType>(chunk_g8, p, t, b);
      const uint32_t step0[4] = {a.h[0], b.h[0], a.h[2], b.h[2]};
      const uint32_t step1[4] = {a.h[1], b.h[1], a.h[3], b.h[3]};
      const int64_t piece_at = (int64_t(c) * kPieces + p) * kPiece + 4 * t;
#pragma unroll
      for (int tile = 0; tile < kTiles; ++tile) {
        const int col = tile * 8 + g;
        uint2 lo = {0u, 0u}, hi = {0u, 0u};
        if (col < n) {
          lo = __ldg(reinterpret_cast<const uint2*>(x + int64_t(col) * k + piece_at));
          hi = __ldg(reinterpret_cast<const uint2*>(x + int64_t(col) * k + piece_at + 16));
        }
        // The activations in the weights' k order: (x0, x2), (x1, x3) of each four.
        const uint32_t b00 = __byte_perm(lo.x, lo.y, 0x5410), b01 = __byte_perm(lo.x, lo.y, 0x7632);
        const uint32_t b10 = __byte_perm(hi.x, hi.y, 0x5410), b11 = __byte_perm(hi.x, hi.y, 0x7632);
        float t0[4] = {}, s0[4] = {};
        ptx::mma_16x8x16<__half>(t0, step0, b00, b01);
        ptx::mma_16x8x16<__half>(s0, kOnes, b00, b01);
        if constexpr (kType == DType::kQ6_K) {  // the piece's two halves have their own scales
          float t1[4] = {}, s1[4] = {};
          ptx::mma_16x8x16<__half>(t1, step1, b10, b11);
          ptx::mma_16x8x16<__half>(s1, kOnes, b10, b11);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const auto& o = i < 2 ? a : b;
            acc[tile][i] = __fadd_rn(acc[tile][i], __fadd_rn(piece_sum(o.scale[0], o.offset[0], t0[i], s0[i]),
                                                             piece_sum(o.scale[1], o.offset[1], t1[i], s1[i])));
          }
        } else {
          ptx::mma_16x8x16<__half>(t0, step1, b10, b11);
          ptx::mma_16x8x16<__half>(s0, kOnes, b10, b11);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const auto& o = i < 2 ? a : b;
            acc[tile][i] = __fadd_rn(acc[tile][i], piece_sum(o.scale[0], o.offset[0], t0[i], s0[i]));
          }
        }
      }
    }
    __syncwarp();
  }

  // The warps' partial sums, added in warp order by warp 0.
  ptx::cp_async_wait<0>();
  __syncthreads();
  float* partial = reinterpret_cast<float*>(shared);
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile)
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[((warp * kTiles + tile) * 4 + i) * 32 + lane] = acc[tile][i];
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float v = 0.f;
      for (int from = 0; from < kMmaWarps; ++from) v = __fadd_rn(v, partial[((from * kTiles + tile) * 4 + i) * 32 + lane]);
      const int64_t row = row0 + g + (i < 2 ? 0 : 8);
      const int col = tile * 8 + 2 * t + (i % 2);
      if (row >= m || col >= n) continue;
      if (bias) v += __half2float(bias[row]);
      if (out_f32) {
        static_cast<float*>(out)[int64_t(col) * m + row] = v;
      } else {
        static_cast<__half*>(out)[int64_t(col) * m + row] = __float2half_rn(v);
      }
    }
  }
}

}  // namespace

void launch_quant_gemv_mma(const void* x, const void* w, DType w_type, const void* bias, void* out, int64_t n,
                           int64_t m, int64_t k, DType out_type, cudaStream_t stream) {
  const dim3 grid(unsigned((m + kMmaRows - 1) / kMmaRows));
  kernels::dispatch_quantized(w_type, [&]<DType kType>() {
    auto launch = [&]<int kTiles>() {
      constexpr int kShared = mma_shared_bytes<kType, kTiles>();
      // Above the 48 KB a kernel gets by default: opted in once, at the first launch (outside
      // any graph capture: a captured step has run eagerly first).
      static const bool opted_in = [] {
        check_cuda(cudaFuncSetAttribute(quant_gemv_mma_kernel<kType, kTiles>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, kShared),
                   "quant_gemv shared memory");
        return true;
      }();
      (void)opted_in;
      quant_gemv_mma_kernel<kType, kTiles><<<grid, kMmaWarps * 32, kShared, stream>>>(
          static_cast<const __half*>(x), static_cast<const uint8_t*>(w), static_cast<const __half*>(bias), out,
          out_type == DType::kF32, int(n), m, k);
    };
    if (n <= 8) {
      launch.template operator()<1>();
    } else if (n <= 16) {
      launch.template operator()<2>();
    } else if (n <= 32) {
      launch.template operator()<4>();
    } else {
      launch.template operator()<8>();
    }
  });
  check_cuda(cudaGetLastError(), "quant_gemv launch");
}

}  // namespace pagoda::cuda

// dequantize_rows of quant_matmul.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/kernels/quant_blocks.cuh"
#include "pagoda/backend/cuda/quant_matmul.h"

namespace pagoda::cuda {
namespace {

using kernels::chunk_bytes;
using kernels::kChunkPieces;
using kernels::kPiece;
using kernels::stage_bytes;

constexpr int kDequantWarps = 8;  // (row, chunk) items per CTA, one per warp

template <typename T>
__device__ __forceinline__ void store(T* out, int64_t at, float v) {
  if constexpr (std::is_same_v<T, float>) {
    out[at] = v;
  } else {
    out[at] = ptx::from_float<T>(v);
  }
}

// One warp per (output row, chunk): stage the chunk, each lane dequantizes one piece and stores
// its 32 values.
template <typename OutT, DType kType>
__global__ void __launch_bounds__(kDequantWarps * 32)
    dequantize_rows_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t k, const int32_t* __restrict__ ids,
                           int64_t n, OutT* __restrict__ out) {
  constexpr int kChunkBytes = chunk_bytes(kType);
  __shared__ __align__(16) uint8_t stages[kDequantWarps][stage_bytes(kType)];
  // The chunk's values, so that the warp stores them as contiguous 16-byte vectors (a lane's own
  // 32 values are a 64-128-byte run: stored directly, every store instruction would scatter).
  __shared__ __align__(16) OutT values[kDequantWarps][kChunkPieces * kPiece];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int pieces = int(k / kPiece);
  const int chunks = (pieces + kChunkPieces - 1) / kChunkPieces;
  const int64_t item = int64_t(blockIdx.x) * kDequantWarps + warp;
  if (item >= n * chunks) return;
  const int64_t i = item / chunks;
  const int c = int(item % chunks);
  const int64_t row = ids ? ids[i] : i;
  const int64_t row_bytes = int64_t(dtype_bytes(kType, k));
  const int64_t begin = row * row_bytes + int64_t(c) * kChunkBytes;
  const int shift = kernels::stage_chunk(w, rows * row_bytes, begin, min(begin + kChunkBytes, (row + 1) * row_bytes),
                                         stages[warp], lane);
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
  __syncwarp();
  const int chunk_pieces = min(kChunkPieces, pieces - c * kChunkPieces);
  if (lane < chunk_pieces) {
    float y[kPiece];
    kernels::dequantize_piece<kType>(stages[warp] + shift, lane, y);
#pragma unroll
    for (int j = 0; j < kPiece; ++j) store(values[warp], lane * kPiece + j, y[j]);
  }
  __syncwarp();
  const uint4* src = reinterpret_cast<const uint4*>(values[warp]);
  uint4* dst = reinterpret_cast<uint4*>(out + i * k + int64_t(c) * kChunkPieces * kPiece);
  const int vectors = chunk_pieces * kPiece * int(sizeof(OutT)) / 16;
  for (int v = lane; v < vectors; v += 32) dst[v] = src[v];
}

bool aligned_16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void dequantize_rows(const void* w, DType w_type, int64_t rows, int64_t k, const int32_t* ids, int64_t n,
                     DType out_type, void* out, cudaStream_t stream) {
  const char* what = "dequantize_rows (shape, type or alignment)";
  if (!quantized_matmul_type(w_type) || k < 1 || k % block_elements(w_type) != 0 || rows < 0 || n < 0 ||
      !aligned_16(w) || !aligned_16(out))
    check_cuda(cudaErrorInvalidValue, what);
  if (n == 0) return;
  const int64_t chunks = (k / kPiece + kChunkPieces - 1) / kChunkPieces;
  const dim3 grid(unsigned((n * chunks + kDequantWarps - 1) / kDequantWarps));
  kernels::dispatch_quantized(w_type, [&]<DType kType>() {
    auto launch = [&]<typename OutT>() {
      dequantize_rows_kernel<OutT, kType><<<grid, kDequantWarps * 32, 0, stream>>>(
          static_cast<const uint8_t*>(w), rows, k, ids, n, static_cast<OutT*>(out));
    };
    if (out_type == DType::kF32) {
      launch.template operator()<float>();
    } else if (out_type == DType::kF16) {
      launch.template operator()<__half>();
    } else if (out_type == DType::kBF16) {
      launch.template operator()<__nv_bfloat16>();
    } else {
      check_cuda(cudaErrorInvalidValue, what);
    }
  });
  check_cuda(cudaGetLastError(), "dequantize_rows launch");
}

}  // namespace pagoda::cuda

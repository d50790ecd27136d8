#include "pagoda/backend/cuda/kv_tensor_map.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <array>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/core/dtype.h"
#include "pagoda/core/error.h"

namespace pagoda::cuda {
namespace {

// The driver's encoder, found through the runtime: pagoda links the runtime alone.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    check_cuda(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found),
               "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)");
    if (found != cudaDriverEntryPointSuccess || function == nullptr) {
      fail(ErrorKind::kUnsupported, "the CUDA driver has no cuTensorMapEncodeTiled (tensor maps need CUDA 12)");
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encode;
}

}  // namespace

CUtensorMap kv_tensor_map(const void* pool, const PagedKv& kv) {
  constexpr int64_t kElementBytes = 2;
  constexpr uint32_t kHalf = 64;  // elements: 128 bytes, the swizzle's span
  if (dtype_size(kv.dtype) != kElementBytes || kv.head_dim % kHalf != 0 || kv.block_size % kKvMapBoxTokens != 0) {
    fail(ErrorKind::kUnsupported, "a KV tensor map: {} elements of head_dim {} in blocks of {} tokens (2-byte "
         "elements, head_dim a multiple of 64, blocks of a multiple of {} tokens)",
         dtype_name(kv.dtype), kv.head_dim, kv.block_size, kKvMapBoxTokens);
  }
  const uint32_t halves = uint32_t(kv.head_dim) / kHalf;
  const std::array<cuuint64_t, 5> dims = {kHalf, cuuint64_t(kv.block_size), halves, cuuint64_t(kv.num_kv_heads),
                                          cuuint64_t(kv.num_blocks)};
  const std::array<cuuint64_t, 4> strides = {  // bytes, of dimensions 1-4
      cuuint64_t(kv.token_stride * kElementBytes), kHalf * kElementBytes, cuuint64_t(kv.head_stride * kElementBytes),
      cuuint64_t(kv.page_stride * kElementBytes)};
  const std::array<cuuint32_t, 5> box = {kHalf, uint32_t(kKvMapBoxTokens), halves, 1, 1};
  const std::array<cuuint32_t, 5> element_strides = {1, 1, 1, 1, 1};
  CUtensorMap map{};
  const CUresult status = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 5, const_cast<void*>(pool), dims.data(), strides.data(), box.data(),
      element_strides.data(), CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS) {
    fail(ErrorKind::kUnsupported,
         "cuTensorMapEncodeTiled failed (error {}) for a KV pool at {} of {} blocks x {} heads x {} tokens x {} "
         "(strides {}, {}, {} elements)",
         int(status), pool, kv.num_blocks, kv.num_kv_heads, kv.block_size, kv.head_dim, kv.page_stride,
         kv.head_stride, kv.token_stride);
  }
  return map;
}

KvTensorMaps kv_tensor_maps(const PagedKv& kv) {
  return KvTensorMaps{.k = kv_tensor_map(kv.k, kv), .v = kv_tensor_map(kv.v, kv), .kv = kv};
}

}  // namespace pagoda::cuda

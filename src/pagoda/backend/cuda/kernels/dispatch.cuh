// Calls fn.template operator()<T, kHeadDim>() for a runtime (dtype, head_dim): the one place
// the kernels' instantiation lists are written down. Callers have checked the pair against
// their kernel's *_unsupported_reason; anything else is a bug, reported as an internal error.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/core/dtype.h"

namespace pagoda::cuda {

template <typename T, typename Fn>
void dispatch_head_dim(int head_dim, Fn&& fn) {
  switch (head_dim) {
    case 64: return fn.template operator()<T, 64>();
    case 128: return fn.template operator()<T, 128>();
    case 256: return fn.template operator()<T, 256>();
    default: check_cuda(cudaErrorInvalidValue, "decode kernel dispatch (head_dim not 64, 128 or 256)");
  }
}

// The same for the kernels instantiated for head_dim 64 and 128 only (prefill, prefix); `what`
// names the kernel in the internal error.
template <typename Fn>
void dispatch_head_dim_64_128(DType dtype, int head_dim, const char* what, Fn&& fn) {
  auto by_head_dim = [&]<typename T>() {
    switch (head_dim) {
      case 64: return fn.template operator()<T, 64>();
      case 128: return fn.template operator()<T, 128>();
      default: check_cuda(cudaErrorInvalidValue, what);
    }
  };
  if (dtype == DType::kF16) {
    by_head_dim.template operator()<__half>();
  } else if (dtype == DType::kBF16) {
    by_head_dim.template operator()<__nv_bfloat16>();
  } else {
    check_cuda(cudaErrorInvalidValue, what);
  }
}

template <typename Fn>
void dispatch_decode_kernel(DType dtype, int head_dim, Fn&& fn) {
  if (dtype == DType::kF16) {
    dispatch_head_dim<__half>(head_dim, fn);
  } else if (dtype == DType::kBF16) {
    dispatch_head_dim<__nv_bfloat16>(head_dim, fn);
  } else {
    check_cuda(cudaErrorInvalidValue, "decode kernel dispatch (dtype not f16 or bf16)");
  }
}

}  // namespace pagoda::cuda

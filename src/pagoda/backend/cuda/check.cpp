#include "pagoda/backend/cuda/check.h"

#include "pagoda/core/error.h"

namespace pagoda::cuda {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail(ErrorKind::kInternal, "CUDA {}: {}", what, cudaGetErrorString(status));
}

bool device_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

}  // namespace pagoda::cuda

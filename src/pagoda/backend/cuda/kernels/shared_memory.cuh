// Opting a kernel into more than 48 KB of dynamic shared memory: CUDA wants it asked for
// explicitly, once per device for each kernel (tensor parallelism drives several devices from one
// process). A failed attempt throws and is retried by the next launch.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "pagoda/backend/cuda/check.h"

namespace pagoda::cuda {

template <auto kKernel, int kBytes>
void allow_dynamic_shared_memory(const char* what) {
  static std::atomic<uint64_t> done_devices{0};  // bit d: device d (ordinals >= 64 always ask)
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  const uint64_t bit = device < 64 ? uint64_t(1) << device : 0;
  if (bit != 0 && (done_devices.load(std::memory_order_relaxed) & bit)) return;
  check_cuda(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes), what);
  done_devices.fetch_or(bit, std::memory_order_relaxed);
}

}  // namespace pagoda::cuda

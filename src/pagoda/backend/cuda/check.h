// CUDA error checking: a failed runtime call becomes a pagoda::Error naming the call.
// Defined in check.cpp (host compiler): .cu files stay free of fmt, which nvcc cannot compile.
#pragma once

#include <cuda_runtime.h>

namespace pagoda::cuda {

void check_cuda(cudaError_t status, const char* what);

// Whether a usable GPU is present (GPU tests skip, not fail, without one).
bool device_available();

}  // namespace pagoda::cuda

#include "pagoda/parallel/make_communicators.h"

#include "pagoda/core/error.h"
#include "pagoda/parallel/cpu_communicator.h"
#ifdef PAGODA_HAVE_NCCL
#include "pagoda/backend/cuda/cuda_backend.h"
#include "pagoda/parallel/cuda/nccl_communicator.h"
#endif

namespace pagoda::parallel {

std::vector<std::unique_ptr<Communicator>> make_communicators(std::span<Backend* const> backends,
                                                              std::chrono::milliseconds timeout) {
  if (backends.empty()) fail(ErrorKind::kInvalidArgument, "tensor parallel: no ranks");
  for (Backend* backend : backends)
    if (backend->device() != backends[0]->device())
      fail(ErrorKind::kInvalidArgument, "tensor parallel: the ranks' backends are not all of one kind");
  if (backends[0]->device() == Device::kCpu) return make_cpu_communicators(int(backends.size()), timeout);
#ifdef PAGODA_HAVE_NCCL
  if (backends[0]->device() == Device::kCuda) {  // NCCL and the one-shot kernel on each rank's stream
    std::vector<int> gpus;
    std::vector<cudaStream_t> streams;
    for (Backend* backend : backends) {
      gpus.push_back(static_cast<CudaBackend*>(backend)->gpu());
      streams.push_back(static_cast<CudaBackend*>(backend)->stream());
    }
    auto nccl = make_nccl_communicators(gpus, streams, GpuCliqueOptions{.timeout = timeout});
    return {std::make_move_iterator(nccl.begin()), std::make_move_iterator(nccl.end())};
  }
#endif
  fail(ErrorKind::kUnsupported, "--tensor-parallel {}: this build has no communicator between {} ranks",
       backends.size(), backends[0]->name());
}

}  // namespace pagoda::parallel

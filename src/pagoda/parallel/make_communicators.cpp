#include "pagoda/parallel/make_communicators.h"

#include "pagoda/core/error.h"
#include "pagoda/parallel/cpu_communicator.h"

namespace pagoda::parallel {

std::vector<std::unique_ptr<Communicator>> make_communicators(std::span<Backend* const> backends,
                                                              std::chrono::milliseconds timeout) {
  if (backends.empty()) fail(ErrorKind::kInvalidArgument, "tensor parallel: no ranks");
  for (Backend* backend : backends)
    if (backend->device() != backends[0]->device())
      fail(ErrorKind::kInvalidArgument, "tensor parallel: the ranks' backends are not all of one kind");
  if (backends[0]->device() == Device::kCpu) return make_cpu_communicators(int(backends.size()), timeout);
  fail(ErrorKind::kUnsupported, "--tensor-parallel {}: this build has no communicator between {} ranks",
       backends.size(), backends[0]->name());
}

}  // namespace pagoda::parallel

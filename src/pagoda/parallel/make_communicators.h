// The one place a tensor-parallel rank's Communicator is made: by the kind of the ranks' backends
// (CPU: threads sharing memory, cpu_communicator.h; CUDA: NCCL, cuda/nccl_communicator.h).
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <vector>

#include "pagoda/backend/backend.h"
#include "pagoda/parallel/communicator.h"

namespace pagoda::parallel {

// One communicator per rank, rank r's for backends[r]; a rank that does not reach a collective
// within `timeout` makes the others fail. Throws Error(kUnsupported) for a backend kind that has
// no communicator in this build.
std::vector<std::unique_ptr<Communicator>> make_communicators(std::span<Backend* const> backends,
                                                              std::chrono::milliseconds timeout);

}  // namespace pagoda::parallel
